//! Small waiting helpers the engine's threads share: a wake-up flag for a background
//! thread, and a backoff for bits held briefly by another thread.
//!
//! Owns: nothing of the engine's state. Calls: std only.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// A background thread's wake-up: a flag set by whoever wants it to look now.
#[derive(Default)]
pub(crate) struct Kick {
    flag: Mutex<bool>,
    cv: Condvar,
}

impl Kick {
    pub(crate) fn kick(&self) {
        let mut k = self.flag.lock().unwrap_or_else(|e| e.into_inner());
        if !*k {
            *k = true;
            self.cv.notify_one();
        }
    }

    /// Kicks every thread waiting on this (the reclaim helpers, one per CPU: the one on the
    /// CPU a fault waits on should run).
    pub(crate) fn kick_all(&self) {
        let mut k = self.flag.lock().unwrap_or_else(|e| e.into_inner());
        *k = true;
        self.cv.notify_all();
    }

    /// Waits for a kick or `timeout`, whichever comes first, and clears the flag.
    pub(crate) fn wait(&self, timeout: Duration) {
        let mut k = self.flag.lock().unwrap_or_else(|e| e.into_inner());
        if !*k {
            k = self.cv.wait_timeout(k, timeout).unwrap_or_else(|e| e.into_inner()).0;
        }
        *k = false;
    }
}

/// Waits for a bit that another thread holds briefly: spin, then yield, then sleep.
/// The holder may be doing a file read, so the wait must not burn a CPU for long.
pub(crate) struct Backoff {
    step: u32,
}

impl Backoff {
    pub(crate) fn new() -> Backoff {
        Backoff { step: 0 }
    }

    pub(crate) fn snooze(&mut self) {
        if self.step < 64 {
            std::hint::spin_loop();
        } else if self.step < 128 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        self.step = self.step.saturating_add(1);
    }
}
