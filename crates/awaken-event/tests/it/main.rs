//! Integration tests of awaken-event.
