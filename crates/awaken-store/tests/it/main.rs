//! Integration tests of `awaken-store`: one conformance suite (`conformance.rs`) run against the
//! memory, SQLite and PostgreSQL stores (`backends.rs`), plus backend-specific checks.

mod backends;
mod conformance;
mod postgres_only;
mod sqlite_only;
