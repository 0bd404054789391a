//! Integration tests of awaken-llm.
