//! The memory manager's state: the regions handed to the program and their map, the
//! state every pager thread shares ([`Shared`], in named parts), and the operations on
//! them that every path needs — finding a page, installing under the event gates,
//! releasing slots, reading an entry back, tearing a region down.
//!
//! Owns: [`Shared`] and its parts; regions ([`region`]); how the map follows mremap
//! ([`changes`]); slot release ([`slots`]); reading a swapped page ([`swap_io`]); teardown
//! ([`teardown`]); which fault thread polls ([`watch`]); the forked children's state
//! ([`children`]).
//! Calls: the page table, the swap space, the backends, the policies, `uffd`, `sys`.
//! Nothing here starts a thread or serves a fault: the paths above (fault, reclaim,
//! writeback, events) do, over this state.
//!
//! Each region is mapped twice: the program's range, and a mirror of the same length that
//! only the pager touches (the staging area). Deactivating a page moves it, with
//! UFFDIO_MOVE, to the same offset in the mirror: one atomic page-table change, no copy; a
//! touch then faults and the page is moved back. UFFDIO_MOVE wants its destination
//! registered with the userfaultfd the ioctl goes through, so there are two: program ranges
//! on `uffd` (with REMOVE / UNMAP / REMAP / FORK events, see `events`), mirrors on
//! `mirror_uffd` (no events: the pager's own MADV_DONTNEED of staged pages raises none).
//! Mirror → program moves go through `uffd`. Program → mirror moves go through `uffd` too,
//! into a small window of reclaim's registered there, then on through `mirror_uffd`: the
//! kernel refuses ioctls of `uffd` while one of its events is unread, and a move out of a
//! range the program has just unmapped would take whatever is mapped there now
//! (reclaim's staging window). [`Shared::guarded`] covers the time from an event's read
//! to the end of its handling.
//!
//! Program ranges are found by address in a [`RegionMap`]: live extents ordered by start
//! (the shim may create thousands of mappings; a partial munmap splits an extent).

pub(crate) mod changes;
pub(crate) mod children;
pub(crate) mod error;
pub(crate) mod mapping;
pub(crate) mod protect;
pub(crate) mod region;
pub(crate) mod slots;
pub(crate) mod swap_io;
pub(crate) mod teardown;
pub(crate) mod watch;

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use crate::backend::file::{FileTier, UnitCache};
use crate::backend::pool::Pool;
use crate::config::{FaultMode, PagerConfig};
use crate::page::PAGE_SIZE;
use crate::policy::pool_share::PoolShare;
use crate::stats::Counters;
use crate::swap::{SwapSpace, DEFAULT_MAX_SLOTS};
use crate::sync::Kick;
use crate::sys;
use crate::uffd::{self, Uffd};
use error::io_err;

// Every slot id fits a swapped pte beside its eviction stamp.
const _: () = assert!(DEFAULT_MAX_SLOTS <= 1 << crate::pagetable::Pte::SLOT_BITS);

pub(crate) use changes::{Displaced, RemappedFrom};
pub(crate) use children::Children;
pub use error::{Error, Result};
pub(crate) use region::{Lookup, Piece, RegionInner, RegionMap};
pub(crate) use watch::Watch;
/// The state every pager thread shares, in parts that each say what guards them.
///
/// Lock order (docs/design.md, Lock order): a pte lock before a swap entry lock, ptes in
/// page order; a region's reclaim lock before its pte locks; the fork gate before the event
/// lock, the event lock before the install gate; installs run `guarded` (the install gate
/// read) under their pte locks; the inactive list, the room condvar and the tiers' own
/// locks are leaves. Reclaim only try-locks ptes, so it never waits on a fault thread;
/// writeback takes entry locks only.
pub(crate) struct Shared {
    /// The program ranges' userfaultfd: faults and REMOVE / UNMAP / REMAP / FORK events.
    pub(crate) uffd: Uffd,
    /// The mirrors' userfaultfd: destination of program → mirror moves, no events.
    pub(crate) mirror_uffd: Uffd,
    /// Read-only after start.
    pub(crate) config: PagerConfig,
    /// Lock-free event counters.
    pub(crate) counters: Counters,
    /// The last map changes and the events behind them, for a hang report (its own lock).
    pub(crate) trail: crate::trail::Trail,
    /// The program's regions and how the map follows the program's own changes.
    pub(crate) regions: Regions,
    /// The order of events against installs.
    pub(crate) gates: Gates,
    /// Where swapped pages' bytes live.
    pub(crate) tiers: Tiers,
    /// What the footprint is made of, and the inactive list.
    pub(crate) acct: Accounting,
    /// The threads' wake-ups and life.
    pub(crate) wake: Wakeups,
    /// Forks in progress and the children served.
    pub(crate) fork: ForkState,
    /// Fault threads (fixed at start).
    pub(crate) fault_threads: usize,
    /// Reclaim helper threads started (0 but in signal mode with direct reclaim; fixed).
    pub(crate) helpers: usize,
    /// Signal mode: fault buffers for faults served in the faulting threads (fixed; the
    /// buffers are the signal server's, fault/signal.rs). 0 in thread mode.
    pub(crate) signal_buffers: usize,
    /// A detached mapping was handed out: the threads live until the process exits.
    pub(crate) keepalive: AtomicBool,
    /// This pager's row in its process tree's ledger, when it shares a tree's budget
    /// (atomics in shared memory; the refresh takes its own try-lock, a leaf).
    pub(crate) tree: Option<crate::tree::Member>,
    /// Whether writes follow the pages read back clean (atomics).
    pub(crate) writes: crate::policy::writes::Writes,
}

/// The program's regions. The map is behind its RwLock (read by every lookup, written
/// when a region enters or an extent is cut); the rest have their own locks.
pub(crate) struct Regions {
    /// Live extents by address and regions by id.
    pub(crate) map: RwLock<RegionMap>,
    /// The next region's id (atomic).
    pub(crate) next_id: AtomicU64,
    /// Old ranges of mremaps whose trailing UNMAP is still to come (its own mutex).
    pub(crate) remapped_from: RemappedFrom,
    /// Stale extents a REMAP's new range displaced, until their own event comes (its own
    /// mutex).
    pub(crate) displaced: Displaced,
}

/// The order of the program's events against the pager's installs (events/mod.rs, the
/// ordering rules).
pub(crate) struct Gates {
    /// Held while reading `uffd` and handling the events read: events are handled one
    /// reader at a time, in queue order.
    pub(crate) event_lock: Mutex<()>,
    /// Write-held while reading `uffd` and marking the regions its events concern;
    /// read-held by every change to a program range ([`Shared::guarded`]).
    pub(crate) install_gate: RwLock<()>,
    /// The batch of events in hand (read, not handled yet), from 1: a region its reads
    /// marked holds this number in `marked_in`, and handling the batch moves it on, which
    /// unmarks them all at once. Atomic; written under `install_gate` held for writing.
    /// Nothing to allocate or free: marks are made while a fork holds malloc's locks
    /// (forkgate.rs; a list of marked regions hung a fork that way).
    pub(crate) event_batch: AtomicU64,
}

/// The tiers. Each backend locks itself; a slot's entry lock (swap/) guards the bytes it
/// points at.
pub(crate) struct Tiers {
    /// The virtual swap space: one entry per slot, locked one by one.
    pub(crate) swap: SwapSpace,
    /// The compressed pool.
    pub(crate) pool: Pool,
    /// The disk file.
    pub(crate) file: Option<FileTier>,
    /// The remote tier (pool writeback goes there first).
    pub(crate) remote: Option<crate::backend::remote::RemoteTier>,
    /// The pool limit in force (moved by the writeback thread, `PagerConfig::pool_adapt`;
    /// atomics).
    pub(crate) pool_share: crate::policy::pool_share::PoolShare,
    /// Pool objects recompression could still shrink (see [`slots::recompressible`]).
    pub(crate) pool_recompressible: AtomicU64,
    /// The file tier takes no new records (drained).
    pub(crate) file_off: AtomicBool,
    /// Writers of file units hold it shared (reclaim and writeback write at once); drain
    /// takes it exclusively to wait out the writes in flight.
    pub(crate) file_gate: RwLock<()>,
    /// Thread mode with a file tier: the fault threads' shared copy of file bytes read
    /// (a fault thread finding it taken uses its own).
    pub(crate) unit_cache: Option<Mutex<crate::backend::file::UnitCache>>,
}

/// Signal mode's fault buffers: two faults in progress per CPU before a third waits for
/// one.
pub(crate) fn signal_buffers() -> usize {
    (2 * sys::online_cpus()).max(4)
}

impl Tiers {
    /// Opens the tiers `config` asks for: the swap space and the pool always, the file and
    /// the remote as configured.
    fn open(config: &PagerConfig) -> Result<Tiers> {
        let pool = Pool::new((config.budget_bytes as usize).saturating_mul(8).max(4 << 30))
            .map_err(io_err("cannot reserve address space for the compressed pool"))?;
        let file = if config.tiers.file {
            let dir = config.swap_dir();
            let f = FileTier::create(&dir, config.file_unit_bytes, config.encrypt).map_err(io_err(format!(
                "cannot create the swap file in {} (give --swap-dir a writable directory on a real filesystem, or leave out the file tier)",
                dir.display()
            )))?;
            f.set_read_next_unit(config.file_read_next_unit);
            f.set_whole_evidence(config.file_whole_evidence.clamp(1, 8) as u8);
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
        let unit_cache = if config.fault_mode == FaultMode::Thread && file.is_some() {
            let c = UnitCache::new(config.file_unit_bytes)
                .map_err(io_err("cannot map the fault threads' file read buffer"))?;
            Some(Mutex::new(c))
        } else {
            None
        };
        let swap =
            SwapSpace::new(DEFAULT_MAX_SLOTS, 1).map_err(io_err("cannot reserve address space for the swap table"))?;
        Ok(Tiers {
            swap,
            pool,
            file,
            remote,
            pool_share: PoolShare::new(
                config.pool_max_bytes(),
                config.pool_limit_floor(),
                config.pool_limit_top(),
                config.budget_bytes,
                config.pool_weigh,
            ),
            pool_recompressible: AtomicU64::new(0),
            file_off: AtomicBool::new(false),
            file_gate: RwLock::new(()),
            unit_cache,
        })
    }
}

/// The footprint's parts (atomics, read on the fault path without a lock) and the
/// inactive list.
pub(crate) struct Accounting {
    /// Pages mapped in the program's ranges.
    pub(crate) present_pages: AtomicI64,
    /// Pages in the mirrors (staged, on the inactive list).
    pub(crate) staged_pages: AtomicI64,
    /// Engine metadata bytes, refreshed by reclaim (cheap to read on the fault path).
    pub(crate) metadata_bytes: AtomicU64,
    /// The over-budget warning was given.
    pub(crate) warned_over_budget: AtomicBool,
    /// Staged 64 KiB blocks, oldest first: (region id, block index). Its own mutex, a
    /// leaf: nothing is locked while holding it.
    pub(crate) inactive: Mutex<VecDeque<(u64, usize)>>,
}

/// Wake-ups and the threads' life. Each `Kick` and condvar pair has its own mutex (a leaf).
pub(crate) struct Wakeups {
    /// Reclaim's wake-up: set and notified by whoever wants reclaim to look now.
    pub(crate) kick: Kick,
    /// The reclaim helpers' wake-up (signal mode, `PagerConfig::reclaims_by_helpers`),
    /// kicked by a fault that waits for room.
    pub(crate) helper_kick: Kick,
    /// The writeback thread's wake-up.
    pub(crate) wb_kick: Kick,
    /// Reclaim asks for a writeback step below the pool limit (over budget, nothing else
    /// to evict).
    pub(crate) wb_wanted: AtomicBool,
    /// The last writeback step wrote nothing though the pool holds objects.
    pub(crate) wb_failing: AtomicBool,
    /// Fault threads waiting for the footprint to drop under the budget: a generation
    /// count under the mutex, bumped by reclaim as it frees room.
    pub(crate) room: (Mutex<u64>, Condvar),
    /// Reclaim is between passes with nothing to do.
    pub(crate) reclaim_idle: AtomicBool,
    /// Reclaim's last pass over budget found nothing to evict: faults stop waiting for room.
    pub(crate) reclaim_stuck: AtomicBool,
    /// The pager is stopping: every thread ends.
    pub(crate) shutdown: AtomicBool,
    /// Written to stop the fault threads' poll.
    pub(crate) stop_fd: OwnedFd,
    /// Which fault threads poll the userfaultfd (mm/watch.rs; its own atomics).
    pub(crate) watch: Watch,
    /// Fault threads past their start (their last allocation outside a busy section),
    /// under the mutex.
    pub(crate) started: (Mutex<usize>, Condvar),
}

/// Forks (atomics; see forkgate.rs) and the children served (events/fork.rs).
pub(crate) struct ForkState {
    /// Fork messages read while a fork held the gate whose snapshot is not taken yet:
    /// faults served in the faulting threads wait.
    pub(crate) hold: AtomicU32,
    /// Signal mode: the forking thread faulted while a fork snapshot is pending; the
    /// reader holding the fork's messages takes it now.
    pub(crate) forker_waiting: AtomicBool,
    /// Forked children served by this pager.
    pub(crate) children: Children,
}

/// Features of the program ranges' userfaultfd.
/// THREAD_ID: a fault message names its thread, so a fault of the thread that is forking can
/// be told apart while a fork holds the gate (forkgate.rs).
pub(crate) const PROGRAM_FEATURES: u64 = uffd::features::MOVE
    | uffd::features::EVENT_REMOVE
    | uffd::features::EVENT_UNMAP
    | uffd::features::EVENT_REMAP
    | uffd::features::EVENT_FORK
    | uffd::features::THREAD_ID;

impl Shared {
    /// Opens what a pager's threads share: the two userfaultfds, the tiers, and every part
    /// in its starting state. Starts nothing.
    pub(crate) fn new(config: PagerConfig) -> Result<Shared> {
        let signal = config.fault_mode == FaultMode::Signal;
        let sigbus_feature = if signal { uffd::features::SIGBUS } else { 0 };
        let uffd = Uffd::new(PROGRAM_FEATURES | sigbus_feature, true)?;
        let mirror_uffd = Uffd::new(uffd::features::MOVE, true)?;
        let children = Children::new(&uffd, signal || config.tree.is_some())
            .map_err(io_err("cannot set up the service of forked children"))?;
        let fault_threads = if config.fault_threads == 0 { sys::online_cpus() } else { config.fault_threads };
        let helpers = if config.reclaims_by_helpers() { fault_threads } else { 0 };
        let tiers = Tiers::open(&config)?;
        let stop_fd = sys::eventfd().map_err(io_err("cannot make the fault threads' stop eventfd"))?;
        let watch = Watch::new(fault_threads, config.fault_follow && config.fault_pin)
            .map_err(io_err("cannot make the fault threads' eventfds"))?;
        // Said once per process image: forked children inherit that it was said (a server's
        // every worker would repeat it).
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let tree = config.tree.as_ref().and_then(|path| match crate::tree::Member::join(path, config.budget_bytes) {
            Ok(m) => Some(m),
            Err(_) if SAID.swap(true, std::sync::atomic::Ordering::Relaxed) => None,
            Err(e) => {
                eprintln!(
                    "tierswap: pid {} cannot share its tree's budget through {} ({e}); it keeps a budget of its own of {} MiB",
                    std::process::id(),
                    path.display(),
                    config.budget_bytes >> 20
                );
                None
            }
        });
        Ok(Shared {
            uffd,
            mirror_uffd,
            counters: Counters::default(),
            trail: Default::default(),
            regions: Regions {
                map: RwLock::new(RegionMap::default()),
                next_id: AtomicU64::new(1),
                remapped_from: Default::default(),
                displaced: Default::default(),
            },
            gates: Gates { event_lock: Mutex::new(()), install_gate: RwLock::new(()), event_batch: AtomicU64::new(1) },
            tiers,
            acct: Accounting {
                present_pages: AtomicI64::new(0),
                staged_pages: AtomicI64::new(0),
                metadata_bytes: AtomicU64::new(0),
                warned_over_budget: AtomicBool::new(false),
                inactive: Mutex::new(VecDeque::new()),
            },
            wake: Wakeups {
                kick: Kick::default(),
                helper_kick: Kick::default(),
                wb_kick: Kick::default(),
                wb_wanted: AtomicBool::new(false),
                wb_failing: AtomicBool::new(false),
                room: (Mutex::new(0), Condvar::new()),
                reclaim_idle: AtomicBool::new(true),
                reclaim_stuck: AtomicBool::new(false),
                shutdown: AtomicBool::new(false),
                stop_fd,
                watch,
                started: (Mutex::new(0), Condvar::new()),
            },
            fork: ForkState { hold: AtomicU32::new(0), forker_waiting: AtomicBool::new(false), children },
            fault_threads,
            helpers,
            signal_buffers: if signal { signal_buffers() } else { 0 },
            keepalive: AtomicBool::new(false),
            tree,
            writes: Default::default(),
            config,
        })
    }

    /// Wakes the threads waiting for a fault in `[addr, addr + len)` to be served. In
    /// signal mode nobody waits (a faulting thread serves itself), so it costs nothing.
    pub(crate) fn wake(&self, addr: usize, len: usize) {
        if self.config.fault_mode == FaultMode::Thread {
            let _ = self.uffd.wake(addr, len);
        }
    }

    /// The footprint: present + staged pages, pool spans, one file unit buffer, metadata.
    pub(crate) fn footprint_bytes(&self) -> u64 {
        let pages = self.acct.present_pages.load(Ordering::Relaxed) + self.acct.staged_pages.load(Ordering::Relaxed);
        pages.max(0) as u64 * PAGE_SIZE as u64 + self.tiers.pool.total_bytes() + self.fixed_bytes()
    }

    /// File buffers and metadata: the footprint's part no eviction or writeback moves.
    /// The buffers: reclaim's and writeback's write units (and each fault thread's, with
    /// direct reclaim), and the read copies of the fault threads (theirs and their shared
    /// one) and of the signal-mode fault buffers (counted whole, though a copy often holds a
    /// unit or less).
    fn fixed_bytes(&self) -> u64 {
        let unit = self.config.file_unit_bytes;
        let copies = self.fault_threads + self.signal_buffers + self.tiers.unit_cache.is_some() as usize;
        let direct = if self.config.reclaims_directly() { self.fault_threads } else { self.helpers };
        let writers = 2 + direct;
        let file_buf = if self.tiers.file.is_some() {
            writers * unit + copies * crate::backend::file::UnitCache::bytes(unit)
        } else {
            0
        };
        file_buf as u64 + self.acct.metadata_bytes.load(Ordering::Relaxed)
    }

    /// The part of the footprint evicting pages cannot shrink: the pool, the file buffers
    /// and metadata.
    pub(crate) fn footprint_floor(&self) -> u64 {
        // Pool bytes over its limit are a floor only when nothing below can take them: with
        // a writeback target they are on their way out, and faults should wait for that (a
        // remote store writes back slower than eviction fills the pool).
        let pool = self.tiers.pool.total_bytes();
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
        let file_up = self.tiers.file.is_some() && !self.tiers.file_off.load(Ordering::Relaxed);
        let remote_up = self.tiers.remote.as_ref().is_some_and(|r| !r.is_down());
        ((file_up || remote_up) && !self.wake.wb_failing.load(Ordering::Relaxed))
            || self.tiers.remote.as_ref().is_some_and(|r| r.retrying())
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
        self.tiers.file.is_none()
            && self.tiers.remote.as_ref().is_some_and(|r| r.batch_in_flight())
            && self.tiers.pool.total_bytes() > max + max / 4
    }

    /// The budget in force: the configured one, or this process's share of its tree's
    /// (`crate::tree`, refreshed by reclaim's steps through [`Shared::refresh_tree`]).
    pub(crate) fn budget(&self) -> u64 {
        match &self.tree {
            Some(t) => t.target(),
            None => self.config.budget_bytes,
        }
    }

    /// Publishes the footprint in the tree's ledger and takes the new share (rate-limited
    /// there; nothing without a tree).
    pub(crate) fn refresh_tree(&self) {
        if let Some(t) = &self.tree {
            t.refresh(self.footprint_bytes());
        }
    }

    /// The pool limit in force (`PagerConfig::pool_max_bytes`, moved by `pool_adapt`),
    /// scaled to the share of a tree's budget as the budget itself is.
    pub(crate) fn pool_limit(&self) -> u64 {
        let limit = self.tiers.pool_share.limit();
        match &self.tree {
            Some(t) if self.config.budget_bytes > 0 => {
                ((limit as u128 * t.target() as u128) / self.config.budget_bytes as u128) as u64
            }
            _ => limit,
        }
    }

    /// Pages the budget holds: a page refaulted within this many evictions of its own
    /// eviction would have stayed with a little more memory (workingset).
    pub(crate) fn workingset_pages(&self) -> u64 {
        self.budget() / PAGE_SIZE as u64
    }

    /// The inactive list's full size, in pages: `inactive_pct` of the budget, at least 256.
    pub(crate) fn inactive_reach_pages(&self) -> u64 {
        self.inactive_reach_of(self.workingset_pages())
    }

    /// [`Shared::inactive_reach_pages`] for a budget of `budget_pages` already read.
    pub(crate) fn inactive_reach_of(&self, budget_pages: u64) -> u64 {
        (budget_pages * self.config.inactive_pct as u64 / 100).max(256)
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
            self.wake.wb_wanted.store(true, Ordering::Release);
        }
        self.wake.wb_kick.kick();
    }

    pub(crate) fn kick_reclaim(&self) {
        self.wake.kick.kick();
    }

    pub(crate) fn lookup(&self, addr: usize) -> Lookup {
        match self.regions.map.read().unwrap_or_else(|e| e.into_inner()).find(addr) {
            Some(r) => {
                let idx = (addr - r.start) / PAGE_SIZE;
                Lookup::Region(r, idx)
            }
            None => Lookup::Unknown,
        }
    }

    pub(crate) fn region_by_id(&self, id: u64) -> Option<Arc<RegionInner>> {
        self.regions.map.read().unwrap_or_else(|e| e.into_inner()).by_id.get(&id).cloned()
    }

    /// Called by each fault thread once it has started.
    pub(crate) fn fault_thread_started(&self) {
        let (m, cv) = &self.wake.started;
        *m.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        cv.notify_all();
    }

    pub(crate) fn wait_fault_threads_started(&self, n: usize) {
        let (m, cv) = &self.wake.started;
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        while *g < n {
            g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Waits until the userfaultfd events read so far are handled. The kernel lets the
    /// program's madvise / munmap / mremap return once its event is read, and the reader
    /// holds the event lock until it has handled it.
    pub(crate) fn sync_events(&self) {
        drop(self.gates.event_lock.lock().unwrap_or_else(|e| e.into_inner()));
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
            match self.gates.install_gate.try_write() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return Ok(0),
            }
        } else {
            self.gates.install_gate.write().unwrap_or_else(|e| e.into_inner())
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
                // The destination too: a stale extent there is left open (events/mod.rs).
                uffd::Event::Remap { from, to, len } => [(from, from + len), (to, to + len)],
                _ => continue,
            };
            let map = self.regions.map.read().unwrap_or_else(|e| e.into_inner());
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
        r.marked_in.store(self.gates.event_batch.load(Ordering::Acquire), Ordering::Release);
    }

    /// The events in hand are handled: their regions are no longer leaving.
    pub(crate) fn unmark_leaving(&self) {
        self.gates.event_batch.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether nothing may be installed in `r`'s program range or moved out of it now: an
    /// event in hand concerns it, or it is being dropped (see [`Shared::guarded`]).
    pub(crate) fn is_leaving(&self, r: &RegionInner) -> bool {
        r.leaving.load(Ordering::Acquire) != 0
            || r.marked_in.load(Ordering::Acquire) == self.gates.event_batch.load(Ordering::Acquire)
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
        let _gate = self.gates.install_gate.read().unwrap_or_else(|e| e.into_inner());
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
        self.regions.map.read().unwrap_or_else(|e| e.into_inner()).by_id.values().cloned().collect()
    }

    /// Recomputes the metadata gauge (reclaim calls this now and then).
    pub(crate) fn refresh_metadata(&self) -> MetadataBreakdown {
        let pte_bytes: u64 = self
            .regions
            .map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .values()
            .map(|r| (r.ptes.chunks_in_use() * PAGE_SIZE) as u64)
            .sum();
        let m = MetadataBreakdown {
            pte_bytes,
            swap_table_bytes: self.tiers.swap.table_bytes(),
            cluster_header_bytes: self.tiers.swap.header_bytes(),
            allocator_bytes: self.tiers.swap.allocator_bytes(),
            pool_header_bytes: self.tiers.pool.metadata_bytes(),
            file_index_bytes: self.tiers.file.as_ref().map_or(0, |f| f.metadata_bytes()),
        };
        self.acct.metadata_bytes.store(m.total(), Ordering::Relaxed);
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
