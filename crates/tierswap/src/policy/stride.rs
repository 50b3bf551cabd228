//! Stride prefetch: a program that faults on every s-th page (a column of a matrix, one
//! field of an array of large records, the seed suite's stride64_sparse) takes one fault a
//! page however its pages are stored, and each fault is a hand-off to a fault thread (~20 µs
//! here, docs/design.md, Fault hand-off and wake-ups). Once its lone faults have kept one stride, the pages further along it
//! are brought into place before they are touched (prefetch into place): the program then
//! passes them without a fault.
//!
//! The window starts at two pages and doubles each time the program's next fault lands on
//! the stride just past what was prefetched (it went through the whole window), up to a cap;
//! any other fault ends the run. So a program that leaves its stride costs at most one
//! window of pages it did not want, and those came in clean (their slots kept), so evicting
//! them again costs no compression.

/// Largest stride followed, in pages (2 MiB): strides further apart look like unrelated
/// faults.
pub const MAX_STRIDE_PAGES: usize = 512;

/// Default cap of the window, in pages.
pub use crate::config::DEFAULT_STRIDE_PREFETCH_MAX_PAGES as DEFAULT_MAX_PAGES;

/// The first window, in pages.
const FIRST_WINDOW: u32 = 2;

/// One region's stride state, updated by the fault that holds it (a fault that finds it
/// busy skips prediction: it only loses one window).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stride {
    /// Page index of the last lone fault plus one (0: none yet).
    last: usize,
    /// The stride of the last two lone faults, in pages (0: none).
    step: usize,
    /// Pages prefetched along the stride after the last fault (0: no run yet).
    window: u32,
}

/// What to prefetch: pages `first`, `first + step`, … (`count` of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefetch {
    /// The first page to bring in.
    pub first: usize,
    /// Pages between two prefetched pages.
    pub step: usize,
    /// How many pages.
    pub count: u32,
    /// Pages of the last window the program went through without a fault (its hits).
    pub passed: u32,
}

impl Stride {
    /// A lone swapped-in fault at page `idx` of a region of `n_pages` pages. Returns what to
    /// prefetch now, if the faults keep a stride; `max_pages` 0 turns prefetch off.
    pub fn fault(&mut self, idx: usize, n_pages: usize, max_pages: u32) -> Option<Prefetch> {
        let prev = self.last.checked_sub(1);
        self.last = idx + 1;
        let Some(prev) = prev.filter(|&p| p < idx && max_pages > 0) else {
            *self = Stride { last: idx + 1, ..Stride::default() };
            return None;
        };
        let gap = idx - prev;
        // On the stride: at most one step past the pages prefetched after `prev` (the program
        // went through them, or faulted on one before its prefetch got there).
        let on_stride = self.step >= 2 && gap.is_multiple_of(self.step) && gap / self.step <= self.window as usize + 1;
        if !on_stride {
            self.step = if (2..=MAX_STRIDE_PAGES).contains(&gap) { gap } else { 0 };
            self.window = 0;
            return None;
        }
        let passed = (gap / self.step - 1) as u32;
        self.window = if self.window == 0 { FIRST_WINDOW } else { self.window.saturating_mul(2) }.min(max_pages);
        let room = (n_pages - 1 - idx) / self.step;
        let count = (self.window as usize).min(room) as u32;
        (count > 0).then_some(Prefetch { first: idx + self.step, step: self.step, count, passed })
    }

    /// The window of the run in progress, in pages (0: none).
    pub fn window(&self) -> u32 {
        self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds faults at `idx`s and returns each answer.
    fn run(faults: &[usize], n_pages: usize, max: u32) -> Vec<Option<Prefetch>> {
        let mut s = Stride::default();
        faults.iter().map(|&i| s.fault(i, n_pages, max)).collect()
    }

    #[test]
    fn a_kept_stride_prefetches_a_window_that_doubles_to_the_cap() {
        let mut s = Stride::default();
        assert_eq!(s.fault(0, 1 << 20, 8), None, "one fault is no stride");
        assert_eq!(s.fault(16, 1 << 20, 8), None, "two faults name a stride, not a run");
        assert_eq!(s.fault(32, 1 << 20, 8), Some(Prefetch { first: 48, step: 16, count: 2, passed: 0 }));
        // The program went through 48 and 64 without a fault: its next fault is at 80.
        assert_eq!(s.fault(80, 1 << 20, 8), Some(Prefetch { first: 96, step: 16, count: 4, passed: 2 }));
        assert_eq!(s.fault(160, 1 << 20, 8), Some(Prefetch { first: 176, step: 16, count: 8, passed: 4 }));
        let capped = s.fault(304, 1 << 20, 8);
        assert_eq!(capped, Some(Prefetch { first: 320, step: 16, count: 8, passed: 8 }));
        assert_eq!(s.window(), 8);
    }

    #[test]
    fn a_fault_inside_the_window_keeps_the_run() {
        // The program caught up with the prefetch: its fault on 64 (prefetched window 48, 64)
        // is on the stride, not a break.
        let got = run(&[0, 16, 32, 64], 1 << 20, 32);
        assert_eq!(got[3], Some(Prefetch { first: 80, step: 16, count: 4, passed: 1 }));
    }

    #[test]
    fn leaving_the_stride_ends_the_run_and_costs_one_window_at_most() {
        let mut s = Stride::default();
        for i in [0, 16, 32] {
            s.fault(i, 1 << 20, 32);
        }
        assert_eq!(s.window(), 2);
        // Off the stride: no prefetch, and the new gap must repeat before the next one.
        assert_eq!(s.fault(33, 1 << 20, 32), None);
        assert_eq!(s.window(), 0);
        // Gaps beyond MAX_STRIDE_PAGES are never a stride, however often they repeat.
        assert_eq!(s.fault(1000, 1 << 20, 32), None);
        assert_eq!(s.fault(1967, 1 << 20, 32), None);
        assert_eq!(s.fault(2934, 1 << 20, 32), None);
        // Backwards: a new start.
        assert_eq!(s.fault(10, 1 << 20, 32), None);
        assert_eq!(s.fault(20, 1 << 20, 32), None);
        assert_eq!(s.fault(30, 1 << 20, 32), Some(Prefetch { first: 40, step: 10, count: 2, passed: 0 }));
    }

    #[test]
    fn neighbours_and_random_faults_never_prefetch() {
        // Consecutive pages are large swap-in's business, not a stride.
        assert!(run(&(0..64).collect::<Vec<_>>(), 1 << 20, 32).iter().all(Option::is_none));
        // A shuffled walk: gaps never repeat twice in a row here.
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let faults: Vec<usize> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % (1 << 18)) as usize
            })
            .collect();
        let fetched = run(&faults, 1 << 18, 32).iter().flatten().count();
        assert!(fetched < 8, "{fetched} prefetches on random faults");
    }

    #[test]
    fn the_window_stops_at_the_region_end_and_off_means_off() {
        let got = run(&[100, 110, 120], 135, 32);
        assert_eq!(got[2], Some(Prefetch { first: 130, step: 10, count: 1, passed: 0 }));
        let got = run(&[100, 110, 120], 130, 32);
        assert_eq!(got[2], None, "no page past the end");
        assert!(run(&[0, 16, 32, 48, 64], 1 << 20, 0).iter().all(Option::is_none));
    }
}
