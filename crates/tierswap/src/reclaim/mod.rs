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

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::compress::{compress, COMPRESS_BUF_BYTES, INCOMPRESSIBLE_LIMIT};
use crate::backend::file::UnitWriter;
use crate::backend::zero::same_filled_pattern;
use crate::mm::{RegionInner, Shared};
use crate::page::{BLOCK_PAGES, PAGE_SIZE};
use crate::pagetable::{Pte, PteState, PTES_PER_CHUNK};
use crate::swap::{SwapEntry, Tag};
use crate::sys;
use crate::sys::fatal;
use crate::uffd;

/// Blocks deactivated or evicted per step (1 MiB).
const BATCH_BLOCKS: usize = 16;
/// 64 KiB blocks per page-table chunk (2 MiB).
const CHUNK_BLOCKS: usize = PTES_PER_CHUNK / BLOCK_PAGES;
/// Reclaim's allocation lane in the swap space.
const LANE: usize = 0;
/// Staged pages the reclaim thread keeps ahead of its own eviction with `stage_ahead`, for
/// direct reclaimers: two batches (2 MiB). Not more: a list filled to its target holds
/// pages a sparse refault touches, and each such fault brings back its staged block whole.
const STAGE_RESERVE_PAGES: i64 = (2 * BATCH_BLOCKS * BLOCK_PAGES) as i64;
/// Blocks deactivated together, with one move per run of present pages (1 MiB).
const SPAN_BLOCKS: usize = 16;
/// Evicted blocks whose mirror copies are dropped together, with one process_madvise.
const RELEASE_BLOCKS: usize = 8;
/// Ranges per process_madvise (the kernel takes up to UIO_MAXIOV = 1024).
const RELEASE_RANGES: usize = 64;

/// Evicted pages whose mirror copies are not dropped yet. Their bytes are stored and their
/// slots placed, but their ptes stay locked (a fault on one waits) until
/// [`Reclaim::release`] drops every range at once and points the ptes at their slots.
/// Dropping a range costs a TLB shootdown while the program runs on the other CPU: one
/// process_madvise over 8 blocks measured 26 µs a block here, against 40–46 µs for one
/// madvise each. Always released before the region's reclaim lock is let go.
#[derive(Default)]
struct Pending {
    /// Mirror ranges (address, bytes), adjacent ones merged.
    ranges: Vec<(usize, usize)>,
    /// (page index, slot) of every page whose range is pending.
    pages: Vec<(usize, u64)>,
    blocks: usize,
}

impl Pending {
    fn push_range(&mut self, addr: usize, len: usize) {
        match self.ranges.last_mut() {
            Some((a, l)) if *a + *l == addr => *l += len,
            _ => self.ranges.push((addr, len)),
        }
    }
}

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
    warned_write_error: bool,
    /// Staged pages reclaim aims to keep (the inactive list's size), see [`inactive_target`].
    inactive_target: i64,
    /// workingset_activate and pgsteal at the last target update.
    last_activate: u64,
    last_steal: u64,
    /// Staging windows, made on first use: `[plain, write-protect tracking]`.
    windows: [Option<usize>; 2],
    /// The last staging run through each window, to name a page found left in it.
    last_runs: [RunLog; 2],
    warned_window: bool,
}

/// What a staging run did, move by move: kept per window so that the internal error for a
/// page found in the window can say which run it could be from (the run before).
#[derive(Clone, Copy, Default)]
struct RunLog {
    region: u64,
    /// Each move into the window: (first page, pages asked, pages taken, outcome).
    moves: [(usize, usize, usize, &'static str); 8],
    n: usize,
}

impl RunLog {
    fn start(&mut self, region: u64) {
        *self = RunLog { region, ..RunLog::default() };
    }

    fn push(&mut self, at: usize, asked: usize, taken: usize, outcome: &'static str) {
        if let Some(m) = self.moves.get_mut(self.n) {
            *m = (at, asked, taken, outcome);
        }
        self.n += 1;
    }
}

impl std::fmt::Display for RunLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "region {}:", self.region)?;
        for &(at, asked, taken, outcome) in &self.moves[..self.n.min(self.moves.len())] {
            write!(f, " [pages {at}+{asked}: {taken} taken, {outcome}]")?;
        }
        if self.n > self.moves.len() {
            write!(f, " and {} more moves", self.n - self.moves.len())?;
        }
        Ok(())
    }
}

/// The errno behind a move's outcome, for [`RunLog`].
fn outcome(res: &uffd::Result<usize>) -> &'static str {
    match res {
        Ok(_) => "ok",
        Err(uffd::Error::PageExist { .. }) => "EEXIST",
        Err(uffd::Error::Again { op, .. }) if op.starts_with("change to a leaving") => "leaving",
        Err(uffd::Error::Again { .. }) => "EAGAIN",
        Err(uffd::Error::NoPage { .. }) => "ENOENT",
        Err(uffd::Error::Busy { .. }) => "EBUSY",
        Err(uffd::Error::BadAddress { .. }) => "EFAULT",
        Err(uffd::Error::Invalid { .. }) => "EINVAL",
        Err(_) => "other",
    }
}

/// Where staging moves a run of the program's pages first, on its way to the mirror: a
/// range of ours registered on the *program's* userfaultfd. The move out of the program's
/// range is then an ioctl of that userfaultfd, which the kernel refuses (EAGAIN) while an
/// event about the program's memory is unread, checked under its own lock together with
/// the move; and [`Shared::guarded`] refuses it from the event's read to its handling.
/// Moved straight into the mirror (the mirror's userfaultfd, which has no events), a page
/// would be taken after an munmap or mremap the pager has not handled yet: the page of
/// whatever the kernel has mapped at that address since (tests/address_reuse.rs). A second
/// move, window to mirror, follows at once, so the window is empty between runs.
/// Never touched, never advised (a REMOVE event), never inherited by a child.
fn map_window(s: &Shared, wp: bool, pages: usize) -> std::io::Result<usize> {
    let len = pages * PAGE_SIZE;
    let addr = sys::mmap_reserve(len)?;
    // SAFETY: our fresh, unused mapping.
    unsafe {
        let _ = sys::madvise(addr, len, libc::MADV_NOHUGEPAGE);
        let _ = sys::madvise(addr, len, libc::MADV_DONTDUMP);
        let _ = sys::madvise(addr, len, libc::MADV_DONTFORK);
    }
    // The regions' mode: UFFDIO_MOVE wants equal protections on both sides.
    let mode = uffd::RegisterMode { missing: true, wp, minor: false };
    if let Err(e) = s.uffd.register(addr, len, mode) {
        // SAFETY: as above.
        unsafe {
            let _ = sys::munmap(addr, len);
        }
        return Err(std::io::Error::other(e));
    }
    Ok(addr)
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
            warned_write_error: false,
            inactive_target: i64::MAX,
            last_activate: 0,
            last_steal: 0,
            windows: [None; 2],
            last_runs: [RunLog::default(); 2],
            warned_window: false,
        })
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
        let budget_pages = (self.s.budget() / PAGE_SIZE as u64) as i64;
        let max_inactive = (budget_pages / 8).max(256);
        if self.s.config.workingset {
            let c = &self.s.counters;
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
                progress += self.deactivate(if ahead { 2 * BATCH_BLOCKS } else { BATCH_BLOCKS });
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
                if !self.s.acct.warned_over_budget.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "tierswap: footprint {} MiB is over the budget of {} MiB and nothing more can be evicted{}; going over budget rather than losing data",
                        fp >> 20,
                        self.s.budget() >> 20,
                        match (&self.s.tiers.file, &self.s.tiers.remote) {
                            (None, None) => " (no file tier: add 'file' to the tiers)".to_string(),
                            (None, Some(_)) => format!(
                                " (the remote tier took no writes for {} s and there is no file tier to fall back on: add 'file' to the tiers)",
                                crate::backend::remote::WRITE_GRACE.as_secs()
                            ),
                            _ => String::new(),
                        }
                    );
                }
            }
            std::thread::sleep(Duration::from_millis(1));
            return;
        }
    }

    fn regions(&self) -> Vec<Arc<RegionInner>> {
        self.s.all_regions()
    }

    /// Moves up to `max_blocks` blocks of present pages to staging. Returns pages moved.
    fn deactivate(&mut self, max_blocks: usize) -> usize {
        let regions = self.regions();
        if regions.is_empty() {
            return 0;
        }
        let mut moved = 0;
        let mut blocks_done = 0;
        for k in 0..regions.len() {
            let r = &regions[(self.next_region + k) % regions.len()];
            let Ok(_guard) = r.reclaim_lock.try_read() else {
                continue;
            };
            if r.dead.load(Ordering::Acquire) {
                continue;
            }
            let n_blocks = r.n_pages.div_ceil(BLOCK_PAGES);
            let mut scanned = 0;
            while scanned < n_blocks && blocks_done < max_blocks {
                let b = r.clock_block.fetch_add(1, Ordering::Relaxed) % n_blocks;
                scanned += 1;
                if !r.ptes.chunk_has_present(b * BLOCK_PAGES) {
                    // Nothing present in this block's 2 MiB chunk: the hand jumps past it.
                    let rest = (CHUNK_BLOCKS - 1 - b % CHUNK_BLOCKS).min(n_blocks - 1 - b);
                    r.clock_block.fetch_add(rest, Ordering::Relaxed);
                    scanned += rest;
                    continue;
                }
                // The blocks after it in its chunk go with it: one move per run of pages
                // (one TLB flush) instead of one per block.
                let span = (max_blocks - blocks_done)
                    .min(self.span_blocks)
                    .min(CHUNK_BLOCKS - b % CHUNK_BLOCKS)
                    .min(n_blocks - b);
                if span > 1 {
                    r.clock_block.fetch_add(span - 1, Ordering::Relaxed);
                    scanned += span - 1;
                }
                let mut per_block = [0usize; SPAN_BLOCKS];
                moved += self.deactivate_span(r, b, span, false, &mut per_block);
                for (k, &n) in per_block[..span].iter().enumerate() {
                    if n > 0 {
                        blocks_done += 1;
                        self.s.acct.inactive.lock().unwrap_or_else(|e| e.into_inner()).push_back((r.id, b + k));
                    }
                }
            }
            if blocks_done >= max_blocks {
                self.next_region = (self.next_region + k + 1) % regions.len();
                break;
            }
        }
        self.s.counters.pgdeactivate.fetch_add(moved as u64, Ordering::Relaxed);
        moved
    }

    /// Stages the present pages of block `b`. Returns pages staged.
    fn deactivate_block(&mut self, r: &RegionInner, b: usize, force: bool) -> usize {
        self.deactivate_span(r, b, 1, force, &mut [0; SPAN_BLOCKS])
    }

    /// Stages the present pages of blocks `[b, b + n)`, `n` ≤ [`SPAN_BLOCKS`], all in one
    /// 2 MiB chunk (the kernel moves a run within one page table with one TLB flush).
    /// `per_block[k]` gets the pages staged of block `b + k`. Returns pages staged.
    fn deactivate_span(
        &mut self,
        r: &RegionInner,
        b: usize,
        n: usize,
        force: bool,
        per_block: &mut [usize; SPAN_BLOCKS],
    ) -> usize {
        debug_assert!(n <= SPAN_BLOCKS && (b % CHUNK_BLOCKS) + n <= CHUNK_BLOCKS);
        let start = b * BLOCK_PAGES;
        let end = (start + n * BLOCK_PAGES).min(r.n_pages);
        let mut locked = [false; SPAN_BLOCKS * BLOCK_PAGES];
        let mut any = false;
        for i in start..end {
            // An active page (refaulted from staging) gets one more round: clear the bit.
            let p = r.ptes.load(i);
            if p.is_poisoned() {
                // A poison marker holds no data and cannot be moved: nothing to stage.
                continue;
            }
            if !force && p.state() == PteState::Present && p.active() && !p.locked() {
                if let Some(old) = r.ptes.try_lock_in(i, PteState::Present) {
                    r.ptes.unlock(i, old, old.aged_hot());
                }
                continue;
            }
            if force {
                // Forced eviction waits out a fault in flight: the program may already run
                // on a page whose pte its fault thread has yet to mark present.
                let old = r.ptes.lock(i);
                if old.state() == PteState::Present && !old.is_poisoned() {
                    locked[i - start] = true;
                    any = true;
                } else {
                    r.ptes.unlock(i, old, old);
                }
            } else if let Some(old) = r.ptes.try_lock_in(i, PteState::Present) {
                if old.is_poisoned() {
                    r.ptes.unlock(i, old, old);
                } else {
                    locked[i - start] = true;
                    any = true;
                }
            }
        }
        if !any {
            return 0;
        }
        let mut staged = 0;
        let mut i = start;
        while i < end {
            if !locked[i - start] {
                i += 1;
                continue;
            }
            let run_start = i;
            while i < end && locked[i - start] {
                i += 1;
            }
            staged += self.stage_run(r, run_start, i, start, per_block);
        }
        self.s.acct.present_pages.fetch_sub(staged as i64, Ordering::Relaxed);
        self.s.acct.staged_pages.fetch_add(staged as i64, Ordering::Relaxed);
        staged
    }

    /// The staging window for regions of this registration mode (see [`map_window`]).
    fn window(&mut self, wp: bool) -> Option<usize> {
        let k = wp as usize;
        if self.windows[k].is_none() {
            match map_window(&self.s, wp, self.span_blocks * BLOCK_PAGES) {
                Ok(addr) => self.windows[k] = Some(addr),
                Err(e) => {
                    if !self.warned_window {
                        self.warned_window = true;
                        eprintln!("tierswap: cannot map a staging window ({e}); pages stay in memory");
                    }
                }
            }
        }
        self.windows[k]
    }

    /// Moves locked present pages `[from, to)` to the mirror, through the window, and
    /// unlocks them: staged if moved; None if the program had discarded it (a hole);
    /// present if the move could not be done now. Counts each page staged in
    /// `per_block[(page - span_start) / BLOCK_PAGES]`. Returns pages staged.
    fn stage_run(
        &mut self,
        r: &RegionInner,
        from: usize,
        to: usize,
        span_start: usize,
        per_block: &mut [usize],
    ) -> usize {
        let Some(window) = self.window(r.clean_tracking) else {
            for k in from..to {
                let old = r.ptes.load(k);
                r.ptes.unlock(k, old, old);
            }
            return 0;
        };
        let mut i = from;
        let mut staged = 0;
        let mut again = 0;
        let k = r.clean_tracking as usize;
        let before = self.last_runs[k];
        self.last_runs[k].start(r.id);
        while i < to {
            let len = (to - i) * PAGE_SIZE;
            // SAFETY: pages [i, to) are locked present pages of the program's range and the
            // window is empty; guarded, the range is still the region's. Moving them out is
            // atomic with respect to the program, which faults on a touch and is served
            // from the mirror once we unlock.
            let res = self.s.guarded(r, || unsafe { self.s.uffd.move_pages(window, r.page_addr(i), len, true, false) });
            // The window, not the count, says how many pages moved: Linux 6.18 can report
            // fewer than a batched move took before it ended in EAGAIN (the events stress
            // caught 4 reported of 12 moved).
            let taken = match &res {
                Ok(bytes) => bytes / PAGE_SIZE,
                Err(e @ uffd::Error::PageExist { .. }) => self.moved_before_eexist(r, window, i, to, e.done_bytes()),
                Err(_) => self.moved_into_window(window, to - i),
            };
            self.last_runs[k].push(i, to - i, taken, outcome(&res));
            let (done, skip) = match res {
                Ok(bytes) => (bytes / PAGE_SIZE, None),
                Err(e) => {
                    // EEXIST: the window was not empty, so `taken` is the count, not
                    // checked against the window (below).
                    let done = taken.max(e.done_bytes() / PAGE_SIZE);
                    let at = i + done;
                    let skip = match e {
                        uffd::Error::Busy { .. } => Some(PteState::Present),
                        // An event about this range is in hand: its handler settles these ptes.
                        uffd::Error::Again { .. } if self.s.is_leaving(r) => Some(PteState::Present),
                        uffd::Error::Again { .. } if again < 8 => {
                            again += 1;
                            None
                        }
                        // ENOENT, or EAGAIN without progress after retries (Linux 6.18's
                        // answer for a hole): the program may have dropped the page. The
                        // errno alone is not trusted with data: where the page is decides.
                        uffd::Error::NoPage { .. } | uffd::Error::Again { .. } => (at < to).then(|| where_is(r, at)),
                        // The move ran into pages it had moved itself without counting them
                        // (see `moved_before_eexist`): go on after them.
                        uffd::Error::PageExist { done_bytes, .. } if taken > done_bytes / PAGE_SIZE => {
                            self.s
                                .counters
                                .move_uncounted
                                .fetch_add((taken - done_bytes / PAGE_SIZE) as u64, Ordering::Relaxed);
                            None
                        }
                        uffd::Error::PageExist { done_bytes, .. } => {
                            // Something put a page there that no staging run did: a bug.
                            // Whose it is cannot be told, so it stays where it is, in a
                            // window set aside for good. The pages moved before it (EEXIST
                            // stops the move there) are staged; the rest stay present.
                            let ours = done_bytes / PAGE_SIZE;
                            eprintln!(
                                "tierswap: internal error: the staging window at {window:#x} holds pages no staging run put there ({}); set aside, a new window is used (this run: region {} pages {i}..{to}; the run before through it: {before})",
                                window_contents(window, to - i),
                                r.id
                            );
                            if ours > 0 {
                                self.unwindow(r, window, i, ours);
                            }
                            for k in i..to {
                                let old = r.ptes.load(k);
                                let new = if k < i + ours { old.staged_keeping_hotness() } else { old };
                                r.ptes.unlock(k, old, new);
                                if k < i + ours {
                                    per_block[(k - span_start) / BLOCK_PAGES] += 1;
                                }
                            }
                            self.windows[k] = None;
                            return staged + ours;
                        }
                        // The program unmapped or moved the range (munmap / mremap): its
                        // event is on the way and settles these ptes. Nothing to say.
                        uffd::Error::BadAddress { .. } => Some(PteState::Present),
                        e => {
                            eprintln!("tierswap: staging pages at {:#x} failed: {e}", r.page_addr(at));
                            Some(PteState::Present)
                        }
                    };
                    (done, skip)
                }
            };
            if done > 0 {
                self.unwindow(r, window, i, done);
            }
            for k in i..i + done {
                let old = r.ptes.load(k);
                r.ptes.unlock(k, old, old.staged_keeping_hotness());
                per_block[(k - span_start) / BLOCK_PAGES] += 1;
            }
            staged += done;
            i += done;
            if let Some(state) = skip {
                if i < to {
                    let old = r.ptes.load(i);
                    let new = match state {
                        PteState::None => {
                            // The program dropped the page (MADV_DONTNEED): it reads as zeros.
                            self.s.acct.present_pages.fetch_sub(1, Ordering::Relaxed);
                            if let Some(kept) = old.kept_slot() {
                                crate::mm::slots::put_slot(&self.s, kept);
                            }
                            Pte::NONE
                        }
                        _ => old,
                    };
                    r.ptes.unlock(i, old, new);
                    i += 1;
                }
            }
        }
        staged
    }

    /// How many pages, from the window's start, a move of `n` pages into it took: the
    /// resident prefix. A resident page after a gap would be one the kernel moved out of
    /// order, which nothing here expects: it is reported and the pager stops rather than
    /// lose it.
    fn moved_into_window(&self, window: usize, n: usize) -> usize {
        let mut resident = [false; SPAN_BLOCKS * BLOCK_PAGES];
        let resident = &mut resident[..n];
        sys::residency(window, resident);
        let moved = resident.iter().take_while(|&&x| x).count();
        if let Some(k) = resident[moved..].iter().position(|&x| x) {
            fatal(&format!(
                "UFFDIO_MOVE left page {} of a staging run in the window at {window:#x} but not page {moved}",
                moved + k
            ));
        }
        moved
    }

    /// How many pages a move of locked pages `[i, to)` of `r` into the empty window took
    /// when it failed with EEXIST after reporting `done_bytes`. Linux 6.18 can move a batch
    /// of pages without counting it, then retry the batch's first page and find the window
    /// taken there by its own move: EEXIST, with the batch left out of the count (the events
    /// stress found a run's first page at window offset 0 so). The window's resident prefix
    /// is this run's when every program page it stands for has left the program's range;
    /// if one is still there, the window page beside it is not this run's (a bug elsewhere)
    /// and only the reported count is taken.
    fn moved_before_eexist(&self, r: &RegionInner, window: usize, i: usize, to: usize, done_bytes: usize) -> usize {
        let reported = (done_bytes / PAGE_SIZE).min(to - i);
        let n = to - i;
        let mut in_window = [false; SPAN_BLOCKS * BLOCK_PAGES];
        let mut in_program = [false; SPAN_BLOCKS * BLOCK_PAGES];
        sys::residency(window, &mut in_window[..n]);
        sys::residency(r.page_addr(i), &mut in_program[..n]);
        moved_by_run(reported, &in_window[..n], &in_program[..n])
    }

    /// Moves the `n` pages at the start of the window to the mirror at page `i` of `r`
    /// (locked ptes, about to be unlocked as staged). The mirror there should be empty: a
    /// copy found there is a stale one (its pte said present) and is dropped, loudly.
    fn unwindow(&mut self, r: &RegionInner, window: usize, i: usize, n: usize) {
        let mut k = 0;
        let mut tries = 0;
        while k < n {
            // SAFETY: the window's pages [k, n) are the locked pages [i + k, i + n) just
            // moved out of the program's range; the mirror there is theirs.
            let res = unsafe {
                self.s.mirror_uffd.move_pages(
                    r.mirror_addr(i + k),
                    window + k * PAGE_SIZE,
                    (n - k) * PAGE_SIZE,
                    true,
                    false,
                )
            };
            let err = match res {
                Ok(bytes) if bytes > 0 => {
                    k += bytes / PAGE_SIZE;
                    continue;
                }
                Ok(_) => None,
                Err(e) => Some(e),
            };
            match err {
                Some(uffd::Error::PageExist { done_bytes, .. }) => {
                    k += done_bytes / PAGE_SIZE;
                    // As below: pages gone from the window are in the mirror already.
                    while k < n && !sys::is_resident(window + k * PAGE_SIZE) {
                        k += 1;
                    }
                    if k == n {
                        continue;
                    }
                    eprintln!(
                        "tierswap: a stale copy sat in the mirror at {:#x} under a present page; dropped it",
                        r.mirror_addr(i + k)
                    );
                    // SAFETY: the mirror page of a locked pte whose bytes are in the window:
                    // what is in the mirror there is no page's only copy.
                    if let Err(e) = unsafe { sys::madvise(r.mirror_addr(i + k), PAGE_SIZE, libc::MADV_DONTNEED) } {
                        fatal(&format!("cannot drop a stale mirror page at {:#x}: {e}", r.mirror_addr(i + k)));
                    }
                }
                Some(uffd::Error::Again { done_bytes, .. } | uffd::Error::Busy { done_bytes, .. }) if tries < 1000 => {
                    k += done_bytes / PAGE_SIZE;
                    // The count can fall short of the pages moved (see `stage_run`): a page
                    // gone from the window is in the mirror.
                    while k < n && !sys::is_resident(window + k * PAGE_SIZE) {
                        k += 1;
                    }
                    tries += 1;
                    std::thread::yield_now();
                }
                e => fatal(&format!(
                    "moving staged pages from the window into the mirror at {:#x} failed: {}",
                    r.mirror_addr(i + k),
                    e.map_or_else(|| "no progress".to_string(), |e| e.to_string())
                )),
            }
        }
    }

    /// Evicts up to `max_blocks` of the oldest staged blocks (blocks whose pages were all
    /// touched again meanwhile do not count). Returns pages evicted.
    fn evict(&mut self, max_blocks: usize) -> usize {
        let mut evicted = 0;
        let mut blocks = 0;
        let mut busy = Vec::new();
        while blocks < max_blocks {
            let Some((id, b)) = self.s.acct.inactive.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else {
                break;
            };
            let Some(r) = self.s.region_by_id(id) else {
                continue;
            };
            let Ok(_guard) = r.reclaim_lock.try_read() else {
                busy.push((id, b));
                continue;
            };
            if r.dead.load(Ordering::Acquire) {
                continue;
            }
            // Evict this block and the ones after it in the queue from the same region
            // under one hold of its lock, their mirror ranges dropped in batches.
            let mut b = b;
            loop {
                let n = self.evict_block(&r, b);
                if n > 0 {
                    evicted += n;
                    blocks += 1;
                }
                if self.pending.blocks >= self.release_blocks {
                    self.release(&r);
                }
                if blocks >= max_blocks {
                    break;
                }
                let mut q = self.s.acct.inactive.lock().unwrap_or_else(|e| e.into_inner());
                match q.front() {
                    Some(&(next_id, next_b)) if next_id == id => {
                        q.pop_front();
                        b = next_b;
                    }
                    _ => break,
                }
            }
            self.release(&r);
        }
        if !busy.is_empty() {
            let mut q = self.s.acct.inactive.lock().unwrap_or_else(|e| e.into_inner());
            for x in busy.into_iter().rev() {
                q.push_front(x);
            }
        }
        evicted
    }

    fn evict_block(&mut self, r: &RegionInner, b: usize) -> usize {
        let start = b * BLOCK_PAGES;
        let end = (start + BLOCK_PAGES).min(r.n_pages);
        let mut pages = [usize::MAX; BLOCK_PAGES];
        let mut hot = [false; BLOCK_PAGES];
        let mut n = 0;
        let mut clean = [false; BLOCK_PAGES];
        let mut any_clean = false;
        for i in start..end {
            if let Some(old) = r.ptes.try_lock_in(i, PteState::Staged) {
                let old = match old.kept_slot() {
                    Some(kept) if !self.kept_copy_reachable(kept) => {
                        // Its only other copy is on a remote that is failing: evicting it
                        // clean would leave it there alone. It goes out like a written page.
                        crate::mm::slots::put_slot(&self.s, kept);
                        r.ptes.unlock(i, old, old.without_kept_slot());
                        match r.ptes.try_lock_in(i, PteState::Staged) {
                            Some(p) => p,
                            None => continue,
                        }
                    }
                    _ => old,
                };
                if old.kept_slot().is_some() {
                    clean[i - start] = true;
                    any_clean = true;
                } else {
                    pages[n] = i;
                    hot[n] = old.was_active();
                    n += 1;
                }
            }
        }
        let clean_evicted = if any_clean { self.evict_clean(r, start, &clean) } else { 0 };
        if n == 0 {
            if clean_evicted > 0 {
                self.pending.blocks += 1;
            }
            return clean_evicted;
        }
        let mut slots = std::mem::take(&mut self.slots);
        slots.clear();
        let got = match self.s.tiers.swap.alloc(LANE, n, &mut slots) {
            Ok(got) => got,
            Err(e) => {
                eprintln!("tierswap: {e}; pages stay in memory");
                0
            }
        };
        // Pages without a slot stay staged.
        for &i in &pages[got..n] {
            let old = r.ptes.load(i);
            r.ptes.unlock(i, old, old);
        }
        let mut placed = [true; BLOCK_PAGES];
        let mut file_pending: Vec<(usize, u64, usize)> = Vec::new();
        for k in 0..got {
            let page = mirror_page(r, pages[k]);
            let mut stored = self.store_page(page, slots[k]);
            if let Stored::UnitFull = stored {
                self.flush_file_pending(r, &pages, &slots, &mut file_pending, &mut placed);
                stored = self.store_page(page, slots[k]);
            }
            match stored {
                // A page that was hot once gets a second chance against pool writeback.
                Stored::Entry(e) if hot[k] && e.tag() == Tag::Pool => self.place(slots[k], e.with_referenced(true)),
                Stored::Entry(e) => self.place(slots[k], e),
                Stored::ToFile(off_in_unit, len) => file_pending.push((k, off_in_unit as u64, len)),
                Stored::UnitFull | Stored::Keep => placed[k] = false,
            }
        }
        if !file_pending.is_empty() {
            self.flush_file_pending(r, &pages, &slots, &mut file_pending, &mut placed);
        }
        // The stored pages stay locked until their mirror copies are dropped, with the
        // next blocks', in [`Reclaim::release`].
        let mut evicted = 0;
        for k in 0..got {
            let i = pages[k];
            if placed[k] {
                self.pending.push_range(r.mirror_addr(i), PAGE_SIZE);
                self.pending.pages.push((i, slots[k]));
                evicted += 1;
            } else {
                // Nowhere to put it now: give the slot back, the page stays staged.
                let e = self.s.tiers.swap.lock(slots[k]);
                self.s.tiers.swap.unlock(slots[k], e, SwapEntry::FREE);
                let old = r.ptes.load(i);
                r.ptes.unlock(i, old, old);
            }
        }
        if evicted + clean_evicted > 0 {
            self.pending.blocks += 1;
        }
        self.slots = slots;
        evicted + clean_evicted
    }

    /// Drops the mirror copies of the pending evicted pages of `r` and points their ptes
    /// at their slots. A range that cannot be dropped is reported and its pages count as
    /// evicted all the same: their bytes are in their slots, only the memory stays taken.
    fn release(&mut self, r: &RegionInner) {
        if self.pending.pages.is_empty() {
            return;
        }
        let mut done = 0;
        while done < self.pending.ranges.len() {
            done += self.drop_ranges(done);
        }
        for &(i, slot) in &self.pending.pages {
            let old = r.ptes.load(i);
            r.ptes.unlock(i, old, Pte::swapped(slot));
        }
        let evicted = self.pending.pages.len();
        self.s.acct.staged_pages.fetch_sub(evicted as i64, Ordering::Relaxed);
        self.s.counters.pgsteal.fetch_add(evicted as u64, Ordering::Relaxed);
        self.s.tiers.swap.note_evictions(evicted as u64);
        self.pending.ranges.clear();
        self.pending.pages.clear();
        self.pending.blocks = 0;
    }

    /// Drops pending ranges from `from` on: up to [`RELEASE_RANGES`] with one
    /// process_madvise, or one with madvise where that is not available or stopped short.
    /// Returns how many ranges it finished.
    fn drop_ranges(&mut self, from: usize) -> usize {
        let ranges = &self.pending.ranges[from..];
        if let Some(pidfd) = &self.pidfd {
            let n = ranges.len().min(RELEASE_RANGES);
            let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; RELEASE_RANGES];
            for (v, &(addr, len)) in iov.iter_mut().zip(&ranges[..n]) {
                *v = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
            }
            // SAFETY: the mirror pages of locked, stored pages; nothing else refers to them.
            match unsafe { sys::process_madvise(pidfd.as_fd(), &iov[..n], libc::MADV_DONTNEED) } {
                Ok(bytes) => {
                    // Whole ranges advised before a failing one; that one goes to madvise.
                    let mut left = bytes;
                    let mut whole = 0;
                    while whole < n && left >= ranges[whole].1 {
                        left -= ranges[whole].1;
                        whole += 1;
                    }
                    if whole > 0 {
                        return whole;
                    }
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS | libc::EPERM)) => {
                    // This kernel cannot: madvise from now on.
                    self.pidfd = None;
                }
                Err(_) => {}
            }
        }
        let (addr, len) = ranges[0];
        // SAFETY: as above.
        if let Err(e) = unsafe { sys::madvise(addr, len, libc::MADV_DONTNEED) } {
            eprintln!("tierswap: releasing staged pages at {addr:#x} failed: {e}");
        }
        1
    }

    /// Evicts the locked, clean staged pages of the block at `start` (`clean[k]` for page
    /// `start + k`): their kept slot still holds exactly their bytes (a write would have
    /// faulted and dropped it first), so eviction is dropping the page and pointing the pte
    /// back at the slot. No compression, no IO.
    fn evict_clean(&mut self, r: &RegionInner, start: usize, clean: &[bool; BLOCK_PAGES]) -> usize {
        let mut evicted = 0;
        for (k, _) in clean.iter().enumerate().filter(|(_, &c)| c) {
            let i = start + k;
            let old = r.ptes.load(i);
            match old.kept_slot() {
                Some(slot) => {
                    // Dropped from the mirror with the block's other pages in [`Reclaim::release`].
                    self.pending.push_range(r.mirror_addr(i), PAGE_SIZE);
                    self.pending.pages.push((i, slot));
                    self.s.tiers.swap.restamp(slot);
                    evicted += 1;
                }
                None => r.ptes.unlock(i, old, old),
            }
        }
        self.s.counters.swpout_clean.fetch_add(evicted as u64, Ordering::Relaxed);
        evicted
    }

    /// Whether a clean page's kept slot can stand for it: its copy is in memory or on the
    /// file, or on a remote that has not failed since its last batch written.
    fn kept_copy_reachable(&self, slot: u64) -> bool {
        self.s.tiers.swap.load(slot).tag() != Tag::Remote || self.s.tiers.remote.as_ref().is_some_and(|r| r.healthy())
    }

    fn place(&self, slot: u64, e: SwapEntry) {
        let old = self.s.tiers.swap.lock(slot);
        self.s.tiers.swap.unlock(slot, old, e);
    }

    /// Classifies and stores one page.
    fn store_page(&mut self, page: &[u8], slot: u64) -> Stored {
        let s = &self.s;
        let tiers = s.config.tiers;
        if tiers.zero {
            if let Some(p) = same_filled_pattern(page) {
                if p == 0 {
                    s.counters.swpout_zero.fetch_add(1, Ordering::Relaxed);
                    return Stored::Entry(SwapEntry::zero());
                }
                if let Some(e) = SwapEntry::same_filled(p) {
                    s.counters.swpout_samefill.fetch_add(1, Ordering::Relaxed);
                    return Stored::Entry(e);
                }
            }
        }
        let limit = if tiers.pool { INCOMPRESSIBLE_LIMIT } else { PAGE_SIZE - 64 };
        let clen = compress(s.config.compressor, page, &mut self.compressed, limit);
        match clen {
            Some(len) if tiers.pool => match s.tiers.pool.store(&self.compressed[..len]) {
                Ok(h) => {
                    s.counters.zswpout.fetch_add(1, Ordering::Relaxed);
                    let e = SwapEntry::pool(h.raw(), len);
                    crate::mm::slots::count_recompressible(s, e, true);
                    Stored::Entry(e)
                }
                Err(_) => self.store_in_file_or_raw(page, slot, Some(len)),
            },
            Some(len) => self.store_in_file_or_raw(page, slot, Some(len)),
            None => {
                s.counters.pool_reject_incompressible.fetch_add(1, Ordering::Relaxed);
                self.store_in_file_or_raw(page, slot, None)
            }
        }
    }

    /// Puts a page in the file unit being filled (compressed if `clen`), or keeps it raw in
    /// the pool when there is no file tier.
    fn store_in_file_or_raw(&mut self, page: &[u8], slot: u64, clen: Option<usize>) -> Stored {
        if self.s.tiers.file_off.load(Ordering::Acquire) {
            return self.store_raw(page);
        }
        if let Some(w) = self.writer.as_mut() {
            let payload: &[u8] = match clen {
                Some(len) => &self.compressed[..len],
                None => page,
            };
            if let Some(off) = w.push(slot, payload) {
                return Stored::ToFile(off, payload.len());
            }
            if w.records() > 0 {
                return Stored::UnitFull;
            }
        }
        self.store_raw(page)
    }

    fn store_raw(&self, page: &[u8]) -> Stored {
        match self.s.tiers.pool.store(page) {
            Ok(h) => {
                self.s.counters.pool_stored_raw.fetch_add(1, Ordering::Relaxed);
                Stored::Entry(SwapEntry::pool(h.raw(), PAGE_SIZE))
            }
            Err(_) => Stored::Keep,
        }
    }

    /// Writes the pending file records of a block and places their entries; on a write
    /// error the pages go to the pool raw instead (never dropped), or stay staged.
    fn flush_file_pending(
        &mut self,
        r: &RegionInner,
        pages: &[usize],
        slots: &[u64],
        pending: &mut Vec<(usize, u64, usize)>,
        placed: &mut [bool],
    ) {
        let (Some(file), Some(w)) = (self.s.tiers.file.as_ref(), self.writer.as_mut()) else {
            return;
        };
        if pending.is_empty() {
            return;
        }
        let gate = self.s.tiers.file_gate.read().unwrap_or_else(|e| e.into_inner());
        let res = if self.s.tiers.file_off.load(Ordering::Acquire) {
            Err(crate::backend::file::FileError::Off)
        } else {
            file.write_unit(w)
        };
        drop(gate);
        let io_bytes = w.io_bytes() as u64;
        w.clear();
        match res {
            Ok(base) => {
                self.s.counters.file_writes.fetch_add(1, Ordering::Relaxed);
                self.s.counters.file_io_bytes.fetch_add(io_bytes, Ordering::Relaxed);
                for &(k, off, len) in pending.iter() {
                    self.s.counters.pswpout.fetch_add(1, Ordering::Relaxed);
                    self.s.counters.file_write_bytes.fetch_add(len as u64, Ordering::Relaxed);
                    self.place(slots[k], SwapEntry::file(base + off, len));
                }
            }
            Err(e) => {
                let drained = matches!(e, crate::backend::file::FileError::Off);
                if !drained {
                    self.s.counters.writeback_errors.fetch_add(1, Ordering::Relaxed);
                }
                if !drained && !self.warned_write_error {
                    self.warned_write_error = true;
                    eprintln!("tierswap: {e}; keeping pages in memory instead (the footprint may exceed the budget)");
                }
                for &(k, _, _) in pending.iter() {
                    match self.store_raw(mirror_page(r, pages[k])) {
                        Stored::Entry(e) => self.place(slots[k], e),
                        _ => placed[k] = false,
                    }
                }
            }
        }
        pending.clear();
    }
}

/// What the window holds, for an internal-error message: each resident page's offset and
/// first word.
fn window_contents(window: usize, n: usize) -> String {
    let mut resident = [false; SPAN_BLOCKS * BLOCK_PAGES];
    sys::residency(window, &mut resident[..n]);
    let pages: Vec<String> = (0..n)
        .filter(|&k| resident[k])
        .map(|k| {
            // SAFETY: a resident page of our window (no fault), which only this reclaimer
            // uses; the read changes nothing.
            let w = unsafe { std::ptr::read_volatile((window + k * PAGE_SIZE) as *const u64) };
            format!("page {k}: {w:#x}")
        })
        .collect();
    pages.join(", ")
}

/// Pages a staging move took, from the residency after it failed with EEXIST having
/// counted `reported`: of the window's pages (`in_window`) and of the program pages they
/// came from (`in_program`, same offsets). The window's resident prefix counts when each of
/// its pages past the count stands for a program page that is gone (moved, not counted);
/// otherwise the count stands.
fn moved_by_run(reported: usize, in_window: &[bool], in_program: &[bool]) -> usize {
    let prefix = in_window.iter().take_while(|&&x| x).count();
    if prefix > reported && in_program[reported..prefix].iter().all(|&x| !x) {
        prefix
    } else {
        reported
    }
}

/// Where locked present page `idx` is after a move that did not take it: still in the
/// program's range (present), or nowhere (a hole the program made with MADV_DONTNEED, which
/// reads as zeros).
fn where_is(r: &RegionInner, idx: usize) -> PteState {
    if !is_mapped(r.page_addr(idx)) {
        // The program's range is gone (munmap) or moved (mremap): the page went with it or
        // away, and the event handler decides which. Leave the pte as it is.
        return PteState::Present;
    }
    if sys::is_resident(r.page_addr(idx)) {
        PteState::Present
    } else {
        PteState::None
    }
}

/// The count whose rise during a batch keeps reclaim going to its low watermark: faults
/// that waited for room (`throttle_headroom`), or faults at all.
fn pressure(s: &Shared) -> u64 {
    let c = &s.counters;
    if s.config.throttle_headroom { &c.throttled_faults } else { &c.faults }.load(Ordering::Relaxed)
}

/// Whether the page at `addr` is in some mapping (mincore fails with ENOMEM otherwise).
fn is_mapped(addr: usize) -> bool {
    let mut vec = 0u8;
    // SAFETY: mincore writes one byte for one page into `vec`; it only reads page tables.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, PAGE_SIZE, &mut vec) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOMEM)
}

/// The bytes of a locked staged page, in the mirror.
fn mirror_page(r: &RegionInner, idx_page: usize) -> &[u8] {
    // SAFETY: the caller holds the page's pte locked in the Staged state: its bytes sit in
    // the mirror, which only the pager touches, and nobody else reads or writes them while
    // the lock is held. The mirror lives as long as the region.
    unsafe { std::slice::from_raw_parts(r.mirror_addr(idx_page) as *const u8, PAGE_SIZE) }
}

enum Stored {
    /// Placed: the entry to store.
    Entry(SwapEntry),
    /// Queued in the file unit at this offset with this payload length.
    ToFile(usize, usize),
    /// The file unit is full: write it, then store the page again.
    UnitFull,
    /// Nothing can take the page now: it stays staged, in memory.
    Keep,
}

/// Blocks a direct reclaimer evicts per step (256 KiB) before it looks at the footprint again.
const DIRECT_BATCH_BLOCKS: usize = 4;

/// A fault thread's direct reclaim (`PagerConfig::direct_reclaim`): its own buffers, used
/// only to evict blocks already on the inactive list. Staging, the inactive list's size and
/// writeback stay with the reclaim thread.
pub(crate) struct DirectReclaim(Reclaim);

impl DirectReclaim {
    pub(crate) fn new(s: Arc<Shared>) -> std::io::Result<DirectReclaim> {
        Reclaim::new(s).map(DirectReclaim)
    }

    /// Evicts staged blocks until the footprint is at or under the budget, or the inactive
    /// list has nothing left to evict. Returns pages evicted.
    pub(crate) fn run(&mut self) -> usize {
        let r = &mut self.0;
        let mut total = 0;
        while r.s.footprint_bytes() > r.s.budget() && !r.s.wake.shutdown.load(Ordering::Acquire) {
            let n = r.evict(DIRECT_BATCH_BLOCKS);
            if n == 0 {
                break;
            }
            total += n;
        }
        if total > 0 {
            r.s.counters.pgsteal_direct.fetch_add(total as u64, Ordering::Relaxed);
            r.notify_room();
        }
        total
    }
}

/// A reclaim helper's loop (signal mode, `PagerConfig::reclaims_by_helpers`): helper `index`
/// is pinned to the CPU fault thread `index` would be, sleeps until a fault waits for room,
/// then evicts like a fault thread's direct reclaim. The faulting thread waits in its
/// signal handler, so its CPU is free: the helper pinned there runs at once.
pub(crate) fn helper_thread(s: Arc<Shared>, index: usize) {
    if s.config.fault_pin {
        crate::sys::pin_to_cpu(index, "reclaim helper");
    }
    let mut d = match DirectReclaim::new(s.clone()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("tierswap: reclaim helper {index} stops: cannot map its buffers: {e}");
            return;
        }
    };
    loop {
        s.wake.helper_kick.wait(Duration::from_millis(100));
        if s.wake.shutdown.load(Ordering::Acquire) {
            return;
        }
        d.run();
    }
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
    use super::{inactive_target, moved_by_run};

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

    #[test]
    fn an_uncounted_move_is_taken_only_where_the_program_pages_are_gone() {
        let (t, f) = (true, false);
        // Counted 1, the window holds 3 and the program lost pages 1 and 2: 3 moved.
        assert_eq!(moved_by_run(1, &[t, t, t, f], &[f, f, f, t]), 3);
        // Counted 0 (EEXIST at the run's first page): the whole prefix is this run's.
        assert_eq!(moved_by_run(0, &[t, t, f, f], &[f, f, t, t]), 2);
        // Program page 1 is still there: window page 1 is not this run's.
        assert_eq!(moved_by_run(1, &[t, t, t, f], &[f, t, f, t]), 1);
        assert_eq!(moved_by_run(0, &[t, f], &[t, t]), 0);
        // Nothing past the count: the count stands.
        assert_eq!(moved_by_run(2, &[t, t, f], &[f, f, t]), 2);
        // A resident page after a gap is not part of the prefix.
        assert_eq!(moved_by_run(0, &[t, f, t], &[f, f, f]), 1);
    }
}
