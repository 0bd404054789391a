//! Integration tests of awaken-otel: scripted runs exported to an OTLP/HTTP receiver on
//! 127.0.0.1 written here (protobuf bodies decoded with `opentelemetry-proto`; the JSON
//! protocol read with `serde_json`), and the configuration errors.

mod config;
mod export;
mod llm;
mod receiver;
