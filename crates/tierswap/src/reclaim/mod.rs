//! The swap-out path: one reclaim thread keeps the footprint between the watermarks.
//!
//! 1. Deactivate: a CLOCK hand walks each region in 64 KiB blocks and moves the present
//!    pages of a block to the mirror with one UFFDIO_MOVE (the inactive list). A touch
//!    faults and moves the page back: that is the reference bit, taken by the hardware.
//! 2. Evict: the oldest staged blocks whose pages were not touched are classified (zero,
//!    same-filled, compressible, incompressible), stored in a backend behind a freshly
//!    allocated slot (consecutive slots for a block), and dropped from the mirror.
//! 3. Writeback (the writeback thread, see [`crate::writeback`]) is kicked when the pool
//!    is over its limit, or when the budget is exceeded and nothing else can be evicted.

pub(crate) mod direct;
mod evict;
mod stage;

pub(crate) use direct::{helper_thread, DirectReclaim};
use evict::Pending;
use stage::RunLog;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::compress::COMPRESS_BUF_BYTES;
use crate::backend::file::UnitWriter;
use crate::mm::mapping::{SHARED_LOOK_MS, SHARED_LOOK_PAGES};
use crate::mm::{RegionInner, Shared};
use crate::page::{BLOCK_PAGES, PAGE_SIZE};
use crate::pagetable::PTES_PER_CHUNK;
use crate::sys;
use crate::sys::fatal;

/// Blocks deactivated or evicted per step (1 MiB).
const BATCH_BLOCKS: usize = 16;
/// 64 KiB blocks per page-table chunk (2 MiB).
const CHUNK_BLOCKS: usize = PTES_PER_CHUNK / BLOCK_PAGES;
/// Reclaim's allocation lane in the swap space.
const LANE: usize = 0;
/// Staged pages the reclaim thread keeps ahead of its own eviction with `stage_ahead`, for
/// direct reclaimers: two batches (2 MiB). The list grows past it only with `stage_fill`,
/// while refaults say a longer list pays (`inactive_adapt`).
const STAGE_RESERVE_PAGES: i64 = (2 * BATCH_BLOCKS * BLOCK_PAGES) as i64;
/// The most batches one step stages while the inactive list fills (`stage_fill`).
const STAGE_FILL_MAX_BATCHES: usize = 4;
/// Present pages the hand meets between looks at the active pages' share.
const ACTIVE_WINDOW_PAGES: u64 = 4096;
/// Evictions between two weighings of the activations against them
/// (`protect_selective_pct`).
const SELECTIVE_WINDOW_EVICTIONS: u64 = 4096;
/// The weight of the newest window in the running activation rate, as 1/N: the rate
/// remembers ~8 windows (32,768 evictions), so a program's short bursts of activations (a
/// server's load, a hash table's resize) do not turn protection off.
const SELECTIVE_EWMA_DIV: u64 = 8;
/// Protection comes back once the running rate is this many points under the setting.
const SELECTIVE_HYSTERESIS_PCT: u64 = 10;
/// Blocks deactivated together, with one move per run of present pages (1 MiB).
const SPAN_BLOCKS: usize = 16;
/// Evicted blocks whose mirror copies are dropped together, with one process_madvise.
const RELEASE_BLOCKS: usize = 8;
/// Ranges per process_madvise (the kernel takes up to UIO_MAXIOV = 1024).
const RELEASE_RANGES: usize = 64;
/// Shared pages staging notes for one pinning read (`stage.rs`, `unshare_busy`).
const UNSHARE_BATCH: usize = 64;

struct Reclaim {
    s: Arc<Shared>,
    compressed: Vec<u8>,
    writer: Option<UnitWriter>,
    slots: Vec<u64>,
    pending: Pending,
    /// Blocks released together: [`RELEASE_BLOCKS`], or 1 without `batch_release`.
    release_blocks: usize,
    /// Blocks deactivated together: [`SPAN_BLOCKS`], or 1 without `batch_stage`.
    span_blocks: usize,
    /// This process's pidfd for process_madvise; `None` where it failed once (old kernels),
    /// and ranges are dropped with one madvise each.
    pidfd: Option<std::os::fd::OwnedFd>,
    /// Round-robin position over regions.
    next_region: usize,
    last_metadata: Instant,
    /// When inherited pages still shared with the parent were last looked at
    /// ([`Reclaim::look_at_shared`]).
    last_shared_look: Instant,
    /// The time between two looks ([`Reclaim::look_at_shared`]).
    shared_look_every: Duration,
    warned_write_error: bool,
    /// Staged pages reclaim aims to keep (the inactive list's size), see [`inactive_target`].
    inactive_target: i64,
    /// Present pages the hand met since its last look at the active share, and how many
    /// of them were active (`stage.rs`, `age_active`).
    active_seen: (u64, u64),
    /// Active pages are within their share: the hand passes them over, bits kept.
    protect_active: bool,
    /// workingset_activate and pgsteal at the last weighing (`protect_selective_pct`), the
    /// running rate of activations per 1,000 evictions, and whether protection holds.
    activations_seen: (u64, u64),
    activation_rate_permille: u64,
    activations_selective: bool,
    /// workingset_activate and pgsteal at the last target update.
    last_activate: u64,
    last_steal: u64,
    /// `workingset_refault_near` and `workingset_refault` when the inactive list's size was
    /// last weighed by its reach ([`inactive_target_by_reach`]).
    last_near: u64,
    last_refaults: u64,
    /// Staging windows, made on first use: `[plain, write-protect tracking]`.
    windows: [Option<usize>; 2],
    /// The last staging run through each window, to name a page found left in it.
    last_runs: [RunLog; 2],
    /// Pages staging found shared (EBUSY), to make the process's own again
    /// (`stage.rs`, `unshare_busy`); at most [`UNSHARE_BATCH`].
    busy: Vec<usize>,
    warned_window: bool,
    /// A staging move failed in a way no rule here explains: said once.
    warned_move: bool,
}

impl Drop for Reclaim {
    fn drop(&mut self) {
        let len = self.span_blocks * BLOCK_PAGES * PAGE_SIZE;
        for addr in self.windows.iter().flatten() {
            // Unregistered first, so the munmap raises no UNMAP event.
            let _ = self.s.uffd.unregister(*addr, len);
            // SAFETY: our window, empty between staging runs and used by nobody else.
            unsafe {
                let _ = sys::munmap(*addr, len);
            }
        }
    }
}

/// The inactive list's new size after `activated` workingset activations among `stolen`
/// evictions since the last update. A page refaulted soon after eviction says the inactive
/// list let it go too early, but when refaults keep coming at a high rate (thrashing: the
/// working set does not fit whatever the split), staging only adds a move out and back to
/// each page: shrink the list by half, down to `min`. Otherwise grow it back toward `max`.
pub(crate) fn inactive_target(cur: i64, activated: u64, stolen: u64, min: i64, max: i64) -> i64 {
    if stolen < 1024 {
        return cur.clamp(min, max);
    }
    if activated * 4 > stolen {
        (cur / 2).max(min)
    } else {
        (cur * 2).min(max)
    }
}

/// Refaults weighed at once by [`inactive_target_by_reach`]: fewer say nothing yet.
const REACH_REFAULTS: u64 = 256;

/// The inactive list's new size after `near` of `refaults` refaults since the last update
/// came within its full size (`max`) of their eviction: a list that long would have caught
/// them as staged faults, each a move back instead of a read. When a quarter of the
/// refaults are near, the list doubles toward `max`; otherwise it halves toward `min`
/// (a program touching its pages at random over much more than the budget refaults from
/// far, and a long list there only adds staged faults on pages no list would keep).
pub(crate) fn inactive_target_by_reach(cur: i64, near: u64, refaults: u64, min: i64, max: i64) -> i64 {
    if refaults < REACH_REFAULTS {
        return cur.clamp(min, max);
    }
    if near * 4 >= refaults {
        (cur * 2).clamp(min, max)
    } else {
        (cur / 2).clamp(min, max)
    }
}

/// Batches to stage in one step of a pass, for one evicted: with `stage_fill`, enough to
/// close the gap of `short` pages to the inactive list's target, four at most (the list
/// fills over a few passes, and no step holds a region's lock for long); else one, or two
/// while under the reserve (`ahead`).
fn stage_batches(config: &crate::config::PagerConfig, ahead: bool, short: i64) -> usize {
    let reserve = if ahead { 2 } else { 1 };
    if !config.stage_fill {
        return reserve;
    }
    let batch_pages = (BATCH_BLOCKS * BLOCK_PAGES) as i64;
    ((short.max(0) + batch_pages - 1) / batch_pages).clamp(reserve as i64, STAGE_FILL_MAX_BATCHES as i64) as usize
}

/// The reclaim thread's loop.
pub(crate) fn reclaim_thread(s: Arc<Shared>) {
    sys::lower_priority(s.config.background_nice, s.config.background_idle, "reclaim");
    let mut r = match Reclaim::new(s) {
        Ok(r) => r,
        Err(e) => fatal(&format!("reclaim cannot map its write buffer: {e}")),
    };
    loop {
        r.s.wake.kick.wait(Duration::from_millis(5));
        if r.s.wake.shutdown.load(Ordering::Acquire) {
            return;
        }
        if r.last_metadata.elapsed() > Duration::from_millis(50) {
            r.s.refresh_metadata();
            r.last_metadata = Instant::now();
        }
        r.look_at_shared();
        r.s.refresh_tree();
        let fp = r.s.footprint_bytes();
        r.s.counters.note_footprint(fp);
        if r.pool_over_limit() {
            r.s.kick_writeback(false);
        }
        if fp > r.s.high_watermark() {
            r.s.wake.reclaim_idle.store(false, Ordering::Release);
            r.run();
        }
        r.s.wake.reclaim_idle.store(true, Ordering::Release);
        r.notify_room();
    }
}

impl Reclaim {
    fn new(s: Arc<Shared>) -> std::io::Result<Reclaim> {
        let writer = match s.tiers.file {
            Some(_) => Some(UnitWriter::new(s.config.file_unit_bytes)?),
            None => None,
        };
        let (batch, stage) = (s.config.batch_release, s.config.batch_stage);
        Ok(Reclaim {
            s,
            compressed: vec![0u8; COMPRESS_BUF_BYTES],
            writer,
            slots: Vec::with_capacity(BLOCK_PAGES),
            pending: Pending::default(),
            release_blocks: if batch { RELEASE_BLOCKS } else { 1 },
            span_blocks: if stage { SPAN_BLOCKS } else { 1 },
            pidfd: if batch { sys::pidfd_self().ok() } else { None },
            next_region: 0,
            last_metadata: Instant::now(),
            last_shared_look: Instant::now(),
            shared_look_every: Duration::from_millis(SHARED_LOOK_MS),
            warned_write_error: false,
            inactive_target: i64::MAX,
            active_seen: (0, 0),
            protect_active: false,
            activations_seen: (0, 0),
            activation_rate_permille: 0,
            activations_selective: true,
            last_activate: 0,
            last_steal: 0,
            last_near: 0,
            last_refaults: 0,
            windows: [None; 2],
            busy: Vec::with_capacity(UNSHARE_BATCH),
            last_runs: [RunLog::default(); 2],
            warned_window: false,
            warned_move: false,
        })
    }

    /// Counts as this process's the inherited pages its parent no longer shares
    /// (`Shared::take_unshared_inherited`): every [`SHARED_LOOK_MS`] for each
    /// [`SHARED_LOOK_PAGES`] still shared while looks find some; while they find none, up
    /// to 16 times less often (a worker beside an idle parent would read its page map for
    /// nothing).
    fn look_at_shared(&mut self) {
        if self.last_shared_look.elapsed() < self.shared_look_every {
            return;
        }
        let (taken, left) = self.s.take_unshared_inherited();
        let pace = Duration::from_millis(SHARED_LOOK_MS * (1 + (left / SHARED_LOOK_PAGES) as u64));
        self.shared_look_every = if taken > 0 { pace } else { (self.shared_look_every * 2).clamp(pace, pace * 16) };
        self.last_shared_look = Instant::now();
    }

    fn notify_room(&self) {
        let (m, cv) = &self.s.wake.room;
        *m.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        cv.notify_all();
    }

    fn pool_over_limit(&self) -> bool {
        (self.s.tiers.file.is_some() || self.s.tiers.remote.is_some())
            && self.s.tiers.pool.total_bytes() > self.s.pool_limit()
    }

    /// Reclaims until the footprint is under the low watermark, or nothing more can be done.
    fn run(&mut self) {
        let max_inactive = self.s.inactive_reach_pages() as i64;
        let c = &self.s.counters;
        if self.s.config.workingset && self.s.config.inactive_adapt {
            let (near, refaults) =
                (c.workingset_refault_near.load(Ordering::Relaxed), c.workingset_refault.load(Ordering::Relaxed));
            let t = inactive_target_by_reach(
                self.inactive_target.min(max_inactive),
                near - self.last_near,
                refaults - self.last_refaults,
                STAGE_RESERVE_PAGES.min(max_inactive),
                max_inactive,
            );
            if refaults - self.last_refaults >= REACH_REFAULTS {
                (self.last_near, self.last_refaults) = (near, refaults);
            }
            self.inactive_target = t;
        } else if self.s.config.workingset && self.s.config.inactive_thrash_shrink {
            let (act, steal) = (c.workingset_activate.load(Ordering::Relaxed), c.pgsteal.load(Ordering::Relaxed));
            let t = inactive_target(
                self.inactive_target.min(max_inactive),
                act - self.last_activate,
                steal - self.last_steal,
                256.min(max_inactive),
                max_inactive,
            );
            if steal - self.last_steal >= 1024 {
                (self.last_activate, self.last_steal) = (act, steal);
            }
            self.inactive_target = t;
        } else {
            self.inactive_target = max_inactive;
        }
        let inactive_target = self.inactive_target;
        // The low watermark is headroom for a program whose faults wait for room (with
        // `throttle_headroom`; else for one still faulting at all). One whose faults did not
        // wait during the last batch needs none (reclaim keeps up, or the program is done,
        // as after a fill): stop at the high watermark instead of evicting what it may touch
        // next.
        let mut pressure_seen = pressure(&self.s);
        loop {
            if self.s.wake.shutdown.load(Ordering::Acquire) {
                return;
            }
            self.look_at_shared();
            self.s.refresh_tree();
            let fp = self.s.footprint_bytes();
            self.s.counters.note_footprint(fp);
            let now = pressure(&self.s);
            if fp <= self.s.low_watermark() || (fp <= self.s.high_watermark() && now == pressure_seen) {
                self.s.wake.reclaim_stuck.store(false, Ordering::Relaxed);
                return;
            }
            pressure_seen = now;
            if self.pool_over_limit() {
                self.s.kick_writeback(false);
            }
            if self.s.pool_backpressure() {
                // A remote batch's acknowledgement is what frees room now: wait for it
                // (writeback kicks us after each step) instead of growing the pool.
                self.s.wake.reclaim_stuck.store(false, Ordering::Relaxed);
                self.s.wake.kick.wait(Duration::from_millis(5));
                self.notify_room();
                continue;
            }
            let mut progress = 0usize;
            let staged = self.s.acct.staged_pages.load(Ordering::Relaxed);
            if staged < inactive_target {
                // A batch for the one evicted below, and while the list is under its
                // reserve one more, for the direct reclaimers evicting beside us.
                let ahead = self.s.config.stage_ahead && staged < STAGE_RESERVE_PAGES;
                progress +=
                    self.deactivate(stage_batches(&self.s.config, ahead, inactive_target - staged) * BATCH_BLOCKS);
                // Outside every lock of the pager's: the read may fault (see there). Pages
                // made this process's own are moved by the next pass: progress.
                progress += self.unshare_busy();
            }
            progress += self.evict(BATCH_BLOCKS);
            self.notify_room();
            if progress > 0 {
                self.s.wake.reclaim_stuck.store(false, Ordering::Relaxed);
                continue;
            }
            // Nothing left to evict: only writing the pool back can shrink the footprint.
            let writeback_can = self.s.writeback_target_up() && self.s.tiers.pool.stored_objects() > 0;
            if writeback_can {
                self.s.kick_writeback(true);
                self.s.wake.reclaim_stuck.store(false, Ordering::Relaxed);
            } else {
                self.s.wake.reclaim_stuck.store(true, Ordering::Relaxed);
            }
            // Under the low watermark is the goal; over the budget is what users must hear of.
            if !writeback_can && fp > self.s.budget() {
                self.s.counters.over_budget_events.fetch_add(1, Ordering::Relaxed);
                // Said once: a pager stuck over budget passes here every millisecond.
                if !self.s.acct.warned_over_budget.load(Ordering::Relaxed) {
                    if let Some(line) = self.over_budget_warning(fp) {
                        self.s.acct.warned_over_budget.store(true, Ordering::Relaxed);
                        eprintln!("{line}");
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(1));
            return;
        }
    }

    /// What to tell the user when a footprint of `fp` bytes is over the budget and nothing
    /// more can be evicted, or `None` when that is no news. In a tree, the budget that
    /// matters is the tree's: one process over its share while the tree is within the
    /// budget (a share of a small budget split many ways can be smaller than what a pager
    /// cannot give back: its staged pages, its metadata) is how sharing works. So are pages
    /// still shared with forked children, which cannot be moved out (UFFDIO_MOVE takes
    /// pages this process alone maps): the tree's other members make the room.
    fn over_budget_warning(&self, fp: u64) -> Option<String> {
        let s = &self.s;
        if let Some(t) = &s.tree {
            // Over by less than the watermarks' margin is the shares settling.
            if s.fork.children.live() > 0 || t.total() <= t.budget() + t.budget() / 16 || !t.first_to_warn() {
                return None;
            }
        }
        let why = match (&s.tiers.file, &s.tiers.remote) {
            (None, None) => " (no file tier: add 'file' to the tiers)".to_string(),
            (None, Some(_)) => format!(
                " (the remote tier took no writes for {} s and there is no file tier to fall back on: add 'file' to the tiers)",
                crate::backend::remote::WRITE_GRACE.as_secs()
            ),
            _ => String::new(),
        };
        let Some(t) = &s.tree else {
            return Some(format!(
                "tierswap: footprint {} is over the budget of {} and nothing more can be evicted{why}; going over budget rather than losing data",
                size(fp),
                size(s.budget())
            ));
        };
        Some(format!(
            "tierswap: the process tree's footprint {} is over its budget of {}, and this process (pid {}, footprint {}, share {}) can evict nothing more{why}; going over budget rather than losing data",
            size(t.total()),
            size(t.budget()),
            std::process::id(),
            size(fp),
            size(s.budget())
        ))
    }

    fn regions(&self) -> Vec<Arc<RegionInner>> {
        self.s.all_regions()
    }
}

/// `bytes` for a message: MiB, or KiB under one MiB (a small tree's shares are).
fn size(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// The count whose rise during a batch keeps reclaim going to its low watermark: faults
/// that waited for room (`throttle_headroom`), or faults at all.
fn pressure(s: &Shared) -> u64 {
    let c = &s.counters;
    if s.config.throttle_headroom { &c.throttled_faults } else { &c.faults }.load(Ordering::Relaxed)
}

/// Runs `per_block(reclaim, region, block)` over every block of every live region now, on
/// the calling thread, with the region's reclaim lock held; returns the sum of what it
/// returned.
fn for_every_block(s: &Arc<Shared>, mut per_block: impl FnMut(&mut Reclaim, &RegionInner, usize) -> usize) -> usize {
    let mut r = match Reclaim::new(s.clone()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tierswap: cannot map a write buffer for eviction: {e}");
            return 0;
        }
    };
    let mut total = 0;
    for region in r.regions() {
        let _guard = region.reclaim_lock.write().unwrap_or_else(|e| e.into_inner());
        if region.dead.load(Ordering::Acquire) {
            continue;
        }
        for b in 0..region.n_pages.div_ceil(BLOCK_PAGES) {
            total += per_block(&mut r, &region, b);
        }
        r.release(&region);
    }
    r.notify_room();
    total
}

/// Stages and evicts every present and staged page of every region now, on the calling
/// thread (tests and the lab's forced swap-out). Returns pages evicted.
pub(crate) fn evict_everything(s: &Arc<Shared>) -> usize {
    for_every_block(s, |r, region, b| {
        let staged = r.deactivate_block(region, b, true);
        r.s.counters.pgdeactivate.fetch_add(staged as u64, Ordering::Relaxed);
        let n = r.evict_block(region, b);
        if r.pending.blocks >= r.release_blocks {
            r.release(region);
        }
        n
    })
}

/// Stages every present page of every region now, on the calling thread, without evicting
/// (tests of the inactive list). Returns pages staged.
pub(crate) fn stage_everything(s: &Arc<Shared>) -> usize {
    for_every_block(s, |r, region, b| {
        let n = r.deactivate_block(region, b, true);
        if n > 0 {
            r.s.counters.pgdeactivate.fetch_add(n as u64, Ordering::Relaxed);
            r.s.acct.inactive.lock().unwrap_or_else(|e| e.into_inner()).push_back((region.id, b));
        }
        n
    })
}

#[cfg(test)]
mod tests {
    use super::{inactive_target, inactive_target_by_reach, stage_batches};
    use crate::config::PagerConfig;

    #[test]
    fn the_inactive_list_grows_while_refaults_come_within_its_reach() {
        let (min, max) = (512, 16_384);
        // A quarter of the refaults near: double up to the full size.
        let mut t = min;
        for _ in 0..10 {
            t = inactive_target_by_reach(t, 64, 256, min, max);
        }
        assert_eq!(t, max);
        // Fewer: halve back to the reserve.
        t = inactive_target_by_reach(t, 63, 256, min, max);
        assert_eq!(t, max / 2);
        for _ in 0..10 {
            t = inactive_target_by_reach(t, 10, 1000, min, max);
        }
        assert_eq!(t, min);
        // Too few refaults to judge: unchanged (within bounds).
        assert_eq!(inactive_target_by_reach(777, 200, 255, min, max), 777);
        assert_eq!(inactive_target_by_reach(i64::MAX, 0, 0, min, max), max);
    }

    #[test]
    fn stage_fill_closes_the_gap_four_batches_at_most() {
        let fill = PagerConfig { stage_fill: true, ..Default::default() };
        let one_for_one = PagerConfig { stage_fill: false, ..Default::default() };
        // A batch is 256 pages.
        assert_eq!(stage_batches(&fill, false, 10_000), 4);
        assert_eq!(stage_batches(&fill, false, 600), 3, "a part of a batch short is a batch");
        assert_eq!(stage_batches(&fill, false, 100), 1);
        assert_eq!(stage_batches(&fill, true, 100), 2, "the reserve still stages two");
        assert_eq!(stage_batches(&fill, false, -50), 1, "over the target (it shrank): one");
        assert_eq!(stage_batches(&one_for_one, false, 10_000), 1);
        assert_eq!(stage_batches(&one_for_one, true, 10_000), 2);
    }

    #[test]
    fn thrashing_shrinks_the_inactive_list_and_calm_grows_it_back() {
        let (min, max) = (256, 8192);
        let mut t = max;
        for _ in 0..10 {
            t = inactive_target(t, 3000, 4096, min, max);
        }
        assert_eq!(t, min);
        t = inactive_target(t, 10, 4096, min, max);
        assert_eq!(t, 2 * min);
        // Too few evictions to judge: unchanged.
        assert_eq!(inactive_target(777, 500, 600, min, max), 777);
    }
}
