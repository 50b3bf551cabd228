//! The pager: regions handed to the program, the userfaultfd they are registered with,
//! the fault threads and the reclaim thread that keep the footprint under the budget.
//!
//! Each region is mapped twice: the program's range, and a mirror of the same length that
//! only the pager touches (the staging area). Deactivating a page moves it, with
//! UFFDIO_MOVE, to the same offset in the mirror: one atomic page-table change, no copy; a
//! touch then faults and the page is moved back. UFFDIO_MOVE wants its destination
//! registered with the userfaultfd the ioctl goes through, so there are two: program ranges
//! on `uffd` (with REMOVE / UNMAP / REMAP events, see [`crate::events`]), mirrors on
//! `mirror_uffd` (no events: the pager's own MADV_DONTNEED of staged pages raises none).
//! Mirror → program moves go through `uffd`. Program → mirror moves go through `uffd` too,
//! into a small window of reclaim's registered there, then on through `mirror_uffd`: the
//! kernel refuses ioctls of `uffd` while one of its events is unread, and a move out of a
//! range the program has just unmapped would take whatever is mapped there now
//! (`reclaim.rs` `map_window`). [`Shared::guarded`] covers the time from an event's read
//! to the end of its handling.
//!
//! Program ranges are found by address in a [`RegionMap`]: live extents ordered by start
//! (the shim may create thousands of mappings; a partial munmap splits an extent).
//!
//! Lock order: a pte lock, then a swap entry lock. Reclaim only try-locks ptes, so it never
//! waits on a fault thread; writeback takes entry locks only.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::backend::file::FileTier;
use crate::backend::pool::Pool;
use crate::config::{ConfigError, FaultMode, Hint, PagerConfig};
use crate::forkgate::Busy;
use crate::page::{pages_for, pages_to_bytes, PAGE_SIZE};
use crate::pagetable::{PageTable, PteState};
use crate::policy::admission::Locality;
use crate::policy::readahead::Readahead;
use crate::stats::{Counters, Stats};
use crate::swap::{SwapSpace, Tag, DEFAULT_MAX_SLOTS};
use crate::sys;
use crate::uffd::{self, RegisterMode, Uffd};

/// What can go wrong creating or using a pager.
#[derive(Debug, Error)]
pub enum Error {
    /// The configuration cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// userfaultfd is missing, forbidden, or lacks a feature we need.
    #[error(transparent)]
    Uffd(#[from] crate::uffd::Error),
    /// A system call on our own memory or files failed.
    #[error("{what}: {source}")]
    Io {
        /// What we were doing.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A region of zero bytes, or larger than the address space allows.
    #[error("cannot create a region of {len_bytes} bytes: give a length between 1 byte and 64 TiB")]
    RegionSize {
        /// The length asked for.
        len_bytes: usize,
    },
    /// `adopt_grown` over memory that is managed already, or not page-aligned.
    #[error("cannot adopt {addr:#x}+{len_bytes}: give the page-aligned tail an mremap added to a managed mapping")]
    NotGrownTail {
        /// First byte asked for.
        addr: usize,
        /// Length asked for.
        len_bytes: usize,
    },
    /// An operation on a tier this pager was not configured with.
    #[error("this pager has no {0} tier (add it to the tiers)")]
    NoSuchTier(&'static str),
    /// The remote tier's cluster did not answer at start.
    #[error("cannot reach the remote tier {seeds}: {source} (start the cluster, or fix the seeds in --tiers remote=redis://HOST:PORT)")]
    Remote {
        /// The seeds tried.
        seeds: String,
        /// What failed.
        source: crate::backend::remote::RemoteError,
    },
}

/// The pager's `Result`.
pub type Result<T> = std::result::Result<T, Error>;

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// Largest region: 64 TiB.
const MAX_REGION_BYTES: usize = 64 << 40;
/// How long a new mapping waits for the event of the mapping the kernel had at its address
/// before (`Shared::claim_range`); fault threads read events between faults, so this is
/// reached only when none can read for that long.
const STALE_EXTENT_PATIENCE: Duration = Duration::from_secs(60);

/// What `Shared::claim_range` holds: a busy section (forkgate.rs) and the event lock.
type Claim<'a> = (Busy, std::sync::MutexGuard<'a, ()>);

/// One managed range and its mirror.
pub(crate) struct RegionInner {
    pub(crate) id: u64,
    /// First byte of the program's range.
    pub(crate) start: usize,
    /// First byte of the mirror (staging) range.
    pub(crate) mirror: usize,
    pub(crate) n_pages: usize,
    pub(crate) hint: Hint,
    pub(crate) ptes: PageTable,
    /// CLOCK hand, in 64 KiB blocks.
    pub(crate) clock_block: AtomicUsize,
    /// Set when the region is being torn down: reclaim leaves it alone.
    pub(crate) dead: AtomicBool,
    /// Read-held by each evictor (the reclaim thread, a direct reclaimer) while it changes
    /// the region, which the pte locks keep apart page by page; write-held by teardown and
    /// by the forced whole-region passes (`evict_all`, `stage_all`).
    pub(crate) reclaim_lock: RwLock<()>,
    /// The readahead window of disk faults in this region.
    pub(crate) ra: Readahead,
    /// Recent swap-in streams: the evidence for large swap-in.
    pub(crate) locality: Locality,
    /// The stride of lone faults, for stride prefetch.
    pub(crate) stride: Mutex<crate::policy::stride::Stride>,
    /// Where a first-touch fault would continue the last one's run (first-touch
    /// fault-around; `usize::MAX`: none yet).
    pub(crate) first_touch_next: AtomicUsize,
    /// First-touch fault-around's window, in pages (0: none yet).
    pub(crate) first_touch_window: AtomicUsize,
    /// Registered for write-protect faults: pages may come back clean, keeping their slot.
    pub(crate) clean_tracking: bool,
    /// Owned by the program (munmap tears it down), not by a [`Region`] handle.
    #[allow(dead_code)]
    pub(crate) detached: bool,
    /// Live extents of the program's range in the [`RegionMap`] (map lock held to change).
    pub(crate) extents: AtomicUsize,
    /// Torn down: its mirror is gone and nothing may touch it any more.
    pub(crate) gone: AtomicBool,
    /// Holds on this range besides the events in hand (`marked_in`): one for each piece
    /// an mremap displaced until it is settled, and one for good once its [`Region`] is
    /// dropped. While either says so ([`Shared::is_leaving`]), nothing is installed in the
    /// program's range and nothing is moved out of it.
    pub(crate) leaving: AtomicU32,
    /// The batch of events ([`Shared::event_batch`]) whose read marked this range leaving
    /// too, until that batch is handled; 0: none.
    pub(crate) marked_in: AtomicU64,
}

impl RegionInner {
    pub(crate) fn len_bytes(&self) -> usize {
        pages_to_bytes(self.n_pages)
    }

    pub(crate) fn page_addr(&self, idx_page: usize) -> usize {
        self.start + pages_to_bytes(idx_page)
    }

    pub(crate) fn mirror_addr(&self, idx_page: usize) -> usize {
        self.mirror + pages_to_bytes(idx_page)
    }
}

/// Where a faulting address is.
pub(crate) enum Lookup {
    /// In a region's program range, at this page.
    Region(Arc<RegionInner>, usize),
    /// Nowhere we manage (a region already gone).
    Unknown,
}

/// The live program ranges, by address and by region id.
///
/// An extent is a run of a region's program range that is still mapped: a region starts
/// as one extent; a partial munmap shrinks or splits it; a region whose last extent goes
/// is torn down. Extents never overlap, so the one holding an address is the last one
/// starting at or below it.
#[derive(Default)]
pub(crate) struct RegionMap {
    /// First byte → (end byte, region).
    extents: BTreeMap<usize, (usize, Arc<RegionInner>)>,
    pub(crate) by_id: HashMap<u64, Arc<RegionInner>>,
}

/// A piece of a region cut out of the map: pages `[lo, hi)` of `region`.
pub(crate) struct Piece {
    pub(crate) region: Arc<RegionInner>,
    pub(crate) lo: usize,
    pub(crate) hi: usize,
}

impl RegionMap {
    /// The regions with a live extent overlapping `[start, end)`, from the highest address
    /// down (a region once per extent). Allocates nothing: used while a fork may hold
    /// malloc's locks (`Shared::read_program_events`).
    pub(crate) fn regions_overlapping(&self, start: usize, end: usize) -> impl Iterator<Item = &RegionInner> {
        self.extents.range(..end).rev().take_while(move |(_, (e, _))| *e > start).map(|(_, (_, r))| &**r)
    }

    /// The region whose live extent holds `addr`.
    pub(crate) fn find(&self, addr: usize) -> Option<Arc<RegionInner>> {
        let (_, (end, r)) = self.extents.range(..=addr).next_back()?;
        (addr < *end).then(|| r.clone())
    }

    /// Adds a region as one extent covering its whole program range. The caller has made
    /// sure nothing overlaps it (`Shared::claim_range`, the REMAP handler's displacement):
    /// an overlap would hide one region behind the other, so it is reported.
    pub(crate) fn insert(&mut self, r: Arc<RegionInner>) {
        let (start, end) = (r.start, r.start + r.len_bytes());
        for p in self.overlapping(start, end) {
            eprintln!(
                "tierswap: internal error: the new region {} at {start:#x}..{end:#x} overlaps pages {}..{} of region {} in the map",
                r.id, p.lo, p.hi, p.region.id
            );
        }
        self.insert_extent(start, end, &r);
        self.by_id.insert(r.id, r);
    }

    fn insert_extent(&mut self, start: usize, end: usize, r: &Arc<RegionInner>) {
        r.extents.fetch_add(1, Ordering::Relaxed);
        self.extents.insert(start, (end, r.clone()));
    }

    /// Cuts `[start, end)` out of every extent it overlaps; returns the pieces cut, in
    /// address order, and drops regions left without an extent from `by_id` (the caller
    /// tears those down: `piece.region.extents` is 0).
    pub(crate) fn cut(&mut self, start: usize, end: usize) -> Vec<Piece> {
        let mut hit = Vec::new();
        for (&s, &(e, ref r)) in self.extents.range(..end).rev() {
            if e <= start {
                break;
            }
            hit.push((s, e, r.clone()));
        }
        hit.reverse();
        let mut pieces = Vec::with_capacity(hit.len());
        for (s, e, r) in hit {
            self.extents.remove(&s);
            r.extents.fetch_sub(1, Ordering::Relaxed);
            if s < start {
                self.insert_extent(s, start, &r);
            }
            if e > end {
                self.insert_extent(end, e, &r);
            }
            let (cs, ce) = (s.max(start), e.min(end));
            pieces.push(Piece { lo: (cs - r.start) / PAGE_SIZE, hi: (ce - r.start) / PAGE_SIZE, region: r.clone() });
            if r.extents.load(Ordering::Relaxed) == 0 {
                self.by_id.remove(&r.id);
            }
        }
        pieces
    }

    /// The pieces of live extents overlapping `[start, end)`, in address order (the map
    /// unchanged).
    pub(crate) fn overlapping(&self, start: usize, end: usize) -> Vec<Piece> {
        let mut pieces: Vec<Piece> = self
            .extents
            .range(..end)
            .rev()
            .take_while(|(_, (e, _))| *e > start)
            .map(|(&s, &(e, ref r))| Piece {
                lo: (s.max(start) - r.start) / PAGE_SIZE,
                hi: (e.min(end) - r.start) / PAGE_SIZE,
                region: r.clone(),
            })
            .collect();
        pieces.reverse();
        pieces
    }

    /// The live extents of region `id`, as (first byte, end byte).
    pub(crate) fn extents_of(&self, r: &RegionInner) -> Vec<(usize, usize)> {
        self.extents
            .range(r.start..r.start + r.len_bytes())
            .filter(|(_, (_, x))| x.id == r.id)
            .map(|(&s, &(e, _))| (s, e))
            .collect()
    }
}

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

/// The state every pager thread shares.
pub(crate) struct Shared {
    /// The program ranges' userfaultfd: faults and REMOVE / UNMAP / REMAP events.
    pub(crate) uffd: Uffd,
    /// The mirrors' userfaultfd: destination of program → mirror moves, no events.
    pub(crate) mirror_uffd: Uffd,
    /// Held while reading `uffd` and handling the events read (see [`crate::events`]).
    pub(crate) event_lock: Mutex<()>,
    /// Write-held while reading `uffd` and marking the regions its events concern;
    /// read-held by every change to a program range ([`Shared::guarded`]).
    pub(crate) install_gate: RwLock<()>,
    /// The batch of events in hand (read, not handled yet), from 1: a region its reads
    /// marked holds this number in `marked_in`, and handling the batch moves it on, which
    /// unmarks them all at once. Nothing to allocate or free: marks are made while a fork
    /// holds malloc's locks (forkgate.rs; a list of marked regions hung a fork that way).
    pub(crate) event_batch: AtomicU64,
    /// Old ranges of mremaps whose trailing UNMAP is still to come.
    pub(crate) remapped_from: crate::events::RemappedFrom,
    /// Stale extents a REMAP's new range displaced, until their own event comes.
    pub(crate) displaced: crate::events::Displaced,
    /// The last map changes and the events behind them, for a hang report.
    pub(crate) trail: crate::trail::Trail,
    pub(crate) config: PagerConfig,
    pub(crate) regions: RwLock<RegionMap>,
    pub(crate) swap: SwapSpace,
    pub(crate) pool: Pool,
    pub(crate) file: Option<FileTier>,
    /// The remote tier (pool writeback goes there first).
    pub(crate) remote: Option<crate::backend::remote::RemoteTier>,
    pub(crate) counters: Counters,
    pub(crate) present_pages: AtomicI64,
    pub(crate) staged_pages: AtomicI64,
    /// Engine metadata bytes, refreshed by reclaim (cheap to read on the fault path).
    pub(crate) metadata_bytes: AtomicU64,
    /// Staged 64 KiB blocks, oldest first: (region id, block index).
    pub(crate) inactive: Mutex<VecDeque<(u64, usize)>>,
    /// Reclaim's wake-up: set and notified by whoever wants reclaim to look now.
    pub(crate) kick: Kick,
    /// The pool limit in force (moved by the writeback thread, `PagerConfig::pool_adapt`).
    pub(crate) pool_share: crate::policy::pool_share::PoolShare,
    /// The reclaim helpers' wake-up (signal mode, `PagerConfig::reclaims_by_helpers`),
    /// kicked by a fault that waits for room.
    pub(crate) helper_kick: Kick,
    /// Reclaim helper threads started (0 but in signal mode with direct reclaim).
    pub(crate) helpers: usize,
    /// Fault threads waiting for the footprint to drop under the budget.
    pub(crate) room: (Mutex<u64>, Condvar),
    pub(crate) shutdown: AtomicBool,
    /// Reclaim is between passes with nothing to do.
    pub(crate) reclaim_idle: AtomicBool,
    /// Reclaim's last pass over budget found nothing to evict: faults stop waiting for room.
    pub(crate) reclaim_stuck: AtomicBool,
    pub(crate) next_region_id: AtomicU64,
    /// Written to stop the fault threads' poll.
    pub(crate) stop_fd: OwnedFd,
    /// Which fault threads poll the userfaultfd (`watch.rs`).
    pub(crate) watch: crate::watch::Watch,
    pub(crate) warned_over_budget: AtomicBool,
    /// Number of fault threads.
    pub(crate) fault_threads: usize,
    /// The writeback thread's wake-up.
    pub(crate) wb_kick: Kick,
    /// Reclaim asks for a writeback step below the pool limit (over budget, nothing else
    /// to evict).
    pub(crate) wb_wanted: AtomicBool,
    /// The last writeback step wrote nothing though the pool holds objects.
    pub(crate) wb_failing: AtomicBool,
    /// Pool objects recompression could still shrink (see [`crate::writeback::recompressible`]).
    pub(crate) pool_recompressible: AtomicU64,
    /// The file tier takes no new records (drained).
    pub(crate) file_off: AtomicBool,
    /// Writers of file units hold it shared (reclaim and writeback write at once); drain
    /// takes it exclusively to wait out the writes in flight.
    pub(crate) file_gate: RwLock<()>,
    /// A detached mapping was handed out: the threads live until the process exits.
    pub(crate) keepalive: AtomicBool,
    /// Signal mode: the buffers of faults served in the faulting threads, one per fault
    /// in progress at once (a thread finding all taken yields and tries again). Empty in
    /// thread mode.
    pub(crate) signal_scratch: Vec<Mutex<crate::fault::Scratch>>,
    /// Thread mode with a file tier: the fault threads' shared copy of file bytes read
    /// (a fault thread finding it taken uses its own).
    pub(crate) unit_cache: Option<Mutex<crate::backend::file::UnitCache>>,
    /// Fork messages read while a fork held the gate whose snapshot is not taken yet:
    /// faults served in the faulting threads wait (forkgate.rs).
    pub(crate) fork_hold: AtomicU32,
    /// Signal mode: the forking thread faulted while a fork snapshot is pending; the
    /// reader holding the fork's messages takes it now (forkgate.rs).
    pub(crate) forker_waiting: AtomicBool,
    /// Fault threads past their start (their last allocation outside a busy section).
    pub(crate) started: (Mutex<usize>, Condvar),
    /// Forked children served by this pager (child.rs).
    pub(crate) children: crate::child::Children,
}

/// Gives the calling background thread (`what`: reclaim, writeback) the configured nice
/// value; a refusal is said once and costs only the priority.
pub(crate) fn lower_priority(s: &Shared, what: &str) {
    let nice = s.config.background_nice;
    if s.config.background_idle {
        if let Err(e) = sys::set_thread_sched_idle() {
            eprintln!("tierswap: the {what} thread keeps its policy (SCHED_IDLE refused: {e})");
        }
    }
    if nice != 0 {
        if let Err(e) = sys::set_thread_nice(nice) {
            eprintln!("tierswap: the {what} thread keeps its priority (nice {nice} refused: {e})");
        }
    }
}

impl Shared {
    /// Wakes the threads waiting for a fault in `[addr, addr + len)` to be served. In
    /// signal mode nobody waits (a faulting thread serves itself), so it costs nothing.
    pub(crate) fn wake(&self, addr: usize, len: usize) {
        if self.config.fault_mode == FaultMode::Thread {
            let _ = self.uffd.wake(addr, len);
        }
    }

    /// A free signal-mode fault buffer ([`Shared::signal_scratch`]).
    pub(crate) fn signal_scratch(&self) -> std::sync::MutexGuard<'_, crate::fault::Scratch> {
        loop {
            for m in &self.signal_scratch {
                match m.try_lock() {
                    Ok(g) => return g,
                    Err(std::sync::TryLockError::Poisoned(p)) => return p.into_inner(),
                    Err(std::sync::TryLockError::WouldBlock) => {}
                }
            }
            std::thread::yield_now();
        }
    }

    /// The footprint: present + staged pages, pool spans, one file unit buffer, metadata.
    pub(crate) fn footprint_bytes(&self) -> u64 {
        let pages = self.present_pages.load(Ordering::Relaxed) + self.staged_pages.load(Ordering::Relaxed);
        pages.max(0) as u64 * PAGE_SIZE as u64 + self.pool.total_bytes() + self.fixed_bytes()
    }

    /// File buffers and metadata: the footprint's part no eviction or writeback moves.
    /// The buffers: reclaim's and writeback's write units (and each fault thread's, with
    /// direct reclaim), and the read copies of the fault threads (theirs and their shared
    /// one) and of the signal-mode fault buffers (counted whole, though a copy often holds a
    /// unit or less).
    fn fixed_bytes(&self) -> u64 {
        let unit = self.config.file_unit_bytes;
        let copies = self.fault_threads + self.signal_scratch.len() + self.unit_cache.is_some() as usize;
        let direct = if self.config.reclaims_directly() { self.fault_threads } else { self.helpers };
        let writers = 2 + direct;
        let file_buf = if self.file.is_some() {
            writers * unit + copies * crate::backend::file::UnitCache::bytes(unit)
        } else {
            0
        };
        file_buf as u64 + self.metadata_bytes.load(Ordering::Relaxed)
    }

    /// The part of the footprint evicting pages cannot shrink: the pool, the file buffers
    /// and metadata.
    pub(crate) fn footprint_floor(&self) -> u64 {
        // Pool bytes over its limit are a floor only when nothing below can take them: with
        // a writeback target they are on their way out, and faults should wait for that (a
        // remote store writes back slower than eviction fills the pool).
        let pool = self.pool.total_bytes();
        let pool = if self.writeback_target_up() { pool.min(self.pool_limit()) } else { pool };
        pool + self.fixed_bytes()
    }

    /// Whether pool writeback has somewhere to go, now or soon: a file tier that takes
    /// records, a remote tier that is up, or a remote retried after failed batches and
    /// still within its grace ([`crate::backend::remote::RemoteTier::retrying`]). While
    /// this holds, faults wait for room rather than go over the budget: the pool will
    /// shrink. A remote down for longer, with no file tier, leaves the pool as the last
    /// place for pages, and the program goes over budget rather than hang (reclaim warns).
    pub(crate) fn writeback_target_up(&self) -> bool {
        let file_up = self.file.is_some() && !self.file_off.load(Ordering::Relaxed);
        let remote_up = self.remote.as_ref().is_some_and(|r| !r.is_down());
        ((file_up || remote_up) && !self.wb_failing.load(Ordering::Relaxed))
            || self.remote.as_ref().is_some_and(|r| r.retrying())
    }

    /// Whether reclaim should hold off compressing pages into the pool: the pool is a
    /// quarter over its limit, the only tier below is the remote, and a writeback batch
    /// is on the wire. Its acknowledgement frees pool space; evicting meanwhile would
    /// only trade the program's pages for pool bytes until the pool fills the whole
    /// budget (every access then a fault). Faults wait for room meanwhile, so the
    /// footprint stays under the budget; the wait is one round trip. (The quarter lets
    /// reclaim compress while a batch is out: without it, usama_1g's swap-out took ~30 %
    /// longer than with no backpressure, with it ~12 %.)
    pub(crate) fn pool_backpressure(&self) -> bool {
        let max = self.pool_limit();
        self.file.is_none()
            && self.remote.as_ref().is_some_and(|r| r.batch_in_flight())
            && self.pool.total_bytes() > max + max / 4
    }

    pub(crate) fn budget(&self) -> u64 {
        self.config.budget_bytes
    }

    /// The pool limit in force (`PagerConfig::pool_max_bytes`, moved by `pool_adapt`).
    pub(crate) fn pool_limit(&self) -> u64 {
        self.pool_share.limit()
    }

    /// Pages the budget holds: a page refaulted within this many evictions of its own
    /// eviction would have stayed with a little more memory (workingset).
    pub(crate) fn workingset_pages(&self) -> u64 {
        self.budget() / PAGE_SIZE as u64
    }

    /// Reclaim starts above this…
    pub(crate) fn high_watermark(&self) -> u64 {
        self.budget() - self.budget() / 32
    }

    /// …and stops below this.
    pub(crate) fn low_watermark(&self) -> u64 {
        self.budget() - self.budget() / 12
    }

    /// Wakes the writeback thread; `wanted` asks for a step even under the pool limit.
    pub(crate) fn kick_writeback(&self, wanted: bool) {
        if wanted {
            self.wb_wanted.store(true, Ordering::Release);
        }
        self.wb_kick.kick();
    }

    pub(crate) fn kick_reclaim(&self) {
        self.kick.kick();
    }

    pub(crate) fn lookup(&self, addr: usize) -> Lookup {
        match self.regions.read().unwrap_or_else(|e| e.into_inner()).find(addr) {
            Some(r) => {
                let idx = (addr - r.start) / PAGE_SIZE;
                Lookup::Region(r, idx)
            }
            None => Lookup::Unknown,
        }
    }

    pub(crate) fn region_by_id(&self, id: u64) -> Option<Arc<RegionInner>> {
        self.regions.read().unwrap_or_else(|e| e.into_inner()).by_id.get(&id).cloned()
    }

    /// Called by each fault thread once it has started.
    pub(crate) fn fault_thread_started(&self) {
        let (m, cv) = &self.started;
        *m.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        cv.notify_all();
    }

    fn wait_fault_threads_started(&self, n: usize) {
        let (m, cv) = &self.started;
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        while *g < n {
            g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Waits until the userfaultfd events read so far are handled. The kernel lets the
    /// program's madvise / munmap / mremap return once its event is read, and the reader
    /// holds the event lock until it has handled it.
    pub(crate) fn sync_events(&self) {
        drop(self.event_lock.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Reads up to `max` messages from the program's userfaultfd, appending them to
    /// `events`, and marks the regions their REMOVE / UNMAP / REMAP events concern as
    /// leaving. The caller holds the event lock, and calls [`Shared::unmark_leaving`] once
    /// it has handled the events. `spinning`: polling without a sign of messages, so read
    /// nothing (Ok(0)) rather than wait for the gate: a writer waiting there would hold
    /// every install back.
    pub(crate) fn read_program_events(
        &self,
        events: &mut Vec<uffd::Event>,
        max: usize,
        spinning: bool,
    ) -> uffd::Result<usize> {
        let _gate = if spinning {
            match self.install_gate.try_write() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return Ok(0),
            }
        } else {
            self.install_gate.write().unwrap_or_else(|e| e.into_inner())
        };
        let before = events.len();
        let n = self.uffd.read_events(events, max)?;
        for ev in &events[before..] {
            use crate::trail::What;
            match *ev {
                uffd::Event::Remove { start, end } => self.trail.mark(What::Remove, start, end, 0, 0),
                uffd::Event::Unmap { start, end } => self.trail.mark(What::Unmap, start, end, 0, 0),
                uffd::Event::Remap { from, to, len } => self.trail.mark(What::Remap, from, from + len, to, 0),
                _ => {}
            }
            let ranges = match *ev {
                uffd::Event::Remove { start, end } | uffd::Event::Unmap { start, end } => [(start, end), (0, 0)],
                // The destination too: a stale extent there is left open (events.rs).
                uffd::Event::Remap { from, to, len } => [(from, from + len), (to, to + len)],
                _ => continue,
            };
            let map = self.regions.read().unwrap_or_else(|e| e.into_inner());
            for (a, b) in ranges.into_iter().filter(|(a, b)| a < b) {
                for r in map.regions_overlapping(a, b) {
                    self.mark_leaving(r);
                }
            }
        }
        Ok(n)
    }

    /// Marks `r` leaving until the events in hand are handled ([`Shared::unmark_leaving`]).
    /// A region an mremap creates is marked too: a later event of the same read may
    /// concern it, and the kernel has made that change already.
    pub(crate) fn mark_leaving(&self, r: &RegionInner) {
        r.marked_in.store(self.event_batch.load(Ordering::Acquire), Ordering::Release);
    }

    /// The events in hand are handled: their regions are no longer leaving.
    pub(crate) fn unmark_leaving(&self) {
        self.event_batch.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether nothing may be installed in `r`'s program range or moved out of it now: an
    /// event in hand concerns it, or it is being dropped (see [`Shared::guarded`]).
    pub(crate) fn is_leaving(&self, r: &RegionInner) -> bool {
        r.leaving.load(Ordering::Acquire) != 0
            || r.marked_in.load(Ordering::Acquire) == self.event_batch.load(Ordering::Acquire)
    }

    /// Runs `op`, a change to the program's range of `r` (an install, a move in or out),
    /// unless an event read but not handled yet concerns `r`: then it answers EAGAIN, as
    /// the kernel does while an event is unread, and the caller leaves its pages as they
    /// are. Once an UNMAP or REMAP is read, the kernel has already let go of the old range
    /// and may have handed the address to a new mapping (another thread's mmap, or a
    /// mapping an mremap put there): a change made before the event is handled would land
    /// in that mapping. A REMOVE is marked too, so nothing is installed between its read
    /// and the zap that follows it. Together with the kernel's EAGAIN for unread events
    /// (on ioctls of `uffd`, checked under the kernel's own lock), no change lands on an
    /// address the region no longer holds.
    pub(crate) fn guarded<T>(&self, r: &RegionInner, op: impl FnOnce() -> uffd::Result<T>) -> uffd::Result<T> {
        let _gate = self.install_gate.read().unwrap_or_else(|e| e.into_inner());
        if self.is_leaving(r) {
            return Err(uffd::Error::Again { op: "change to a leaving range", done_bytes: 0 });
        }
        op()
    }

    /// Whether `addr` is in a live extent of `r`.
    pub(crate) fn maps(&self, r: &RegionInner, addr: usize) -> bool {
        matches!(self.lookup(addr), Lookup::Region(x, _) if x.id == r.id)
    }

    /// Every live region (a snapshot).
    pub(crate) fn all_regions(&self) -> Vec<Arc<RegionInner>> {
        self.regions.read().unwrap_or_else(|e| e.into_inner()).by_id.values().cloned().collect()
    }

    /// Maps a program range and its mirror, registers both and enters the region in the map.
    pub(crate) fn map_region(&self, len_bytes: usize, hint: Hint, detached: bool) -> Result<Arc<RegionInner>> {
        if len_bytes == 0 || len_bytes > MAX_REGION_BYTES {
            return Err(Error::RegionSize { len_bytes });
        }
        let n_pages = pages_for(len_bytes);
        let len = pages_to_bytes(n_pages);
        let start = sys::mmap_reserve(len).map_err(io_err(format!("cannot map a region of {len} bytes")))?;
        let undo = |e: Error| {
            // SAFETY: the mapping is ours and unused.
            unsafe {
                let _ = sys::munmap(start, len);
            }
            e
        };
        // SAFETY: our fresh mapping; NOHUGEPAGE keeps it at 4 KiB pages (MOVE of a huge
        // page would split it anyway).
        let _ = unsafe { sys::madvise(start, len, libc::MADV_NOHUGEPAGE) };
        // Write-protect faults let pages come back clean (keeping their slot); a kernel
        // that refuses WP on this memory still gets everything else.
        let mut mode = RegisterMode { missing: true, wp: self.config.keep_clean, minor: false };
        if mode.wp && self.uffd.register(start, len, mode).is_err() {
            mode.wp = false;
        }
        if !mode.wp {
            self.uffd.register(start, len, mode).map_err(|e| undo(e.into()))?;
        }
        let r = self.new_region_at(start, n_pages, hint, mode, detached).map_err(|e| {
            let _ = self.uffd.unregister(start, len);
            undo(e)
        })?;
        let (_busy, _ev) = match self.claim_range(start, start + len, STALE_EXTENT_PATIENCE) {
            Ok(held) => held,
            Err(held) => {
                // No event came for the old mapping in all that time, yet the kernel gave
                // its address to us: it is gone. Let go of it as its UNMAP would.
                eprintln!(
                    "tierswap: the pager still had {:#x}+{len} from a mapping that is gone and no event came for it in {} s; dropping it (a late event could still cut the new mapping there)",
                    start,
                    STALE_EXTENT_PATIENCE.as_secs()
                );
                crate::events::forget(self, start, start + len);
                held
            }
        };
        self.enter_region(r.clone());
        Ok(r)
    }

    /// Enters region `r` in the map (the caller made sure nothing overlaps it).
    pub(crate) fn enter_region(&self, r: Arc<RegionInner>) {
        self.trail.mark(crate::trail::What::Enter, r.start, r.start + r.len_bytes(), 0, r.id);
        self.regions.write().unwrap_or_else(|e| e.into_inner()).insert(r);
    }

    /// Takes the event lock with no extent of the map overlapping `[start, end)`, for the
    /// caller to enter a region there; with a busy section (forkgate.rs), as the insert
    /// allocates under the lock. `Err` carries the same locks with the overlap still there
    /// after `patience`.
    ///
    /// The kernel hands out an address only once nothing is mapped there, but it queues the
    /// UNMAP or REMAP event of the mapping that was there only after letting go of it, and
    /// the program's munmap / mremap returns once a fault thread has *read* that event. So
    /// another thread can map the address again while the old region still holds it in our
    /// map: the event not read yet, or read and still being handled. Entering the new region
    /// then would let the old event cut it, and an mremap's swapped pages would follow the
    /// new, empty region (they read as zeros). An overlap here is such an event on its way:
    /// wait for it, holding nothing a fault thread needs.
    fn claim_range(&self, start: usize, end: usize, patience: Duration) -> std::result::Result<Claim<'_>, Claim<'_>> {
        let t0 = Instant::now();
        loop {
            let busy = crate::forkgate::enter();
            let ev = self.event_lock.lock().unwrap_or_else(|e| e.into_inner());
            let stale = !self.regions.read().unwrap_or_else(|e| e.into_inner()).overlapping(start, end).is_empty()
                || self.remapped_from.pending(start, end, Instant::now());
            if !stale {
                return Ok((busy, ev));
            }
            if t0.elapsed() >= patience {
                return Err((busy, ev));
            }
            drop(ev);
            drop(busy);
            self.counters.stale_extent_waits.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// A region over the program range at `start` (mapped and registered already), with a
    /// fresh mirror registered in the same `mode`. Not entered in the map.
    pub(crate) fn new_region_at(
        &self,
        start: usize,
        n_pages: usize,
        hint: Hint,
        mode: RegisterMode,
        detached: bool,
    ) -> Result<Arc<RegionInner>> {
        let len = pages_to_bytes(n_pages);
        let mirror = sys::mmap_reserve(len).map_err(io_err("cannot map the region's staging mirror"))?;
        let undo = |e: Error| {
            // SAFETY: the mirror is ours and unused.
            unsafe {
                let _ = sys::munmap(mirror, len);
            }
            e
        };
        // SAFETY: our fresh mapping: 4 KiB pages, and out of core dumps.
        unsafe {
            let _ = sys::madvise(mirror, len, libc::MADV_NOHUGEPAGE);
            let _ = sys::madvise(mirror, len, libc::MADV_DONTDUMP);
            // A forked child gets its staged pages copied at the fork event instead:
            // shared mirror pages would make every UFFDIO_MOVE of them fail (EBUSY).
            let _ = sys::madvise(mirror, len, libc::MADV_DONTFORK);
        }
        // The same mode as the program's range: UFFDIO_MOVE wants equal protections.
        self.mirror_uffd.register(mirror, len, mode).map_err(|e| undo(e.into()))?;
        let ptes = PageTable::new(n_pages).map_err(|e| {
            let _ = self.mirror_uffd.unregister(mirror, len);
            undo(io_err("cannot reserve the region's page table")(e))
        })?;
        Ok(Arc::new(RegionInner {
            id: self.next_region_id.fetch_add(1, Ordering::Relaxed),
            start,
            mirror,
            n_pages,
            hint,
            ptes,
            clock_block: AtomicUsize::new(0),
            dead: AtomicBool::new(false),
            reclaim_lock: RwLock::new(()),
            ra: Readahead::default(),
            locality: Locality::default(),
            stride: Mutex::new(crate::policy::stride::Stride::default()),
            first_touch_next: AtomicUsize::new(usize::MAX),
            first_touch_window: AtomicUsize::new(0),
            clean_tracking: mode.wp,
            detached,
            extents: AtomicUsize::new(0),
            gone: AtomicBool::new(false),
            leaving: AtomicU32::new(0),
            marked_in: AtomicU64::new(0),
        }))
    }

    /// Recomputes the metadata gauge (reclaim calls this now and then).
    pub(crate) fn refresh_metadata(&self) -> MetadataBreakdown {
        let pte_bytes: u64 = self
            .regions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .values()
            .map(|r| (r.ptes.chunks_in_use() * PAGE_SIZE) as u64)
            .sum();
        let m = MetadataBreakdown {
            pte_bytes,
            swap_table_bytes: self.swap.table_bytes(),
            cluster_header_bytes: self.swap.header_bytes(),
            allocator_bytes: self.swap.allocator_bytes(),
            pool_header_bytes: self.pool.metadata_bytes(),
            file_index_bytes: self.file.as_ref().map_or(0, |f| f.metadata_bytes()),
        };
        self.metadata_bytes.store(m.total(), Ordering::Relaxed);
        m
    }
}

/// Engine metadata by kind, in bytes.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct MetadataBreakdown {
    /// Pte chunks in use (8 B per page of regions' touched 2 MiB ranges).
    pub pte_bytes: u64,
    /// Swap table pages of clusters in use (8 B per slot).
    pub swap_table_bytes: u64,
    /// Cluster headers.
    pub cluster_header_bytes: u64,
    /// Allocator lists.
    pub allocator_bytes: u64,
    /// Pool span headers and class tables.
    pub pool_header_bytes: u64,
    /// File unit index.
    pub file_index_bytes: u64,
}

impl MetadataBreakdown {
    /// Everything.
    pub fn total(&self) -> u64 {
        self.pte_bytes
            + self.swap_table_bytes
            + self.cluster_header_bytes
            + self.allocator_bytes
            + self.pool_header_bytes
            + self.file_index_bytes
    }
}

/// Owns the threads; dropped when the pager and its last region are gone.
struct Threads {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    /// Signal mode: the pager's place in the SIGBUS handler's table.
    signal_place: Option<usize>,
}

impl Drop for Threads {
    fn drop(&mut self) {
        // Forked children get every page they still need from us while we can serve it.
        crate::child::hand_over(&self.shared);
        if let Some(place) = self.signal_place.take() {
            crate::sigbus::unregister(place);
        }
        self.shared.shutdown.store(true, Ordering::SeqCst);
        sys::eventfd_ring(self.shared.stop_fd.as_fd());
        self.shared.kick_reclaim();
        self.shared.kick_writeback(false);
        {
            let (_, cv) = &self.shared.room;
            cv.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
        crate::child::close(&self.shared);
    }
}

/// A storage tier that can be drained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Tier {
    /// The swap file.
    File,
}

/// What a [`Pager::drain`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DrainReport {
    /// Pages moved off the tier.
    pub moved: u64,
    /// Pages whose record could not be read (left in place; their next touch gets SIGBUS).
    pub unreadable: u64,
    /// Pages left on the tier (unreadable, or nowhere to put them).
    pub left: u64,
    /// The file's size afterwards, bytes.
    pub file_len_bytes: u64,
}

/// A tierswap pager. See the crate documentation.
pub struct Pager {
    shared: Arc<Shared>,
    threads: Arc<Threads>,
}

/// Memory managed by a [`Pager`]: use it like any other memory; dropping it frees every
/// page and slot it holds.
pub struct Region {
    inner: Arc<RegionInner>,
    shared: Arc<Shared>,
    _threads: Arc<Threads>,
}

impl Pager {
    /// Starts a pager: opens the userfaultfd, starts the fault and reclaim threads.
    pub fn new(config: PagerConfig) -> Result<Pager> {
        config.validate()?;
        let signal = config.fault_mode == FaultMode::Signal;
        let sigbus_feature = if signal { uffd::features::SIGBUS } else { 0 };
        let uffd = Uffd::new(crate::events::PROGRAM_FEATURES | sigbus_feature, true)?;
        let mirror_uffd = Uffd::new(uffd::features::MOVE, true)?;
        let children = crate::child::Children::new(&uffd, signal)
            .map_err(io_err("cannot set up the service of forked children"))?;
        let pool = Pool::new((config.budget_bytes as usize).saturating_mul(8).max(4 << 30))
            .map_err(io_err("cannot reserve address space for the compressed pool"))?;
        let file = if config.tiers.file {
            let dir = config.swap_dir();
            let f = FileTier::create(&dir, config.file_unit_bytes, config.encrypt).map_err(io_err(format!(
                "cannot create the swap file in {} (give --swap-dir a writable directory on a real filesystem, or leave out the file tier)",
                dir.display()
            )))?;
            f.set_read_next_unit(config.file_read_next_unit);
            Some(f)
        } else {
            None
        };
        let remote = match &config.remote {
            Some(rc) => Some(
                crate::backend::remote::RemoteTier::connect(rc)
                    .map_err(|source| Error::Remote { seeds: rc.seeds.join(","), source })?,
            ),
            None => None,
        };
        let n_fault = if config.fault_threads == 0 { sys::online_cpus() } else { config.fault_threads };
        let n_helpers = if config.reclaims_by_helpers() { n_fault } else { 0 };
        let pool_share = crate::policy::pool_share::PoolShare::new(
            config.pool_max_bytes(),
            config.pool_limit_top(),
            config.budget_bytes,
        );
        let mut signal_scratch = Vec::new();
        if signal {
            // Two faults in progress per CPU before a third waits for a buffer.
            for _ in 0..(2 * sys::online_cpus()).max(4) {
                let mut b = crate::fault::Scratch::new(config.file_unit_bytes, config.swapin_max_pages)
                    .map_err(io_err("cannot map the signal-mode fault buffers"))?;
                b.in_thread = true;
                signal_scratch.push(Mutex::new(b));
            }
        }
        let unit_cache = if !signal && file.is_some() {
            let c = crate::backend::file::UnitCache::new(config.file_unit_bytes)
                .map_err(io_err("cannot map the fault threads' file read buffer"))?;
            Some(Mutex::new(c))
        } else {
            None
        };
        let swap =
            SwapSpace::new(DEFAULT_MAX_SLOTS, 1).map_err(io_err("cannot reserve address space for the swap table"))?;
        let stop_fd = sys::eventfd().map_err(|source| Error::Io { what: "eventfd".into(), source })?;
        let watch = crate::watch::Watch::new(n_fault, config.fault_follow && config.fault_pin)
            .map_err(io_err("cannot make the fault threads' eventfds"))?;
        let shared = Arc::new(Shared {
            uffd,
            mirror_uffd,
            event_lock: Mutex::new(()),
            install_gate: RwLock::new(()),
            event_batch: AtomicU64::new(1),
            remapped_from: Default::default(),
            displaced: Default::default(),
            trail: Default::default(),
            config,
            regions: RwLock::new(RegionMap::default()),
            swap,
            pool,
            file,
            remote,
            counters: Counters::default(),
            present_pages: AtomicI64::new(0),
            staged_pages: AtomicI64::new(0),
            metadata_bytes: AtomicU64::new(0),
            inactive: Mutex::new(VecDeque::new()),
            kick: Kick::default(),
            helper_kick: Kick::default(),
            pool_share,
            helpers: n_helpers,
            room: (Mutex::new(0), Condvar::new()),
            shutdown: AtomicBool::new(false),
            reclaim_idle: AtomicBool::new(true),
            reclaim_stuck: AtomicBool::new(false),
            next_region_id: AtomicU64::new(1),
            stop_fd,
            watch,
            warned_over_budget: AtomicBool::new(false),
            fault_threads: n_fault,
            wb_kick: Kick::default(),
            wb_wanted: AtomicBool::new(false),
            wb_failing: AtomicBool::new(false),
            pool_recompressible: AtomicU64::new(0),
            file_off: AtomicBool::new(false),
            file_gate: RwLock::new(()),
            keepalive: AtomicBool::new(false),
            signal_scratch,
            unit_cache,
            fork_hold: AtomicU32::new(0),
            forker_waiting: AtomicBool::new(false),
            started: (Mutex::new(0), Condvar::new()),
            children,
        });
        crate::child::note_pager(&shared);
        shared.refresh_metadata();
        let mut handles = Vec::new();
        for i in 0..n_fault {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("tierswap-fault{i}"))
                .spawn(move || guarded("a fault thread", || crate::fault::fault_thread(s, i)))
                .map_err(io_err("cannot start a fault thread"))?;
            handles.push(h);
        }
        // A fork's message must find a fault thread that can read it: one still starting
        // could be blocked in malloc behind the forking thread (forkgate.rs).
        crate::forkgate::install();
        shared.wait_fault_threads_started(n_fault);
        let s = shared.clone();
        handles.push(
            std::thread::Builder::new()
                .name("tierswap-reclaim".into())
                .spawn(move || guarded("the reclaim thread", || crate::reclaim::reclaim_thread(s)))
                .map_err(io_err("cannot start the reclaim thread"))?,
        );
        if shared.file.is_some() || shared.remote.is_some() {
            let s = shared.clone();
            handles.push(
                std::thread::Builder::new()
                    .name("tierswap-writeback".into())
                    .spawn(move || guarded("the writeback thread", || crate::writeback::writeback_thread(s)))
                    .map_err(io_err("cannot start the writeback thread"))?,
            );
        }
        for i in 0..shared.helpers {
            let s = shared.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("tierswap-direct{i}"))
                    .spawn(move || guarded("a reclaim helper", || crate::reclaim::helper_thread(s, i)))
                    .map_err(io_err("cannot start a reclaim helper"))?,
            );
        }
        let mut threads = Threads { shared: shared.clone(), handles, signal_place: None };
        if signal {
            // From here on the program's faults raise SIGBUS and the handler serves them.
            threads.signal_place =
                Some(crate::sigbus::register(&shared).map_err(io_err("cannot install the SIGBUS handler"))?);
        }
        let threads = Arc::new(threads);
        Ok(Pager { shared, threads })
    }

    /// Maps `len_bytes` (rounded up to pages) of anonymous memory managed by this pager.
    pub fn region(&self, len_bytes: usize, hint: Hint) -> Result<Region> {
        let inner = self.shared.map_region(len_bytes, hint, false)?;
        Ok(Region { inner, shared: self.shared.clone(), _threads: self.threads.clone() })
    }

    /// Maps `len_bytes` (rounded up to pages) of managed memory that the *program* owns, as
    /// if it came from mmap: the program frees it with munmap, moves or resizes it with
    /// mremap and empties it with madvise(MADV_DONTNEED), and the pager follows (userfaultfd
    /// REMOVE / UNMAP / REMAP events, see [`crate::events`]). For the LD_PRELOAD shim.
    ///
    /// A pager that handed out a detached mapping keeps its threads until the process
    /// exits: the mapping's pages may be swapped out, and only they can bring them back.
    pub fn map_detached(&self, len_bytes: usize, hint: Hint) -> Result<*mut u8> {
        let inner = self.shared.map_region(len_bytes, hint, true)?;
        if !self.shared.keepalive.swap(true, Ordering::AcqRel) {
            std::mem::forget(self.threads.clone());
        }
        Ok(inner.start as *mut u8)
    }

    /// Takes over the tail `[addr, addr + len_bytes)` that an mremap added to a managed
    /// mapping. The kernel reports a move of the old length only, so until this call the
    /// tail is served with zero pages and never swapped (counted in `faults_unmanaged`).
    /// For the shim, after its mremap returned; `addr` = new start + old length.
    pub fn adopt_grown(&self, addr: usize, len_bytes: usize) -> Result<()> {
        let bad = Error::NotGrownTail { addr, len_bytes };
        if len_bytes == 0 || !addr.is_multiple_of(PAGE_SIZE) || !len_bytes.is_multiple_of(PAGE_SIZE) || addr < PAGE_SIZE
        {
            return Err(bad);
        }
        let s = &self.shared;
        // An extent there is either a mapping whose UNMAP / REMAP is on its way (wait it
        // out, see `claim_range`) or managed memory the caller got wrong.
        let Ok((_busy, _ev)) = s.claim_range(addr, addr + len_bytes, Duration::from_secs(2)) else {
            return Err(bad);
        };
        // The tail inherited the registration of the mapping in front of it.
        let (hint, wp) = match s.lookup(addr - PAGE_SIZE) {
            Lookup::Region(r, _) => (r.hint, r.clean_tracking),
            Lookup::Unknown => return Err(bad),
        };
        let mode = RegisterMode { missing: true, wp, minor: false };
        let r = s.new_region_at(addr, len_bytes / PAGE_SIZE, hint, mode, true)?;
        s.enter_region(r);
        Ok(())
    }

    /// What the pager knows of the address `addr`, for a hang report: the region map's
    /// extents within 1 MiB of it, the mapping (VMA) holding it, and the last region-map
    /// changes and program events that touched that span, oldest first. A program stuck
    /// faulting on an address it has mapped means the map lost its region: this says how.
    pub fn trail_near(&self, addr: usize) -> String {
        const RADIUS: usize = 1 << 20;
        let s = &self.shared;
        let mut out = format!("what the pager knows of {addr:#x}:\n");
        let pieces = s
            .regions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .overlapping(addr.saturating_sub(RADIUS), addr.saturating_add(RADIUS));
        for p in &pieces {
            out += &format!(
                "  map: region {} holds {:#x}..{:#x}{}\n",
                p.region.id,
                p.region.page_addr(p.lo),
                p.region.page_addr(p.hi),
                if s.is_leaving(&p.region) { " (leaving)" } else { "" }
            );
        }
        if pieces.is_empty() {
            out += "  map: no region within 1 MiB\n";
        }
        out += &match sys::vma_of(addr) {
            Some((a, b)) => format!("  mapping (VMA) {a:#x}..{b:#x}\n"),
            None => "  no mapping holds it\n".to_string(),
        };
        let marks = s.trail.near(addr, RADIUS);
        if marks.is_empty() {
            out += "  trail: nothing touched it in the last marks\n";
        }
        for m in marks {
            out += &format!("  {m}\n");
        }
        out
    }

    /// The managed mapping holding `addr`, as (first byte, length in bytes).
    pub fn mapping_of(&self, addr: usize) -> Option<(usize, usize)> {
        match self.shared.lookup(addr) {
            Lookup::Region(r, _) => Some((r.start, r.len_bytes())),
            _ => None,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &PagerConfig {
        &self.shared.config
    }

    /// Counters and gauges now, including what the program's own madvise / munmap /
    /// mremap calls that returned already did.
    pub fn stats(&self) -> Stats {
        self.shared.sync_events();
        stats_of(&self.shared)
    }

    /// Engine metadata now, by kind.
    pub fn metadata(&self) -> MetadataBreakdown {
        self.shared.sync_events();
        self.shared.refresh_metadata()
    }

    /// The footprint now: present + staged pages, pool spans, file write buffers, metadata.
    pub fn footprint_bytes(&self) -> u64 {
        let f = self.shared.footprint_bytes();
        self.shared.counters.note_footprint(f);
        f
    }

    /// Moves every page off `tier` without touching a pte (the virtual swap space's point:
    /// only the swap entries change), while the program keeps running; the tier then takes
    /// nothing new until [`Pager::resume`]. For the file tier ("swapoff"): each record goes
    /// into the pool still compressed, and the emptied file is truncated to zero. The pool
    /// grows by what the file held: within the budget where reclaim can make room, over it
    /// rather than losing a page.
    pub fn drain(&self, tier: Tier) -> Result<DrainReport> {
        match tier {
            Tier::File => {
                if self.shared.file.is_none() {
                    return Err(Error::NoSuchTier("file"));
                }
                Ok(crate::writeback::drain_file(&self.shared))
            }
        }
    }

    /// Lets a drained tier take pages again.
    pub fn resume(&self, tier: Tier) {
        match tier {
            Tier::File => self.shared.file_off.store(false, Ordering::Release),
        }
    }

    /// Evicts every page of every region now, on the calling thread, regardless of the
    /// budget (the lab's forced swap-out, tests). Pages touched meanwhile come back as usual.
    /// Returns pages evicted.
    pub fn evict_all(&self) -> usize {
        // A page the kernel is busy with (EAGAIN/EBUSY on the move) stays for this pass;
        // a few more passes catch it.
        let mut total = 0;
        for _ in 0..8 {
            let n = crate::reclaim::evict_everything(&self.shared);
            total += n;
            let left =
                self.shared.present_pages.load(Ordering::Relaxed) + self.shared.staged_pages.load(Ordering::Relaxed);
            if left <= 0 || n == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        total
    }

    /// The swap file, when the pager has a file tier: for tests that tamper with it behind
    /// the pager's back or check who may open it. Not a stable interface.
    #[doc(hidden)]
    pub fn swap_file(&self) -> Option<&std::fs::File> {
        self.shared.file.as_ref().map(|f| f.file())
    }

    /// Runs one pool writeback step on the calling thread now, regardless of the pool
    /// limit: the coldest clusters' pool objects go to the remote tier (or the file, as the
    /// writeback thread would), or are recompressed in the pool (see `crate::writeback`).
    /// Returns objects written or recompressed. For tests and the lab.
    #[doc(hidden)]
    pub fn writeback_now(&self) -> usize {
        match crate::writeback::Writeback::new(self.shared.clone()) {
            Ok(mut w) => w.writeback(8),
            Err(_) => 0,
        }
    }

    /// Keys the remote store holds for this pager now (SCAN), when it has a remote tier.
    /// For tests that check cleanup. Not a stable interface.
    #[doc(hidden)]
    pub fn remote_keys(&self) -> Option<std::result::Result<usize, crate::backend::remote::RemoteError>> {
        self.shared.remote.as_ref().map(|r| r.count_keys())
    }

    /// Moves every present page of every region to the inactive list (staging) now, without
    /// evicting any: the next touch of each moves it back. For tests of the inactive list
    /// and fault-around. Returns pages staged.
    #[doc(hidden)]
    pub fn stage_all(&self) -> usize {
        crate::reclaim::stage_everything(&self.shared)
    }

    /// Waits until reclaim has brought the footprint under the budget and stopped, or
    /// `timeout` passes; says whether it settled.
    pub fn settle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        self.shared.kick_reclaim();
        loop {
            let fp = self.footprint_bytes();
            if fp <= self.shared.budget() && self.shared.reclaim_idle.load(Ordering::Acquire) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Runs a pager thread; if it panics, the program's memory can no longer be served and
/// would hang on its next fault: abort loudly instead (DESIGN §6).
fn guarded(what: &str, body: impl FnOnce()) {
    crate::sys::block_signals();
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).is_err() {
        crate::fault::fatal(&format!("{what} panicked"));
    }
}

fn stats_of(s: &Shared) -> Stats {
    let metadata = s.refresh_metadata();
    let footprint = s.footprint_bytes();
    s.counters.note_footprint(footprint);
    Stats {
        counters: s.counters.snapshot(),
        budget: s.budget(),
        footprint,
        present_pages: s.present_pages.load(Ordering::Relaxed).max(0) as u64,
        staged_pages: s.staged_pages.load(Ordering::Relaxed).max(0) as u64,
        swap_slots: s.swap.slots_in_use(),
        swap_zero_pages: s.swap.count(Tag::Zero),
        swap_samefill_pages: s.swap.count(Tag::SameFilled),
        pool_stored_bytes: s.pool.stored_bytes(),
        pool_total_size: s.pool.total_bytes(),
        pool_limit: s.pool_limit(),
        pool_stored_pages: s.swap.count(Tag::Pool),
        file_pages: s.swap.count(Tag::File),
        file_blocks: s.file.as_ref().map_or(0, |f| f.blocks()),
        file_bytes: s.file.as_ref().map_or(0, |f| f.live_bytes()),
        metadata_bytes: metadata.total(),
        fault_latency_us: s.counters.latency_histogram(),
        remote_latency_us: s.counters.remote_latency_histogram(),
        remote_pages: s.swap.count(Tag::Remote),
    }
}

impl Region {
    /// The readahead window last decided for disk faults here, in pages (1: none).
    pub fn readahead_window(&self) -> u32 {
        self.inner.ra.window()
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.start as *mut u8
    }

    /// Length in bytes (a whole number of pages).
    pub fn len(&self) -> usize {
        self.inner.len_bytes()
    }

    /// Whether the region is empty (never: regions have at least one page).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The region's hint.
    pub fn hint(&self) -> Hint {
        self.inner.hint
    }

    /// Brings the pages of `[offset, offset + len)` in by touching each one from this
    /// thread, as writes when `write` (a read may map a shared zero page, which a system
    /// call writing into the buffer could not use in signal mode). In
    /// [`crate::FaultMode::Signal`], call it before handing the range to a system call: the
    /// kernel's own accesses to a swapped-out page fail with EFAULT there. Reclaim may
    /// evict the pages again later; a budget with room for the buffer keeps them in.
    ///
    /// # Panics
    /// If the range is not inside the region.
    pub fn prefault(&self, offset: usize, len: usize, write: bool) {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len()), "prefault past the region's end");
        if len == 0 {
            return;
        }
        let first = offset / PAGE_SIZE;
        let last = (offset + len - 1) / PAGE_SIZE;
        for pg in first..=last {
            // SAFETY: the byte is inside the mapping, which lives as long as `self`.
            let p = unsafe { self.as_ptr().add(pg * PAGE_SIZE) };
            if write {
                // SAFETY: `p` is valid and aligned for a u8.
                let b = unsafe { std::sync::atomic::AtomicU8::from_ptr(p) };
                // A compare-exchange of the byte with itself writes it without changing it,
                // so a concurrent writer loses nothing. (An OR of 0 would not do: the
                // compiler turns an idempotent atomic into a plain load.)
                let mut v = b.load(Ordering::Relaxed);
                while let Err(now) = b.compare_exchange_weak(v, v, Ordering::Relaxed, Ordering::Relaxed) {
                    v = now;
                }
            } else {
                // SAFETY: `p` is valid for a read.
                unsafe { std::ptr::read_volatile(p) };
            }
        }
    }

    /// The region as a read-only byte slice.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is ours, `len()` bytes long and lives as long as `self`; no
        // `&mut` slice can coexist with this borrow.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }

    /// The region as a byte slice.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is ours, `len()` bytes long and lives as long as `self`;
        // `&mut self` makes this the only slice handed out through the region.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len()) }
    }

    /// Where page `idx_page` is in the swap file, when it is swapped out to it: (slot, file
    /// offset of its record, payload bytes). For tests that tamper with the file; not a
    /// stable interface.
    #[doc(hidden)]
    pub fn file_record(&self, idx_page: usize) -> Option<(u64, u64, usize)> {
        if idx_page >= self.inner.n_pages {
            return None;
        }
        let pte = self.inner.ptes.load(idx_page);
        if pte.state() != PteState::Swapped {
            return None;
        }
        let slot = pte.payload();
        let e = self.shared.swap.load(slot);
        if e.tag() != Tag::File {
            return None;
        }
        let (offset, len) = e.addr_len();
        Some((slot, offset, len))
    }

    /// The pages of this region in each state: (present, staged, swapped).
    pub fn page_states(&self) -> (usize, usize, usize) {
        self.shared.sync_events();
        let (mut p, mut st, mut sw) = (0, 0, 0);
        for i in 0..self.inner.n_pages {
            match self.inner.ptes.load(i).state() {
                PteState::Present => p += 1,
                PteState::Staged => st += 1,
                PteState::Swapped => sw += 1,
                PteState::None => {}
            }
        }
        (p, st, sw)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let r = &self.inner;
        let s = &self.shared;
        // Under the event lock: no event handler is cutting this region meanwhile. Busy
        // (forkgate.rs): what follows allocates under it.
        let _busy = crate::forkgate::enter();
        let _ev = s.event_lock.lock().unwrap_or_else(|e| e.into_inner());
        let extents = {
            let mut map = s.regions.write().unwrap_or_else(|e| e.into_inner());
            let extents = map.extents_of(r);
            for &(a, b) in &extents {
                map.cut(a, b);
                s.trail.mark(crate::trail::What::Cut, a, b, 0, r.id);
            }
            extents
        };
        // A fault thread may be serving this range now (it found the region before the
        // cut): from here on nothing is installed in it or moved out of it, for good. An
        // install after the munmap would land in whatever the kernel maps there next, and
        // no event will mark the range leaving (it is unregistered first). Taking the gate
        // waits out any change already under way.
        {
            let _gate = s.install_gate.write().unwrap_or_else(|e| e.into_inner());
            r.leaving.fetch_add(1, Ordering::AcqRel);
        }
        // Reclaim may be staging pages of this range now (it locked them before the cut):
        // let it finish before the range goes. Reclaim skips a dead region from here on.
        r.dead.store(true, Ordering::SeqCst);
        drop(r.reclaim_lock.write().unwrap_or_else(|e| e.into_inner()));
        for (a, b) in extents {
            // Unregistered first, so the munmap raises no UNMAP event.
            let _ = s.uffd.unregister(a, b - a);
            // SAFETY: a live extent of the region's program range (not unmapped or moved
            // away by the program, which would have cut it from the map); the program gave
            // it up by dropping the Region.
            unsafe {
                let _ = sys::munmap(a, b - a);
            }
        }
        crate::events::teardown(s, r);
    }
}
