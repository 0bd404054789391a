//! Typed state (work in progress).
