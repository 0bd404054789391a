//! Integration tests of awaken-spec.
