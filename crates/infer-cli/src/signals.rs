//! Ctrl-C / SIGTERM / SIGHUP handling that knows which signal came, so an interrupted command
//! exits with the shell convention `128 + signal` (130 after Ctrl-C, 143 after SIGTERM, 129
//! after SIGHUP) instead of 130 for all of them.
//!
//! [`set_handler`] installs the handler through `ctrlc` (which runs it on its own thread, where
//! any code may run), then puts a small signal handler in front of `ctrlc`'s that records the
//! signal number (an atomic store, async-signal-safe) and passes the signal on.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// The signal that arrived last (0: none yet).
static LAST: AtomicI32 = AtomicI32::new(0);

/// The signals `ctrlc` handles, and the handler each had before ours was put in front.
const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];
static PREVIOUS: [AtomicUsize; 3] = [
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
];

extern "C" fn record(sig: libc::c_int) {
    LAST.store(sig, Ordering::SeqCst);
    let Some(i) = SIGNALS.iter().position(|&s| s == sig) else {
        return;
    };
    let prev = PREVIOUS[i].load(Ordering::SeqCst);
    if prev != 0 && prev != libc::SIG_DFL && prev != libc::SIG_IGN {
        // SAFETY: `prev` is the plain (non-SA_SIGINFO) handler `ctrlc` installed, an
        // `extern "C" fn(c_int)`, read back from sigaction.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(prev) };
        f(sig);
    }
}

/// Run `f` (on `ctrlc`'s thread) when SIGINT, SIGTERM or SIGHUP arrives; [`exit_code`] then
/// says which one. Like `ctrlc::set_handler`, only the first call in a process installs
/// anything.
pub(crate) fn set_handler(f: impl FnMut() + Send + 'static) {
    if ctrlc::set_handler(f).is_err() {
        return;
    }
    for (i, &sig) in SIGNALS.iter().enumerate() {
        // SAFETY: plain sigaction calls with zero-initialised structs; the new handler only
        // does an atomic store and calls the previous handler.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = record as extern "C" fn(libc::c_int) as usize;
            new.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut new.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, &new, &mut old) == 0 {
                PREVIOUS[i].store(old.sa_sigaction, Ordering::SeqCst);
            }
        }
    }
}

/// True when the signal that arrived is Ctrl-C (SIGINT), not a request to terminate.
pub(crate) fn is_ctrl_c() -> bool {
    matches!(LAST.load(Ordering::SeqCst), 0 | libc::SIGINT)
}

/// The exit status for the signal that arrived: `128 + signal` (130 when none was recorded).
pub(crate) fn exit_code() -> i32 {
    match LAST.load(Ordering::SeqCst) {
        0 => 130,
        s => 128 + s,
    }
}
