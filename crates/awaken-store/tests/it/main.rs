//! Integration tests of `awaken-store`: one conformance suite (`conformance.rs`) run against the
//! memory, SQLite and PostgreSQL stores (`backends.rs`), plus backend-specific checks.

mod backends;
mod conformance;
#[cfg(feature = "postgres")]
mod postgres_only;
#[cfg(feature = "postgres")]
mod queue;
#[cfg(feature = "sqlite")]
mod sqlite_only;
