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
//! - **A crowded active list** takes room below half, down to the floor
//!   (`PagerConfig::pool_floor_pct`): with active protection on, reclaim's hand looks at
//!   the active share of the present pages every 4,096 pages; when at least half of the
//!   last [`MIN_WINDOWS`] or more looks found it over its share, the pages proved hot do
//!   not fit beside the pool, and the limit drops a step. A server's hot objects (redis's
//!   dict entries and keys, ~100 MiB at 1M keys) refaulted from the pool ~1 time a request
//!   while the pool held values that uniform requests hit at random; short refaults could
//!   not see it (values outnumber them), and a floor for short refaults alone cost a
//!   single random pass over well-compressing data 30 % (it then reads from the disk what
//!   the pool held).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};

use crate::page::PAGE_SIZE;

/// Near misses in one tick (≥ 10 ms) that grow the limit.
const GROW_NEAR_MISSES: u64 = 8;
/// Refaults (faults, each maybe a 64 KiB swap-in) weighed at once: fewer say nothing yet,
/// and are kept for the next tick.
const MIN_REFAULTS: u64 = 16;
/// Ticks without growth after a shrink.
const HOLD_TICKS: u32 = 100;
/// Looks of reclaim's hand at the active share weighed at once (4,096 pages each).
const MIN_WINDOWS: u64 = 4;
/// What a file fault costs in pool faults, less the pool fault itself: ~100 µs against
/// ~25 µs as a program sees them (docs/design.md, "Real programs").
const FILE_OVER_POOL: u64 = 3;

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
/// paths note evidence, the writeback thread ticks. Refaults themselves are not counted
/// here: [`PoolShare::tick`] takes the pager's `workingset_refault` count.
#[derive(Debug)]
pub struct PoolShare {
    /// Whether the limit moves at all (else it stays at `base`).
    adaptive: bool,
    /// Short refaults bring the limit down to here, and are weighed against it.
    base: u64,
    /// A crowded active list brings the limit down to here (at most `base`).
    floor: u64,
    max: u64,
    step: u64,
    limit: AtomicU64,
    near_misses: AtomicU64,
    short_refaults: AtomicU64,
    /// The refault count up to which the refaults have been weighed (tick only).
    weighed: AtomicU64,
    /// Ticks left without growth (tick only).
    hold: AtomicU32,
    /// Looks at the active share since they were last weighed, and those over the share.
    active_looks: AtomicU64,
    crowded_looks: AtomicU64,
    /// Whether the looks weighed last found the active list over its share (tick only):
    /// growth waits until a weighing finds none.
    crowded: AtomicBool,
    /// The pool weighed by its refaults instead (`PagerConfig::pool_weigh`).
    weigh: bool,
    /// Refaults served from the pool since they were last weighed: of the working set
    /// (within the budget's worth of evictions) and the others.
    hot_pool: AtomicU64,
    cold_pool: AtomicU64,
}

impl PoolShare {
    /// A share of `budget` that starts at `max` bytes and moves between that and `floor`
    /// (`PagerConfig::pool_limit_top`, `PagerConfig::pool_limit_floor`), short refaults
    /// bringing it down to `base` at most; fixed at `base` when `max` is no more.
    /// `weigh`: the pool's refaults move it instead ([`PoolShare::tick`]).
    pub fn new(base: u64, floor: u64, max: u64, budget: u64, weigh: bool) -> PoolShare {
        let max = max.max(base);
        PoolShare {
            adaptive: max > base,
            base,
            floor: floor.min(base),
            max,
            step: (budget / 32).max(PAGE_SIZE as u64),
            limit: AtomicU64::new(max),
            near_misses: AtomicU64::new(0),
            short_refaults: AtomicU64::new(0),
            weighed: AtomicU64::new(0),
            hold: AtomicU32::new(0),
            active_looks: AtomicU64::new(0),
            crowded_looks: AtomicU64::new(0),
            crowded: AtomicBool::new(false),
            weigh,
            hot_pool: AtomicU64::new(0),
            cold_pool: AtomicU64::new(0),
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

    /// A page refaulted `distance` evictions after its own (counted in `workingset_refault`
    /// too): only a short one is noted.
    pub fn note_refault(&self, distance: u64) {
        if !self.adaptive {
            return;
        }
        let taken_pages = self.limit().saturating_sub(self.base) / PAGE_SIZE as u64;
        if distance < taken_pages {
            self.short_refaults.fetch_add(1, Relaxed);
        }
    }

    /// A refault served from the pool: one it costs (`hot`: back within the budget's pages
    /// of its eviction, or with `PagerConfig::pool_weigh_room` within the pool's room's),
    /// or a file read it saved.
    pub fn note_pool_refault(&self, hot: bool) {
        if self.adaptive && self.weigh {
            let c = if hot { &self.hot_pool } else { &self.cold_pool };
            c.fetch_add(1, Relaxed);
        }
    }

    /// Reclaim's hand looked at the active share of the present pages: over the share
    /// (`crowded`) or within it.
    pub fn note_active_look(&self, crowded: bool) {
        if self.adaptive {
            self.active_looks.fetch_add(1, Relaxed);
            self.crowded_looks.fetch_add(crowded as u64, Relaxed);
        }
    }

    /// Weighs the evidence since the last tick and moves the limit by a step or two at most;
    /// `refaults` is the pager's refault count so far (`workingset_refault`).
    pub fn tick(&self, refaults: u64) -> Change {
        if !self.adaptive {
            return Change::Kept;
        }
        let hold = self.hold.load(Relaxed).saturating_sub(1);
        self.hold.store(hold, Relaxed);
        let near = self.near_misses.swap(0, Relaxed);
        let limit = self.limit();
        if self.weigh {
            return self.tick_weighed(near, limit, hold);
        }
        let looks = self.active_looks.load(Relaxed);
        if looks >= MIN_WINDOWS {
            let crowded = self.crowded_looks.swap(0, Relaxed);
            self.active_looks.fetch_sub(looks, Relaxed);
            self.crowded.store(crowded > 0, Relaxed);
            if crowded * 2 >= looks && limit > self.floor {
                self.limit.store(limit.saturating_sub(self.step).max(self.floor), Relaxed);
                self.hold.store(HOLD_TICKS, Relaxed);
                return Change::Shrank;
            }
        }
        let mut quiet = !self.crowded.load(Relaxed);
        let new = refaults.saturating_sub(self.weighed.load(Relaxed));
        if new >= MIN_REFAULTS {
            self.weighed.store(refaults, Relaxed);
            let short = self.short_refaults.swap(0, Relaxed);
            if limit > self.base && short * 2 >= new {
                // Nearly all short: the working set is well past what is left, so two steps.
                let by = if short * 4 >= new * 3 { 2 * self.step } else { self.step };
                self.limit.store(limit.saturating_sub(by).max(self.base), Relaxed);
                self.hold.store(HOLD_TICKS, Relaxed);
                return Change::Shrank;
            }
            quiet &= short * 4 < new;
        }
        if near >= GROW_NEAR_MISSES && quiet && hold == 0 && limit < self.max {
            self.limit.store((limit + self.step).min(self.max), Relaxed);
            return Change::Grew;
        }
        Change::Kept
    }

    /// The weighed share: the pool is worth its room while the file faults it saves outweigh
    /// the pool faults it causes. Each refault of the working set served from the pool is
    /// a page the pool's room would have kept resident: one pool fault the pool costs. Each
    /// other refault it serves is a file fault it saved: [`FILE_OVER_POOL`] pool faults'
    /// worth. Once [`MIN_REFAULTS`] pool refaults are in, costs above what it saves take a
    /// step down toward the floor (two when twice above) and hold growth; near misses, file
    /// reads a bigger pool would have saved, take a step up while they are worth more than
    /// the hot refaults.
    fn tick_weighed(&self, near: u64, limit: u64, hold: u32) -> Change {
        let (hot, cold) = (self.hot_pool.load(Relaxed), self.cold_pool.load(Relaxed));
        let weighed = hot + cold >= MIN_REFAULTS;
        if weighed {
            self.hot_pool.fetch_sub(hot, Relaxed);
            self.cold_pool.fetch_sub(cold, Relaxed);
            let saved = cold * FILE_OVER_POOL;
            if hot > saved && limit > self.floor {
                let by = if hot > 2 * saved { 2 * self.step } else { self.step };
                self.limit.store(limit.saturating_sub(by).max(self.floor), Relaxed);
                self.hold.store(HOLD_TICKS, Relaxed);
                return Change::Shrank;
            }
        }
        if near >= GROW_NEAR_MISSES && near * FILE_OVER_POOL > hot && hold == 0 && limit < self.max {
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

    /// A share and the pager's refault count feeding it.
    struct Sim {
        p: PoolShare,
        refaults: u64,
    }

    impl Sim {
        fn new(max: u64) -> Sim {
            Sim { p: PoolShare::new(128 * MIB, 32 * MIB, max, 256 * MIB, false), refaults: 0 }
        }

        /// `n` refaults, `short` of them within the pages the pool took.
        fn refaults(&mut self, n: u64, short: u64) {
            let taken = self.p.limit().saturating_sub(self.p.base) / PAGE_SIZE as u64;
            for k in 0..n {
                self.p.note_refault(if k < short { taken - 1 } else { taken + 1_000_000 });
            }
            self.refaults += n;
        }

        fn near(&self, n: u64) {
            (0..n).for_each(|_| self.p.note_file_read(MIB));
        }

        fn tick(&self) -> Change {
            self.p.tick(self.refaults)
        }
    }

    fn share() -> Sim {
        Sim::new(160 * MIB)
    }

    #[test]
    fn starts_at_five_eighths_and_short_refaults_bring_it_down_to_half() {
        let mut s = share();
        assert_eq!(s.p.limit(), 160 * MIB);
        s.refaults(MIN_REFAULTS, MIN_REFAULTS / 2);
        assert_eq!(s.tick(), Change::Shrank);
        assert_eq!((s.p.limit(), s.p.hold.load(Relaxed)), (152 * MIB, HOLD_TICKS), "half short: one step");
        s.refaults(MIN_REFAULTS, MIN_REFAULTS / 4 * 3);
        assert_eq!(s.tick(), Change::Shrank);
        assert_eq!(s.p.limit(), 136 * MIB, "three quarters short: two steps");
        for _ in 0..20 {
            s.refaults(MIN_REFAULTS, MIN_REFAULTS);
            s.tick();
        }
        assert_eq!(s.p.limit(), 128 * MIB, "never under half");
        // At half, no refault is short: nothing more to weigh.
        s.refaults(MIN_REFAULTS, 0);
        assert_eq!(s.p.short_refaults.load(Relaxed), 0);
        assert_eq!(s.tick(), Change::Kept);
    }

    #[test]
    fn too_few_refaults_wait_for_more_and_a_minority_of_short_ones_keeps_the_limit() {
        let mut s = share();
        s.refaults(MIN_REFAULTS - 1, MIN_REFAULTS - 1);
        assert_eq!(s.tick(), Change::Kept, "not enough to weigh yet");
        s.refaults(1, 1);
        assert_eq!(s.tick(), Change::Shrank, "the evidence was kept");
        let limit = s.p.limit();
        // A single-pass random read: some refaults are recent by chance.
        s.refaults(4 * MIN_REFAULTS, MIN_REFAULTS);
        assert_eq!(s.tick(), Change::Kept);
        assert_eq!(s.p.limit(), limit);
    }

    #[test]
    fn near_misses_grow_it_back_after_the_hold_but_not_past_five_eighths() {
        let mut s = share();
        s.refaults(MIN_REFAULTS, MIN_REFAULTS / 2);
        s.tick();
        s.refaults(MIN_REFAULTS, MIN_REFAULTS);
        s.tick();
        assert_eq!(s.p.limit(), 136 * MIB);
        s.near(GROW_NEAR_MISSES);
        assert_eq!(s.tick(), Change::Kept, "held after a shrink");
        while s.p.hold.load(Relaxed) > 0 {
            s.tick();
        }
        s.near(GROW_NEAR_MISSES - 1);
        assert_eq!(s.tick(), Change::Kept, "too few near misses");
        // Records written more bytes ago than the limit can still grow by are no near miss.
        (0..GROW_NEAR_MISSES).for_each(|_| s.p.note_file_read(25 * MIB));
        assert_eq!(s.tick(), Change::Kept);
        s.near(GROW_NEAR_MISSES);
        assert_eq!(s.tick(), Change::Grew);
        assert_eq!(s.p.limit(), 144 * MIB, "one step");
        for _ in 0..10 {
            s.near(GROW_NEAR_MISSES);
            s.tick();
        }
        assert_eq!(s.p.limit(), 160 * MIB);
        s.near(1);
        assert_eq!(s.p.near_misses.load(Relaxed), 0, "at the top nothing is a near miss");
    }

    #[test]
    fn near_misses_among_many_short_refaults_do_not_grow() {
        let mut s = share();
        s.refaults(MIN_REFAULTS, MIN_REFAULTS);
        s.tick();
        while s.p.hold.load(Relaxed) > 0 {
            s.tick();
        }
        s.near(GROW_NEAR_MISSES);
        s.refaults(4 * MIN_REFAULTS, MIN_REFAULTS + 1);
        assert_eq!(s.tick(), Change::Kept);
    }

    #[test]
    fn a_fixed_share_never_moves() {
        let mut s = Sim::new(128 * MIB);
        s.refaults(MIN_REFAULTS, MIN_REFAULTS);
        s.near(GROW_NEAR_MISSES * 2);
        assert_eq!(s.tick(), Change::Kept);
        assert_eq!(s.p.limit(), 128 * MIB);
        assert!(!s.p.is_adaptive());
        s.p.note_active_look(true);
        assert_eq!(s.p.active_looks.load(Relaxed), 0, "a fixed share weighs nothing");
    }

    #[test]
    fn a_crowded_active_list_brings_it_down_to_the_floor_and_holds_growth() {
        let mut s = share();
        fn look(p: &PoolShare, crowded: u64, within: u64) {
            (0..crowded).for_each(|_| p.note_active_look(true));
            (0..within).for_each(|_| p.note_active_look(false));
        }
        look(&s.p, MIN_WINDOWS - 1, 0);
        assert_eq!(s.tick(), Change::Kept, "too few looks yet");
        look(&s.p, 1, 0);
        assert_eq!(s.tick(), Change::Shrank, "the looks were kept");
        assert_eq!(s.p.limit(), 152 * MIB, "one step");
        look(&s.p, MIN_WINDOWS / 2, MIN_WINDOWS / 2 + 1);
        assert_eq!(s.tick(), Change::Kept, "a minority of crowded looks");
        for _ in 0..40 {
            look(&s.p, MIN_WINDOWS, 0);
            s.tick();
        }
        assert_eq!(s.p.limit(), 32 * MIB, "below half, down to the floor and no further");
        // Below half no refault is short.
        s.refaults(MIN_REFAULTS, 0);
        s.p.note_refault(0);
        assert_eq!(s.p.short_refaults.load(Relaxed), 0);
        while s.p.hold.load(Relaxed) > 0 {
            s.tick();
        }
        // Near misses while the active list is still crowded now and then do not grow it.
        s.near(GROW_NEAR_MISSES);
        look(&s.p, 1, MIN_WINDOWS);
        assert_eq!(s.tick(), Change::Kept);
        s.near(GROW_NEAR_MISSES);
        look(&s.p, 0, MIN_WINDOWS);
        assert_eq!(s.tick(), Change::Grew, "room to spare: near misses grow it");
        assert_eq!(s.p.limit(), 40 * MIB);
    }

    #[test]
    fn weighed_the_pool_shrinks_while_its_hot_refaults_outweigh_the_file_faults_it_saves() {
        let p = PoolShare::new(128 * MIB, 32 * MIB, 160 * MIB, 256 * MIB, true);
        let refaults = |hot: u64, cold: u64| {
            (0..hot).for_each(|_| p.note_pool_refault(true));
            (0..cold).for_each(|_| p.note_pool_refault(false));
        };
        // Too few pool refaults yet: they wait for more.
        refaults(MIN_REFAULTS - 1, 0);
        assert_eq!(p.tick(0), Change::Kept);
        refaults(1, 0);
        assert_eq!(p.tick(0), Change::Shrank, "the waiting ones were kept");
        assert_eq!(p.limit(), 144 * MIB, "two steps: nothing saved at all");
        // Hot refaults up to what the cold ones saved: kept.
        refaults(3 * 4, 4);
        assert_eq!(p.tick(0), Change::Kept);
        // Above it, not twice: one step; and the short-refault and crowding signals are not
        // the weighed share's.
        refaults(3 * 4 + 1, 4);
        (0..MIN_WINDOWS).for_each(|_| p.note_active_look(true));
        assert_eq!(p.tick(0), Change::Shrank);
        assert_eq!(p.limit(), 136 * MIB);
        for _ in 0..40 {
            refaults(MIN_REFAULTS, 0);
            p.tick(0);
        }
        assert_eq!(p.limit(), 32 * MIB, "below half, down to the floor and no further");
        // Near misses grow it after the hold, while worth more than the hot refaults.
        while p.hold.load(Relaxed) > 0 {
            p.tick(0);
        }
        (0..GROW_NEAR_MISSES).for_each(|_| p.note_file_read(MIB));
        refaults(GROW_NEAR_MISSES * 3, GROW_NEAR_MISSES * 3);
        assert_eq!(p.tick(0), Change::Kept, "near misses worth no more than the hot refaults");
        (0..GROW_NEAR_MISSES).for_each(|_| p.note_file_read(MIB));
        refaults(GROW_NEAR_MISSES * 3 - 1, GROW_NEAR_MISSES * 3);
        assert_eq!(p.tick(0), Change::Grew);
        assert_eq!(p.limit(), 40 * MIB);
        // Not weighed, the pool's refaults are not even counted.
        let q = PoolShare::new(128 * MIB, 32 * MIB, 160 * MIB, 256 * MIB, false);
        q.note_pool_refault(true);
        assert_eq!(q.hot_pool.load(Relaxed), 0);
    }
}
