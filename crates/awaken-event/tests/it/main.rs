//! Integration tests of awaken-event.

mod grammar;
