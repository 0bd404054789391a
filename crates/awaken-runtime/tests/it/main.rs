//! Integration tests of awaken-runtime: scenarios rendered as event logs.

mod backend;
mod build;
mod cancelled;
mod compaction_crash;
mod contention;
mod context;
mod crash;
mod cut_off;
mod delegation;
mod delegation_depth;
mod dropped;
mod durable;
mod effects;
mod event_seq;
mod hitl;
mod interrupted;
mod leases;
mod lifecycle;
mod one_run;
mod permission;
mod plugin_panics;
mod profile;
mod recovery;
mod scenarios;
mod support;
mod tools;
