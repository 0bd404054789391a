//! Calling plugin code so that a panic in it comes back as a value: every entry point of a
//! plugin the runtime calls goes through [`isolate`] or [`isolate_async`] (or, in the phase
//! engine and the tool executor, the same `catch_unwind` with `awaken_state::panic_message`).

use std::future::Future;
use std::panic::AssertUnwindSafe;

use awaken_state::panic_message;
use futures_util::FutureExt;

use crate::error::PluginError;

/// Runs `f`; a panic comes back as its message.
pub(crate) fn catch_panic<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|payload| panic_message(&*payload))
}

/// Awaits `future`; a panic in any of its polls comes back as its message. Whatever made the
/// future must run inside it (pass `async { plugin.hook().await }`, not `plugin.hook()`), so a
/// panic while making it is caught too.
pub(crate) async fn catch_panic_async<F: Future>(future: F) -> Result<F::Output, String> {
    AssertUnwindSafe(future)
        .catch_unwind()
        .await
        .map_err(|payload| panic_message(&*payload))
}

/// Runs `f`, the code of plugin `plugin_id` at `entry_point` (a method or hook name); a panic
/// comes back as [`PluginError::Panicked`] naming both, with the panic message.
///
/// # Errors
/// `PluginError::Panicked` when `f` panics.
pub fn isolate<R>(
    plugin_id: &str,
    entry_point: &str,
    f: impl FnOnce() -> R,
) -> Result<R, PluginError> {
    catch_panic(f).map_err(|message| PluginError::panicked(plugin_id, entry_point, message))
}

/// Awaits `future`, the code of plugin `plugin_id` at `entry_point`, across every poll; a panic
/// comes back as [`PluginError::Panicked`]. Make the plugin's future inside the one passed
/// (`async { plugin.on_reload(id).await }`), so a panic while making it is caught too.
///
/// # Errors
/// `PluginError::Panicked` when the future panics.
pub async fn isolate_async<F: Future>(
    plugin_id: &str,
    entry_point: &str,
    future: F,
) -> Result<F::Output, PluginError> {
    catch_panic_async(future)
        .await
        .map_err(|message| PluginError::panicked(plugin_id, entry_point, message))
}
