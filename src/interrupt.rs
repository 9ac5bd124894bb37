//! Ctrl-C and SIGTERM: finish cleanly instead of dying mid-transfer.
//!
//! Once [`install`] has run, SIGINT/SIGTERM only set a flag. Every wait in
//! the roles looks at it ([`crate::group::Member::probe`]), raises the kernels'
//! cancel flag, and unwinds: memory views are released, memory deregistered,
//! store keys deleted, and the binary exits 130 (SIGINT) or 143 (SIGTERM). A
//! second signal while that is under way exits at once with the same status.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use signal_hook::consts::{SIGINT, SIGTERM};

static RECEIVED: std::sync::OnceLock<Arc<AtomicUsize>> = std::sync::OnceLock::new();

/// The error a role returns when interrupted; binaries exit `128 + signal`.
#[derive(Debug, thiserror::Error)]
#[error("interrupted by {}", if *.0 == SIGINT { "SIGINT (Ctrl-C)" } else { "SIGTERM" })]
pub struct Interrupted(pub i32);

impl Interrupted {
    /// The conventional exit status: 130 for SIGINT, 143 for SIGTERM.
    pub fn exit_code(&self) -> i32 {
        128 + self.0
    }
}

/// Routes SIGINT and SIGTERM to the flag. Call once resources worth
/// cleaning up are about to exist (before that, the default action, an
/// immediate exit, is the right one).
pub fn install() -> std::io::Result<()> {
    let flag = RECEIVED
        .get_or_init(|| Arc::new(AtomicUsize::new(0)))
        .clone();
    for sig in [SIGINT, SIGTERM] {
        // A second signal after the first: exit now, with the usual status.
        let already = Arc::new(std::sync::atomic::AtomicBool::new(false));
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, already.clone())?;
        signal_hook::flag::register(sig, already)?;
        signal_hook::flag::register_usize(sig, flag.clone(), sig as usize)?;
    }
    Ok(())
}

/// The signal received, if any.
pub fn received() -> Option<Interrupted> {
    let v = RECEIVED.get()?.load(Ordering::Relaxed);
    (v != 0).then_some(Interrupted(v as i32))
}
