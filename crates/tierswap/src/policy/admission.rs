//! Admission for large swap-in: how many pages a fault in swapped memory brings in.
//!
//! The reference RFC (000) swaps in 64 KiB at once from the compressed pool when access
//! is local, and the maintainer's condition is "if there is no spatial locality, don't do
//! it": a large swap-in of pages nobody touches costs decompression and footprint for
//! nothing. The evidence here is the region's recent swap-in streams: a fault exactly at
//! the end of a recent swap-in (the program walked through it and on) continues that
//! stream, and each stream's own window starts small (`start`, 2 pages by default) and
//! doubles up to the cap while the stream goes on, like the kernel's readahead window;
//! any other fault goes back to one page. A small start matters for programs whose objects
//! straddle page boundaries at random (a server's 1 KiB values): the second page of such an
//! object continues a stream of one page, and a window that started at 64 KiB brought 15
//! pages nobody read (redis under random GETs: 3.4 pages a GET). The hint decides without
//! evidence: Sequential always admits, Random never does.
//!
//! Whole blocks (`learn`): a program that reads whole 64 KiB blocks in random order starts
//! a stream in every block, and paid two faults a block (one page, then the other 15).
//! Each lone fault (no stream) is counted, and so is the next fault when it lands on the
//! page right after (the program read on into the block). When three lone faults in four
//! were followed, a lone fault brings its whole block in at once, except every
//! [`PROBE_EVERY`]th, which stays one page to keep measuring: if the program turns sparse,
//! the probes stop being followed and admission goes back to one page.
//!
//! Pure decisions: no syscalls, no pte or slot access (the fault path probes the range).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use crate::config::{Hint, SwapinPolicy};

/// Streams remembered per region: a few threads each walking their own range.
pub const STREAMS: usize = 4;
/// Whole-block learning: one lone fault in this many stays one page while blocks come in
/// whole, to keep measuring.
pub const PROBE_EVERY: u32 = 8;
/// Whole-block learning: lone faults counted before deciding; both counts halve at 4×.
const LEARN_MIN: u32 = 16;

/// What admission works with, from the pager's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// How faults pick a size.
    pub policy: SwapinPolicy,
    /// Largest swap-in, in pages (a power of two).
    pub max_pages: u32,
    /// A stream's first large swap-in, in pages (a power of two).
    pub start_pages: u32,
    /// Whole-block learning.
    pub learn: bool,
}

/// What admission decided for one fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Pages to bring in, a power of two; 1 means order-0.
    pub pages: u32,
    /// A large swap-in would have been possible but locality evidence was missing.
    pub vetoed: bool,
}

/// One region's locality history: the ends of its last [`STREAMS`] swap-ins and each
/// stream's window. A few words, updated with relaxed atomics: a lost update costs one
/// wrong guess, never correctness (the fault path checks every page it installs).
#[derive(Debug, Default)]
pub struct Locality {
    /// Page index one past the last page of a recent swap-in, plus one (0: empty).
    ends: [AtomicUsize; STREAMS],
    /// The window of each stream's last swap-in, in pages.
    windows: [AtomicU32; STREAMS],
    /// Where the next end is recorded (round robin).
    cursor: AtomicUsize,
    /// The window of the last stream continuation, in pages (for reports).
    window: AtomicU32,
    /// Lone faults (no stream) counted by whole-block learning, and those of them whose
    /// next page faulted next; halved together.
    lone: AtomicU32,
    followed: AtomicU32,
    /// The page after the last lone fault, plus one (0: none).
    after_lone: AtomicUsize,
    /// Lone faults while blocks came in whole, for the probes.
    whole: AtomicU32,
}

impl Locality {
    /// Decides for a fault at page `idx` of a region with `hint`, within `limits`.
    pub fn decide(&self, idx: usize, hint: Hint, limits: Limits) -> Decision {
        let Limits { policy, max_pages, start_pages, learn } = limits;
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
        let Some(k) = self.stream_at(idx) else {
            if learn
                && self.blocks_read_whole()
                && !self.whole.fetch_add(1, Ordering::Relaxed).is_multiple_of(PROBE_EVERY)
            {
                return Decision { pages: (crate::page::BLOCK_PAGES as u32).min(max_pages), vetoed: false };
            }
            if learn {
                self.note_lone(idx);
            }
            return Decision { pages: 1, vetoed: true };
        };
        // A plain load first: a stream's every fault passes here, and only the one right
        // after a lone fault needs to write.
        if learn
            && self.after_lone.load(Ordering::Relaxed) == idx + 1
            && self.after_lone.swap(0, Ordering::Relaxed) == idx + 1
        {
            self.followed.fetch_add(1, Ordering::Relaxed);
        }
        let prev = self.windows[k].load(Ordering::Relaxed);
        let pages = grow_window(prev, max_pages, start_pages);
        self.window.store(pages, Ordering::Relaxed);
        Decision { pages, vetoed: false }
    }

    /// Records that a swap-in of window `pages` brought pages up to `end_idx` (exclusive)
    /// in: a fault at `end_idx` later continues this stream, with a window grown from
    /// `pages`.
    pub fn note_swapin(&self, end_idx: usize, pages: u32) {
        // Extend the stream this swap-in continued, if any, rather than take a new place.
        for (e, w) in self.ends.iter().zip(&self.windows) {
            let v = e.load(Ordering::Relaxed);
            if v != 0 && v - 1 <= end_idx && end_idx <= v - 1 + crate::config::MAX_SWAPIN_PAGES as usize {
                if e.compare_exchange(v, end_idx + 1, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                    w.store(pages, Ordering::Relaxed);
                }
                return;
            }
        }
        let k = self.cursor.fetch_add(1, Ordering::Relaxed) % STREAMS;
        self.windows[k].store(pages, Ordering::Relaxed);
        self.ends[k].store(end_idx + 1, Ordering::Relaxed);
    }

    /// Counts a lone fault at `idx` (one page, no stream) for whole-block learning.
    fn note_lone(&self, idx: usize) {
        if self.lone.fetch_add(1, Ordering::Relaxed) + 1 >= 4 * LEARN_MIN {
            // Halve both: the evidence of the last few dozen lone faults weighs most. A
            // racing update lost here costs one count.
            self.lone.store(2 * LEARN_MIN, Ordering::Relaxed);
            let f = self.followed.load(Ordering::Relaxed);
            self.followed.store(f / 2, Ordering::Relaxed);
        }
        self.after_lone.store(idx + 2, Ordering::Relaxed);
    }

    /// Whether lone faults have mostly been followed by a fault on the next page: three in
    /// four, over at least [`LEARN_MIN`].
    fn blocks_read_whole(&self) -> bool {
        let lone = self.lone.load(Ordering::Relaxed);
        lone >= LEARN_MIN && self.followed.load(Ordering::Relaxed) * 4 >= lone * 3
    }

    /// The stream a fault at `idx` continues: one whose last swap-in ended there.
    fn stream_at(&self, idx: usize) -> Option<usize> {
        self.ends.iter().position(|e| e.load(Ordering::Relaxed) == idx + 1)
    }

    /// The window last decided for a stream, in pages (0: no stream yet).
    pub fn window(&self) -> u32 {
        self.window.load(Ordering::Relaxed)
    }
}

/// The window after a stream continued with window `prev`: `start` to begin with (or the
/// cap, if smaller), then doubling while the stream goes on, capped at `max`.
pub fn grow_window(prev: u32, max: u32, start: u32) -> u32 {
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

    /// The limits the tests use: locality up to `max` pages, streams starting at 64 KiB
    /// (the window the older tests were written for) unless they say otherwise.
    fn lim(max: u32, learn: bool) -> Limits {
        Limits { policy: SwapinPolicy::Locality, max_pages: max, start_pages: 16, learn }
    }

    fn seq(l: &Locality, hint: Hint, n: usize, max: u32) -> (u32, u32) {
        // Simulates a program touching pages 0..n in order: each fault's swap-in covers its
        // range; returns (faults, large swap-ins).
        let (mut faults, mut large) = (0, 0);
        let mut next = 0;
        while next < n {
            let d = l.decide(next, hint, lim(max, false));
            let (_, end) = if d.pages > 1 { range_of(next, d.pages, n) } else { (next, next + 1) };
            faults += 1;
            large += (d.pages > 1) as u32;
            l.note_swapin(end, d.pages);
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
        assert_eq!(grow_window(0, 4, 16), 4);
        assert_eq!(grow_window(16, 64, 16), 32);
        assert_eq!(grow_window(1, 64, 2), 2);
        assert_eq!(grow_window(2, 64, 2), 4);
        assert_eq!(grow_window(64, 64, 16), 64);
    }

    #[test]
    fn sparse_and_random_access_never_qualify() {
        let l = Locality::default();
        // stride: the first page of every 64 KiB block, in order.
        for b in 0..256 {
            let d = l.decide(b * 16, Hint::Normal, lim(16, true));
            assert_eq!(d, Decision { pages: 1, vetoed: true }, "block {b}");
            l.note_swapin(b * 16 + 1, d.pages);
        }
        // one page per block, shuffled (a fixed permutation).
        let l = Locality::default();
        for k in 0..256usize {
            let b = (k * 97) % 256;
            let d = l.decide(b * 16 + 5, Hint::Normal, lim(16, true));
            assert_eq!(d.pages, 1);
            l.note_swapin(b * 16 + 6, d.pages);
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
                let d = l.decide(p, Hint::Normal, lim(16, false));
                let end = if d.pages > 1 { range_of(p, d.pages, 1024).1 } else { p + 1 };
                l.note_swapin(end, d.pages);
                faults += 1;
                p = end;
            }
        }
        assert_eq!(faults, 128);
    }

    /// A program reading every page of shuffled 64 KiB blocks, then (from the `sparse_from`th
    /// block on) one page per block; returns (faults, pages brought in) per phase.
    fn whole_then_sparse(l: &Locality, blocks: usize, sparse_from: usize) -> [(usize, usize); 2] {
        let mut out = [(0, 0); 2];
        for k in 0..blocks {
            let b = (k * 37) % blocks;
            let phase = (k >= sparse_from) as usize;
            let last = if phase == 0 { b * 16 + 16 } else { b * 16 + 1 };
            let mut p = b * 16;
            while p < last {
                let d = l.decide(p, Hint::Normal, lim(16, true));
                let end = if d.pages > 1 { range_of(p, d.pages, blocks * 16).1 } else { p + 1 };
                l.note_swapin(end, d.pages);
                out[phase].0 += 1;
                // The pages before `p` in its range are in already.
                out[phase].1 += end - p;
                p = end;
            }
        }
        out
    }

    #[test]
    fn shuffled_whole_blocks_learn_to_come_in_with_one_fault() {
        let l = Locality::default();
        let [(faults, pages), _] = whole_then_sparse(&l, 1024, 1024);
        assert_eq!(pages, 1024 * 16, "every page once");
        // Two faults a block while learning (16 blocks), then one, plus a probe in eight.
        let want = 1024 + 16 + (1024 - 16) / PROBE_EVERY as usize;
        assert!(faults <= want + 8, "faults {faults}, want about {want}");
        assert!(faults >= 1024 + 16, "faults {faults}");
    }

    #[test]
    fn whole_block_learning_lets_go_when_access_turns_sparse() {
        let l = Locality::default();
        let [_, (faults, pages)] = whole_then_sparse(&l, 4096, 1024);
        assert_eq!(faults, 3072, "one fault a sparse block");
        // The probes notice within a few dozen lone faults: few sparse blocks come in
        // whole (15 pages too many each), the rest one page each.
        let whole_blocks = (pages - faults) / 15;
        assert!(whole_blocks <= 128, "{whole_blocks} of 3072 sparse blocks came in whole");
    }

    #[test]
    fn objects_straddling_pages_at_random_bring_their_second_page_and_little_more() {
        // 1280-byte objects read at random places of a large heap (whole-block learning on,
        // as by default): 31 % straddle a page boundary, a lone fault on the first page and
        // then one on the next. With streams starting at 2 pages that second fault brings
        // at most one page nobody asked for; starting at 64 KiB it brought up to 15.
        let mut per_object = [0.0f64; 2];
        for (n, start) in [2u32, 16].into_iter().enumerate() {
            let l = Locality::default();
            let limits = Limits { start_pages: start, ..lim(16, true) };
            let (mut brought, mut straddles) = (0usize, 0usize);
            let objects = 4096usize;
            for k in 0..objects {
                let at = (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) % (1 << 32);
                let (first, last) = ((at / 4096) as usize, ((at + 1279) / 4096) as usize);
                straddles += (last != first) as usize;
                for q in first..=last {
                    let d = l.decide(q, Hint::Normal, limits);
                    let (lo, end) = if d.pages > 1 { range_of(q, d.pages, 1 << 24) } else { (q, q + 1) };
                    // The pages of the range from the faulting one on.
                    brought += end - lo.max(q);
                    if start == 2 {
                        assert!(end - q <= 2, "start 2: the fault at {q} brought {} pages", end - q);
                    }
                    l.note_swapin(end, d.pages);
                }
            }
            assert!((1000..1600).contains(&straddles), "{straddles} of {objects} objects straddle");
            per_object[n] = brought as f64 / objects as f64;
        }
        // 1 + 31 % × (1 or 2) with a start of 2; 1 + 31 % × (1 to 15) with 16.
        assert!(per_object[0] <= 1.55, "start 2: {} pages an object", per_object[0]);
        assert!(per_object[1] >= 3.0, "start 16: {} pages an object", per_object[1]);
    }

    #[test]
    fn a_stream_from_a_small_start_doubles_to_the_cap() {
        let l = Locality::default();
        let limits = Limits { start_pages: 2, ..lim(16, false) };
        let mut next = 0usize;
        let mut windows = Vec::new();
        while next < 4096 {
            let d = l.decide(next, Hint::Normal, limits);
            let end = if d.pages > 1 { range_of(next, d.pages, 4096).1 } else { next + 1 };
            windows.push(d.pages);
            l.note_swapin(end, d.pages);
            next = end;
        }
        assert_eq!(&windows[..5], &[1, 2, 4, 8, 16], "{windows:?}");
        assert!(windows[5..].iter().all(|&w| w == 16));
        // One page, then 1 + 2 + 4 + 8 over four faults, then a fault per 64 KiB.
        assert!(windows.len() <= 4096 / 16 + 4, "{} faults", windows.len());
    }

    #[test]
    fn hints_and_policies_decide_alone() {
        let l = Locality::default();
        assert_eq!(l.decide(7, Hint::Sequential, lim(16, false)).pages, 16);
        assert_eq!(l.decide(7, Hint::Random, lim(16, false)), Decision { pages: 1, vetoed: true });
        l.note_swapin(7, 1);
        // Random vetoes even a stream; order0 and a cap of one page never go large.
        assert_eq!(l.decide(7, Hint::Random, lim(16, false)).pages, 1);
        assert_eq!(l.decide(7, Hint::Sequential, Limits { policy: SwapinPolicy::Order0, ..lim(16, false) }).pages, 1);
        assert_eq!(l.decide(7, Hint::Sequential, lim(1, false)).pages, 1);
        assert_eq!(l.decide(9999, Hint::Normal, Limits { policy: SwapinPolicy::Always, ..lim(64, false) }).pages, 64);
    }

    #[test]
    fn streams_of_several_threads_are_told_apart() {
        let l = Locality::default();
        // Two threads walking ranges 0.. and 100_000.. interleaved.
        let (mut a, mut b) = (0usize, 100_000usize);
        let mut large = 0;
        for _ in 0..64 {
            for p in [&mut a, &mut b] {
                let d = l.decide(*p, Hint::Normal, lim(16, false));
                let end = if d.pages > 1 { range_of(*p, d.pages, 1 << 20).1 } else { *p + 1 };
                large += (d.pages > 1) as u32;
                l.note_swapin(end, d.pages);
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
