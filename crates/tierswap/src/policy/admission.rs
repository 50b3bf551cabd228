//! Admission for large swap-in: how many pages a fault in swapped memory brings in.
//!
//! The reference RFC (000) swaps in 64 KiB at once from the compressed pool when access
//! is local, and the maintainer's condition is "if there is no spatial locality, don't do
//! it": a large swap-in of pages nobody touches costs decompression and footprint for
//! nothing. The evidence here is the region's recent swap-in streams: a fault exactly at
//! the end of a recent swap-in (the program walked through it and on) is a stream, and the
//! window for a stream grows by doubling up to the cap while the stream continues, like
//! the kernel's readahead window; any other fault goes back to one page. The hint decides
//! without evidence: Sequential always admits, Random never does.
//!
//! Pure decisions: no syscalls, no pte or slot access (the fault path probes the range).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use crate::config::{Hint, SwapinPolicy};

/// Streams remembered per region: a few threads each walking their own range.
pub const STREAMS: usize = 4;

/// What admission decided for one fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Pages to bring in, a power of two; 1 means order-0.
    pub pages: u32,
    /// A large swap-in would have been possible but locality evidence was missing.
    pub vetoed: bool,
}

/// One region's locality history: the ends of its last [`STREAMS`] swap-ins and the window
/// of the stream last continued. A few words, updated with relaxed atomics: a lost update
/// costs one wrong guess, never correctness (the fault path checks every page it installs).
#[derive(Debug, Default)]
pub struct Locality {
    /// Page index one past the last page of a recent swap-in, plus one (0: empty).
    ends: [AtomicUsize; STREAMS],
    /// Where the next end is recorded (round robin).
    cursor: AtomicUsize,
    /// The window of the last stream continuation, in pages.
    window: AtomicU32,
}

impl Locality {
    /// Decides for a fault at page `idx` of a region with `hint`, under `policy`, with
    /// swap-ins of at most `max_pages` (a power of two).
    pub fn decide(&self, idx: usize, hint: Hint, policy: SwapinPolicy, max_pages: u32) -> Decision {
        let max_pages = max_pages.max(1);
        if max_pages == 1 || policy == SwapinPolicy::Order0 {
            return Decision { pages: 1, vetoed: false };
        }
        if policy == SwapinPolicy::Always || hint == Hint::Sequential {
            return Decision { pages: max_pages, vetoed: false };
        }
        if hint == Hint::Random {
            return Decision { pages: 1, vetoed: true };
        }
        if !self.continues_stream(idx) {
            return Decision { pages: 1, vetoed: true };
        }
        let prev = self.window.load(Ordering::Relaxed);
        let pages = grow_window(prev, max_pages);
        self.window.store(pages, Ordering::Relaxed);
        Decision { pages, vetoed: false }
    }

    /// Records that a swap-in brought pages up to `end_idx` (exclusive) in: a fault at
    /// `end_idx` later continues this stream.
    pub fn note_swapin(&self, end_idx: usize) {
        // Extend the stream this swap-in continued, if any, rather than take a new place.
        for e in &self.ends {
            let v = e.load(Ordering::Relaxed);
            if v != 0 && v - 1 <= end_idx && end_idx <= v - 1 + crate::config::MAX_SWAPIN_PAGES as usize {
                let _ = e.compare_exchange(v, end_idx + 1, Ordering::Relaxed, Ordering::Relaxed);
                return;
            }
        }
        let k = self.cursor.fetch_add(1, Ordering::Relaxed) % STREAMS;
        self.ends[k].store(end_idx + 1, Ordering::Relaxed);
    }

    /// Whether a fault at `idx` lands where a recent swap-in ended.
    fn continues_stream(&self, idx: usize) -> bool {
        self.ends.iter().any(|e| e.load(Ordering::Relaxed) == idx + 1)
    }

    /// The window last decided for a stream, in pages (0: no stream yet).
    pub fn window(&self) -> u32 {
        self.window.load(Ordering::Relaxed)
    }
}

/// The window after a stream continued with window `prev`: 64 KiB to start with (or the cap,
/// if smaller), then doubling while the stream goes on, capped at `max`.
pub fn grow_window(prev: u32, max: u32) -> u32 {
    let start = crate::page::BLOCK_PAGES as u32;
    if prev < start {
        start.min(max)
    } else {
        prev.saturating_mul(2).min(max)
    }
}

/// The pages `[first, end)` a swap-in of `pages` pages for a fault at `idx` covers, in a
/// region of `n_pages`: the `pages`-aligned range around the fault when it is at most
/// 64 KiB (the eviction block, whose slots are consecutive), else the 64 KiB-aligned start
/// of the fault's block and `pages` from there (a stream reads forward).
pub fn range_of(idx: usize, pages: u32, n_pages: usize) -> (usize, usize) {
    let pages = pages.max(1) as usize;
    let align = pages.min(crate::page::BLOCK_PAGES);
    let first = idx - idx % align;
    (first, (first + pages).min(n_pages))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(l: &Locality, hint: Hint, n: usize, max: u32) -> (u32, u32) {
        // Simulates a program touching pages 0..n in order: each fault's swap-in covers its
        // range; returns (faults, large swap-ins).
        let (mut faults, mut large) = (0, 0);
        let mut next = 0;
        while next < n {
            let d = l.decide(next, hint, SwapinPolicy::Locality, max);
            let (_, end) = if d.pages > 1 { range_of(next, d.pages, n) } else { (next, next + 1) };
            faults += 1;
            large += (d.pages > 1) as u32;
            l.note_swapin(end);
            next = end;
        }
        (faults, large)
    }

    #[test]
    fn sequential_access_earns_large_swapin_without_a_hint() {
        let l = Locality::default();
        let (faults, large) = seq(&l, Hint::Normal, 1024, 16);
        // One order-0 fault to start the stream, then one fault per 64 KiB.
        assert!(large >= 63, "large {large}");
        assert!(faults <= 66, "faults {faults}");
        assert_eq!(l.window(), 16);
    }

    #[test]
    fn window_grows_to_the_cap() {
        let l = Locality::default();
        let (faults, _) = seq(&l, Hint::Normal, 8192, 512);
        assert_eq!(l.window(), 512);
        assert!(faults < 40, "faults {faults}");
        assert_eq!(grow_window(0, 4), 4);
        assert_eq!(grow_window(16, 64), 32);
        assert_eq!(grow_window(64, 64), 64);
    }

    #[test]
    fn sparse_and_random_access_never_qualify() {
        let l = Locality::default();
        // stride: the first page of every 64 KiB block, in order.
        for b in 0..256 {
            let d = l.decide(b * 16, Hint::Normal, SwapinPolicy::Locality, 16);
            assert_eq!(d, Decision { pages: 1, vetoed: true }, "block {b}");
            l.note_swapin(b * 16 + 1);
        }
        // one page per block, shuffled (a fixed permutation).
        let l = Locality::default();
        for k in 0..256usize {
            let b = (k * 97) % 256;
            let d = l.decide(b * 16 + 5, Hint::Normal, SwapinPolicy::Locality, 16);
            assert_eq!(d.pages, 1);
            l.note_swapin(b * 16 + 6);
        }
    }

    #[test]
    fn every_page_of_shuffled_blocks_costs_two_faults_per_block() {
        let l = Locality::default();
        let mut faults = 0;
        for k in 0..64usize {
            let b = (k * 37) % 64;
            let mut p = b * 16;
            while p < b * 16 + 16 {
                let d = l.decide(p, Hint::Normal, SwapinPolicy::Locality, 16);
                let end = if d.pages > 1 { range_of(p, d.pages, 1024).1 } else { p + 1 };
                l.note_swapin(end);
                faults += 1;
                p = end;
            }
        }
        assert_eq!(faults, 128);
    }

    #[test]
    fn hints_and_policies_decide_alone() {
        let l = Locality::default();
        assert_eq!(l.decide(7, Hint::Sequential, SwapinPolicy::Locality, 16).pages, 16);
        assert_eq!(l.decide(7, Hint::Random, SwapinPolicy::Locality, 16), Decision { pages: 1, vetoed: true });
        l.note_swapin(7);
        // Random vetoes even a stream; order0 and a cap of one page never go large.
        assert_eq!(l.decide(7, Hint::Random, SwapinPolicy::Locality, 16).pages, 1);
        assert_eq!(l.decide(7, Hint::Sequential, SwapinPolicy::Order0, 16).pages, 1);
        assert_eq!(l.decide(7, Hint::Sequential, SwapinPolicy::Locality, 1).pages, 1);
        assert_eq!(l.decide(9999, Hint::Normal, SwapinPolicy::Always, 64).pages, 64);
    }

    #[test]
    fn streams_of_several_threads_are_told_apart() {
        let l = Locality::default();
        // Two threads walking ranges 0.. and 100_000.. interleaved.
        let (mut a, mut b) = (0usize, 100_000usize);
        let mut large = 0;
        for _ in 0..64 {
            for p in [&mut a, &mut b] {
                let d = l.decide(*p, Hint::Normal, SwapinPolicy::Locality, 16);
                let end = if d.pages > 1 { range_of(*p, d.pages, 1 << 20).1 } else { *p + 1 };
                large += (d.pages > 1) as u32;
                l.note_swapin(end);
                *p = end;
            }
        }
        assert!(large >= 120, "large {large}");
    }

    #[test]
    fn ranges_are_aligned_and_clipped() {
        assert_eq!(range_of(21, 16, 1000), (16, 32));
        assert_eq!(range_of(21, 4, 1000), (20, 24));
        assert_eq!(range_of(21, 64, 1000), (16, 80));
        assert_eq!(range_of(995, 16, 1000), (992, 1000));
        assert_eq!(range_of(5, 1, 10), (5, 6));
    }
}
