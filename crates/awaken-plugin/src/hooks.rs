//! Which observational lifecycle hooks there are, and sets of them: what a plugin declares it
//! implements, so a dispatch calls only the plugins that do.

/// The observational lifecycle hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum LifecycleHook {
    /// `on_runtime_start`.
    RuntimeStart,
    /// `on_runtime_shutdown`.
    RuntimeShutdown,
    /// `on_run_start`.
    RunStart,
    /// `on_run_complete`.
    RunComplete,
    /// `on_run_error`.
    RunError,
    /// `on_run_cancel`.
    RunCancel,
    /// `on_delegate_call_start`.
    DelegateCallStart,
    /// `on_delegate_call_complete`.
    DelegateCallComplete,
    /// `on_delegate_call_error`.
    DelegateCallError,
    /// `on_delegate_return_start`.
    DelegateReturnStart,
    /// `on_delegate_return_complete`.
    DelegateReturnComplete,
    /// `on_delegate_return_error`.
    DelegateReturnError,
}

impl LifecycleHook {
    /// Every hook, in declaration order (`ALL[h as usize] == h`).
    pub const ALL: [LifecycleHook; 12] = [
        Self::RuntimeStart,
        Self::RuntimeShutdown,
        Self::RunStart,
        Self::RunComplete,
        Self::RunError,
        Self::RunCancel,
        Self::DelegateCallStart,
        Self::DelegateCallComplete,
        Self::DelegateCallError,
        Self::DelegateReturnStart,
        Self::DelegateReturnComplete,
        Self::DelegateReturnError,
    ];

    /// The hook's method name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RuntimeStart => "on_runtime_start",
            Self::RuntimeShutdown => "on_runtime_shutdown",
            Self::RunStart => "on_run_start",
            Self::RunComplete => "on_run_complete",
            Self::RunError => "on_run_error",
            Self::RunCancel => "on_run_cancel",
            Self::DelegateCallStart => "on_delegate_call_start",
            Self::DelegateCallComplete => "on_delegate_call_complete",
            Self::DelegateCallError => "on_delegate_call_error",
            Self::DelegateReturnStart => "on_delegate_return_start",
            Self::DelegateReturnComplete => "on_delegate_return_complete",
            Self::DelegateReturnError => "on_delegate_return_error",
        }
    }
}

/// A set of [`LifecycleHook`]s: the hooks a plugin implements
/// ([`Plugin::lifecycle_hooks`](crate::Plugin::lifecycle_hooks)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LifecycleHooks(u16);

impl LifecycleHooks {
    /// Every hook (a plugin's default: it is called for each).
    pub const ALL: LifecycleHooks = LifecycleHooks((1 << LifecycleHook::ALL.len()) - 1);
    /// No hook: the plugin is never called by a lifecycle dispatch.
    pub const NONE: LifecycleHooks = LifecycleHooks(0);

    /// The set of these hooks.
    pub const fn of(hooks: &[LifecycleHook]) -> Self {
        let mut bits = 0;
        let mut i = 0;
        while i < hooks.len() {
            bits |= 1 << hooks[i] as u16;
            i += 1;
        }
        LifecycleHooks(bits)
    }

    /// Whether `hook` is in the set.
    pub const fn contains(self, hook: LifecycleHook) -> bool {
        self.0 & (1 << hook as u16) != 0
    }
}
