//! Integration tests of awaken-server: real HTTP on 127.0.0.1 with a real client, runs driven
//! by a model the tests hold and release, streams read as Server-Sent Events.

mod a2a;
mod agui;
mod ai_sdk;
mod cancel;
mod decisions;
mod fleet;
mod layers;
mod page;
mod reconnect;
mod refusals;
mod shutdown;
mod steer;
mod stream;
mod support;
