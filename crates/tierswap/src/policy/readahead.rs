//! The readahead window for disk-backed slots: grows while read-ahead pages get used,
//! shrinks (by halves, never faster) while they do not. In-memory tiers never read ahead:
//! a pool or zero page costs less to bring in on its own fault than to guess.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use crate::config::Hint;

/// Default cap of the window, in pages (128 KiB).
pub use crate::config::DEFAULT_READAHEAD_MAX_PAGES as DEFAULT_MAX_PAGES;

/// One region's readahead state: three words, updated with relaxed atomics (a lost update
/// only makes one window a little off).
#[derive(Debug, Default)]
pub struct Readahead {
    /// Read-ahead pages used since the last decision.
    hits: AtomicU32,
    /// The last window, in pages (the faulting page included).
    window: AtomicU32,
    /// Page index of the last fault served from disk, plus one (0: none yet).
    last: AtomicUsize,
}

impl Readahead {
    /// Counts `n` read-ahead pages the program used.
    pub fn hit(&self, n: u32) {
        self.hits.fetch_add(n, Ordering::Relaxed);
    }

    /// The window in force: pages to bring in for a disk fault at `idx`, itself included.
    /// 1 means no readahead.
    pub fn next(&self, idx: usize, hint: Hint, max_pages: u32) -> u32 {
        let hits = self.hits.swap(0, Ordering::Relaxed);
        let prev = self.window.load(Ordering::Relaxed);
        let last = self.last.swap(idx + 1, Ordering::Relaxed);
        let adjacent = last != 0 && (idx + 1 == last - 1 || idx == last);
        let w = match hint {
            Hint::Random => 1,
            Hint::Sequential => max_pages.max(1),
            Hint::Normal => window(hits, prev, adjacent, max_pages),
        };
        self.window.store(w, Ordering::Relaxed);
        w
    }

    /// The last window decided.
    pub fn window(&self) -> u32 {
        self.window.load(Ordering::Relaxed)
    }
}

/// The window after `hits` used read-ahead pages since the previous window `prev`.
/// Hits (plus this fault and the next) rounded up to a power of two, capped at `max`; with
/// no hits only a fault next to the previous one reads one page ahead; and the window
/// never drops below half the previous one, so one unlucky window does not undo a run.
pub fn window(hits: u32, prev: u32, adjacent: bool, max: u32) -> u32 {
    let max = max.max(1);
    let mut w = hits.saturating_add(2).next_power_of_two();
    if w == 2 && !adjacent {
        w = 1;
    }
    w.min(max).max(prev / 2).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_with_hits_to_the_cap() {
        let mut w = 1;
        let mut seen = vec![];
        for _ in 0..8 {
            // Every read-ahead page used: hits = w - 1.
            w = window(w - 1, w, true, 32);
            seen.push(w);
        }
        assert_eq!(seen, [2, 4, 8, 16, 32, 32, 32, 32]);
    }

    #[test]
    fn shrinks_by_halves_to_one_without_hits() {
        let mut w = 32;
        let mut seen = vec![];
        for _ in 0..7 {
            w = window(0, w, false, 32);
            seen.push(w);
        }
        assert_eq!(seen, [16, 8, 4, 2, 1, 1, 1]);
    }

    #[test]
    fn hints_decide_without_evidence() {
        let ra = Readahead::default();
        assert_eq!(ra.next(10, Hint::Random, 32), 1);
        assert_eq!(ra.next(500, Hint::Sequential, 32), 32);
        assert_eq!(ra.next(7, Hint::Normal, 32), 16, "no faster than halving");
        ra.hit(15);
        assert_eq!(ra.next(8, Hint::Normal, 32), 32);
        assert_eq!(ra.window(), 32);
    }

    #[test]
    fn adjacent_faults_start_a_window() {
        let ra = Readahead::default();
        assert_eq!(ra.next(100, Hint::Normal, 32), 1);
        assert_eq!(ra.next(101, Hint::Normal, 32), 2);
        assert_eq!(ra.next(5000, Hint::Normal, 32), 1);
    }
}
