//! The pool's share of the budget, following the workload.
//!
//! The pool and the program's pages share one budget. A fixed half each loses both ways:
//! data that compresses well spills from a full pool to the disk while resident pages
//! nobody touches hold the other half (random64_sparse read 1,700 pages from the disk at
//! ~84 µs each), and a bigger fixed pool squeezes out a hot set that fits the budget (the
//! `hotset` workload at a 192 MiB pool: 5× slower). So the limit moves, like zswap's pool,
//! which takes what reclaim gives it until the working set pushes back:
//!
//! - It **starts at five eighths** of the budget: while nothing is refaulted, pages are
//!   better kept compressed than resident and untouched.
//! - **Short refaults** take room back: a page refaulted within fewer evictions than the
//!   pages the pool holds beyond half the budget would have stayed resident with the pool
//!   at half (the kernel's refault distance). When at least half of the last
//!   [`MIN_REFAULTS`] or more refaults are short, the limit drops a step, two when three
//!   quarters are (never under half); writeback brings the pool down to it, and growth
//!   waits [`HOLD_TICKS`].
//! - **Near misses** give it back: a read from the file of a record written there within
//!   the bytes the limit could still grow by (its unit's write generation) is a read a
//!   bigger pool would have saved; [`GROW_NEAR_MISSES`] of them in a tick, with refaults
//!   not short, raise the limit a step. Reads of records written long ago (a hot set
//!   swapped out before a long cold fill) are not near misses.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::page::PAGE_SIZE;

/// Near misses in one tick (≥ 10 ms) that grow the limit.
const GROW_NEAR_MISSES: u64 = 8;
/// Refaults (faults, each maybe a 64 KiB swap-in) weighed at once: fewer say nothing yet,
/// and are kept for the next tick.
const MIN_REFAULTS: u64 = 16;
/// Ticks without growth after a shrink.
const HOLD_TICKS: u32 = 100;

/// What one [`PoolShare::tick`] did to the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing.
    Kept,
    /// Raised by a step.
    Grew,
    /// Lowered by a step: writeback brings the pool down.
    Shrank,
}

/// The pool limit in force and the evidence since the last tick. Lock-free: the fault
/// paths note evidence, the writeback thread ticks.
#[derive(Debug)]
pub struct PoolShare {
    /// Whether the limit moves at all (else it stays at `base`).
    adaptive: bool,
    base: u64,
    max: u64,
    step: u64,
    limit: AtomicU64,
    near_misses: AtomicU64,
    refaults: AtomicU64,
    short_refaults: AtomicU64,
}

impl PoolShare {
    /// A share of `budget` that starts at `max` bytes and moves between that and `base`
    /// (`PagerConfig::pool_limit_top`); fixed at `base` when `max` is no more.
    pub fn new(base: u64, max: u64, budget: u64) -> PoolShare {
        let max = max.max(base);
        PoolShare {
            adaptive: max > base,
            base,
            max,
            step: (budget / 32).max(PAGE_SIZE as u64),
            limit: AtomicU64::new(max),
            near_misses: AtomicU64::new(0),
            refaults: AtomicU64::new(0),
            short_refaults: AtomicU64::new(0),
        }
    }

    /// The pool limit now.
    pub fn limit(&self) -> u64 {
        self.limit.load(Relaxed)
    }

    /// The limit it never goes under.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Whether the limit moves.
    pub fn is_adaptive(&self) -> bool {
        self.adaptive
    }

    /// A record read from the file, written `bytes_since` bytes of file writes ago.
    pub fn note_file_read(&self, bytes_since: u64) {
        if self.adaptive && bytes_since <= self.max - self.limit() {
            self.near_misses.fetch_add(1, Relaxed);
        }
    }

    /// A page refaulted `distance` evictions after its own.
    pub fn note_refault(&self, distance: u64) {
        if !self.adaptive {
            return;
        }
        self.refaults.fetch_add(1, Relaxed);
        let taken_pages = (self.limit() - self.base) / PAGE_SIZE as u64;
        if distance < taken_pages {
            self.short_refaults.fetch_add(1, Relaxed);
        }
    }

    /// Weighs the evidence since the last tick and moves the limit by a step at most.
    /// `hold` is the caller's count of ticks left without growth.
    pub fn tick(&self, hold: &mut u32) -> Change {
        if !self.adaptive {
            return Change::Kept;
        }
        *hold = hold.saturating_sub(1);
        let near = self.near_misses.swap(0, Relaxed);
        let limit = self.limit();
        let mut quiet = true;
        if self.refaults.load(Relaxed) >= MIN_REFAULTS {
            let refaults = self.refaults.swap(0, Relaxed);
            let short = self.short_refaults.swap(0, Relaxed);
            if limit > self.base && short * 2 >= refaults {
                // Nearly all short: the working set is well past what is left, so two steps.
                let by = if short * 4 >= refaults * 3 { 2 * self.step } else { self.step };
                self.limit.store(limit.saturating_sub(by).max(self.base), Relaxed);
                *hold = HOLD_TICKS;
                return Change::Shrank;
            }
            quiet = short * 4 < refaults;
        }
        if near >= GROW_NEAR_MISSES && quiet && *hold == 0 && limit < self.max {
            self.limit.store((limit + self.step).min(self.max), Relaxed);
            return Change::Grew;
        }
        Change::Kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn share() -> PoolShare {
        PoolShare::new(128 * MIB, 160 * MIB, 256 * MIB)
    }

    /// `n` refaults, `short` of them within the pages the pool took.
    fn refaults(p: &PoolShare, n: u64, short: u64) {
        let taken = (p.limit() - p.base) / PAGE_SIZE as u64;
        for k in 0..n {
            p.note_refault(if k < short { taken - 1 } else { taken + 1_000_000 });
        }
    }

    #[test]
    fn starts_at_five_eighths_and_short_refaults_bring_it_down_to_half() {
        let p = share();
        let mut hold = 0;
        assert_eq!(p.limit(), 160 * MIB);
        refaults(&p, MIN_REFAULTS, MIN_REFAULTS / 2);
        assert_eq!(p.tick(&mut hold), Change::Shrank);
        assert_eq!((p.limit(), hold), (152 * MIB, HOLD_TICKS), "half short: one step");
        refaults(&p, MIN_REFAULTS, MIN_REFAULTS / 4 * 3);
        assert_eq!(p.tick(&mut hold), Change::Shrank);
        assert_eq!(p.limit(), 136 * MIB, "three quarters short: two steps");
        for _ in 0..20 {
            refaults(&p, MIN_REFAULTS, MIN_REFAULTS);
            p.tick(&mut hold);
        }
        assert_eq!(p.limit(), 128 * MIB, "never under half");
        // At half, no refault is short: nothing more to weigh.
        refaults(&p, MIN_REFAULTS, 0);
        assert_eq!(p.short_refaults.load(Relaxed), 0);
        assert_eq!(p.tick(&mut hold), Change::Kept);
    }

    #[test]
    fn too_few_refaults_wait_for_more_and_a_minority_of_short_ones_keeps_the_limit() {
        let p = share();
        let mut hold = 0;
        refaults(&p, MIN_REFAULTS - 1, MIN_REFAULTS - 1);
        assert_eq!(p.tick(&mut hold), Change::Kept, "not enough to weigh yet");
        refaults(&p, 1, 1);
        assert_eq!(p.tick(&mut hold), Change::Shrank, "the evidence was kept");
        let limit = p.limit();
        // A single-pass random read: some refaults are recent by chance.
        refaults(&p, 4 * MIN_REFAULTS, MIN_REFAULTS);
        assert_eq!(p.tick(&mut hold), Change::Kept);
        assert_eq!(p.limit(), limit);
    }

    #[test]
    fn near_misses_grow_it_back_after_the_hold_but_not_past_five_eighths() {
        let p = share();
        let mut hold = 0;
        refaults(&p, MIN_REFAULTS, MIN_REFAULTS / 2);
        p.tick(&mut hold);
        refaults(&p, MIN_REFAULTS, MIN_REFAULTS);
        p.tick(&mut hold);
        assert_eq!(p.limit(), 136 * MIB);
        let near = |p: &PoolShare, n: u64| (0..n).for_each(|_| p.note_file_read(MIB));
        near(&p, GROW_NEAR_MISSES);
        assert_eq!(p.tick(&mut hold), Change::Kept, "held after a shrink");
        while hold > 0 {
            p.tick(&mut hold);
        }
        near(&p, GROW_NEAR_MISSES - 1);
        assert_eq!(p.tick(&mut hold), Change::Kept, "too few near misses");
        // Records written more bytes ago than the limit can still grow by are no near miss.
        (0..GROW_NEAR_MISSES).for_each(|_| p.note_file_read(25 * MIB));
        assert_eq!(p.tick(&mut hold), Change::Kept);
        near(&p, GROW_NEAR_MISSES);
        assert_eq!(p.tick(&mut hold), Change::Grew);
        assert_eq!(p.limit(), 144 * MIB, "one step");
        for _ in 0..10 {
            near(&p, GROW_NEAR_MISSES);
            p.tick(&mut hold);
        }
        assert_eq!(p.limit(), 160 * MIB);
        near(&p, 1);
        assert_eq!(p.near_misses.load(Relaxed), 0, "at the top nothing is a near miss");
    }

    #[test]
    fn near_misses_among_many_short_refaults_do_not_grow() {
        let p = share();
        let mut hold = 0;
        refaults(&p, MIN_REFAULTS, MIN_REFAULTS);
        p.tick(&mut hold);
        hold = 0;
        (0..GROW_NEAR_MISSES).for_each(|_| p.note_file_read(0));
        refaults(&p, 4 * MIN_REFAULTS, MIN_REFAULTS + 1);
        assert_eq!(p.tick(&mut hold), Change::Kept);
    }

    #[test]
    fn a_fixed_share_never_moves() {
        let p = PoolShare::new(128 * MIB, 128 * MIB, 256 * MIB);
        let mut hold = 0;
        refaults(&p, MIN_REFAULTS, MIN_REFAULTS);
        (0..GROW_NEAR_MISSES * 2).for_each(|_| p.note_file_read(0));
        assert_eq!(p.tick(&mut hold), Change::Kept);
        assert_eq!(p.limit(), 128 * MIB);
        assert!(!p.is_adaptive());
    }
}
