//! Integration tests of awaken-state.
