//! The A2A client against loopback servers: a hand-written one that scripts each answer, and
//! one built with the protocol's own SDK; and an endpoint agent as a delegate, through the
//! runtime.

mod client;
mod python;
mod runtime;
mod server;
