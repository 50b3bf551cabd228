//! The public face of the engine: a [`Pager`] and the [`Region`]s it hands out, and the
//! threads that serve them.
//!
//! Owns: the pager's threads (started here, stopped when the pager and its last region are
//! gone), the public API over the memory manager's state (`mm`).
//! Calls: everything below: the memory manager, the fault threads, reclaim, writeback,
//! the SIGBUS handler of signal mode.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::{FaultMode, Hint, PagerConfig};
use crate::mm::error::io_err;
pub use crate::mm::MetadataBreakdown;
use crate::mm::{Error, Lookup, RegionInner, Result, Shared};
use crate::page::PAGE_SIZE;
use crate::pagetable::PteState;
use crate::stats::Stats;
use crate::swap::Tag;
use crate::sys;
use crate::uffd::RegisterMode;
use crate::writeback::DrainReport;

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
        crate::mm::children::hand_over(&self.shared);
        if let Some(place) = self.signal_place.take() {
            crate::sigbus::unregister(place);
        }
        self.shared.wake.shutdown.store(true, Ordering::SeqCst);
        sys::eventfd_ring(self.shared.wake.stop_fd.as_fd());
        self.shared.kick_reclaim();
        self.shared.kick_writeback(false);
        {
            let (_, cv) = &self.shared.wake.room;
            cv.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
        if let Some(t) = &self.shared.tree {
            t.leave();
        }
        crate::mm::children::close(&self.shared);
    }
}

/// A forked child's link to the server of its parent's pager ([`Pager::link_to_parent`]).
pub struct ParentLink(std::os::fd::OwnedFd);

/// A storage tier that can be drained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Tier {
    /// The swap file.
    File,
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
    /// Starts a pager: opens the userfaultfds and the tiers, starts the fault, reclaim and
    /// writeback threads (and, in signal mode, registers the SIGBUS handler).
    pub fn new(config: PagerConfig) -> Result<Pager> {
        config.validate()?;
        let shared = Arc::new(Shared::new(config)?);
        crate::mm::children::note_pager(&shared);
        shared.refresh_metadata();
        let threads = Arc::new(start_threads(&shared)?);
        Ok(Pager { shared, threads })
    }

    /// Gives this pager's row in its tree's ledger back (the shim's exit hook: a pager with
    /// detached mappings is never dropped). Its budget share stays as it was.
    pub fn leave_tree(&self) {
        if let Some(t) = &self.shared.tree {
            t.leave();
        }
    }

    /// Maps `len_bytes` (rounded up to pages) of anonymous memory managed by this pager.
    pub fn region(&self, len_bytes: usize, hint: Hint) -> Result<Region> {
        let inner = self.shared.map_region(len_bytes, hint, false, 0)?;
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
        self.map_detached_near(len_bytes, hint, 0)
    }

    /// [`Pager::map_detached`] at `near` when that range is free, as mmap(2) takes an
    /// address hint without MAP_FIXED (runtimes ask for their heap at an address of their
    /// choosing and look elsewhere when they do not get it); 0: anywhere.
    pub fn map_detached_near(&self, len_bytes: usize, hint: Hint, near: usize) -> Result<*mut u8> {
        let inner = self.shared.map_region(len_bytes, hint, true, near)?;
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

    /// In a forked child, called on the child's copy of its parent's pager (thread mode, in
    /// a tree): links the child to that pager's server for the child, which then grants
    /// the memory the child inherited, piece by piece, to the child's own pager (give the
    /// link to [`Pager::take_over_inherited`]). `None` when there is no such server to
    /// reach; the inherited memory then stays served by the parent's pager, as it is
    /// until the grants.
    pub fn link_to_parent(&self) -> Option<ParentLink> {
        crate::events::fork::link_to_parent(&self.shared).map(ParentLink)
    }

    /// Takes over, from now on, the inherited memory the parent's server grants through
    /// `link` (see [`Pager::link_to_parent`]), on a thread of this pager's
    /// (`tierswap-adopt`).
    pub fn take_over_inherited(&self, link: ParentLink) -> Result<()> {
        let s = self.shared.clone();
        std::thread::Builder::new()
            .name("tierswap-adopt".into())
            .spawn(move || {
                sys::block_signals();
                crate::events::grant::serve_grants(&s, link.0);
            })
            .map(|_| ())
            .map_err(io_err("cannot start the thread that takes over inherited memory"))
    }

    /// In a forked child without a pager of its own, before it forks in turn, called on
    /// its copy of the parent's pager: keeps the child's link to that pager's server its
    /// own (the grandchild inherits the claim and looks further).
    pub fn claim_link_before_fork(&self) {
        crate::events::fork::claim_before_own_pager(&self.shared);
    }

    /// The program changed the protection of `[addr, addr + len_bytes)` to `prot`
    /// (mprotect(2), or a fixed mapping the shim turned into one): pages of managed memory
    /// there that are not plain read-write stay out of first-touch fault-around and are
    /// not staged (see [`crate::mm::protect`]). For the shim: before the call when the pages
    /// stop being read-write, after it when they become read-write again.
    pub fn note_protection(&self, addr: usize, len_bytes: usize, prot: i32) {
        let rw = prot & (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) == libc::PROT_READ | libc::PROT_WRITE;
        let end = addr.saturating_add(crate::page::round_up_pages(len_bytes));
        let pieces = self.shared.regions.map.read().unwrap_or_else(|e| e.into_inner()).overlapping(addr, end);
        for p in pieces {
            p.region.protections.set(p.lo, p.hi, rw);
        }
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
            .map
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

    /// The footprint and the budget it is held to now (a tree member's share), without
    /// noting the footprint's peak: for a caller that asks often (the shim's heap, at each
    /// large free).
    pub fn footprint_and_budget(&self) -> (u64, u64) {
        (self.shared.footprint_bytes(), self.shared.budget())
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
                if self.shared.tiers.file.is_none() {
                    return Err(Error::NoSuchTier("file"));
                }
                Ok(crate::writeback::drain_file(&self.shared))
            }
        }
    }

    /// Lets a drained tier take pages again.
    pub fn resume(&self, tier: Tier) {
        match tier {
            Tier::File => self.shared.tiers.file_off.store(false, Ordering::Release),
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
            let left = self.shared.acct.present_pages.load(Ordering::Relaxed)
                + self.shared.acct.staged_pages.load(Ordering::Relaxed);
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
        self.shared.tiers.file.as_ref().map(|f| f.file())
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
        self.shared.tiers.remote.as_ref().map(|r| r.count_keys())
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
            if fp <= self.shared.budget() && self.shared.wake.reclaim_idle.load(Ordering::Acquire) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Starts the pager's threads: the fault threads (once they are past their start a fork
/// may begin, forkgate.rs), reclaim, writeback when there is a tier below the pool, the
/// reclaim helpers of signal mode; and in signal mode hands the program's faults to the
/// SIGBUS handler.
fn start_threads(shared: &Arc<Shared>) -> Result<Threads> {
    let mut threads = Threads { shared: shared.clone(), handles: Vec::new(), signal_place: None };
    for i in 0..shared.fault_threads {
        let s = shared.clone();
        threads.spawn(format!("tierswap-fault{i}"), "a fault thread", move || crate::fault::fault_thread(s, i))?;
    }
    // A fork's message must find a fault thread that can read it: one still starting
    // could be blocked in malloc behind the forking thread (forkgate.rs).
    crate::forkgate::install();
    shared.wait_fault_threads_started(shared.fault_threads);
    let s = shared.clone();
    threads.spawn("tierswap-reclaim".into(), "the reclaim thread", move || crate::reclaim::reclaim_thread(s))?;
    if shared.tiers.file.is_some() || shared.tiers.remote.is_some() {
        let s = shared.clone();
        threads.spawn("tierswap-writeback".into(), "the writeback thread", move || {
            crate::writeback::writeback_thread(s)
        })?;
    }
    for i in 0..shared.helpers {
        let s = shared.clone();
        threads
            .spawn(format!("tierswap-direct{i}"), "a reclaim helper", move || crate::reclaim::helper_thread(s, i))?;
    }
    if shared.config.fault_mode == FaultMode::Signal {
        // From here on the program's faults raise SIGBUS and the handler serves them.
        let server = crate::fault::signal::SignalServer::new(shared.clone())
            .map_err(io_err("cannot map the signal-mode fault buffers"))?;
        threads.signal_place =
            Some(crate::sigbus::register(server).map_err(io_err("cannot install the SIGBUS handler"))?);
    }
    Ok(threads)
}

impl Threads {
    /// Starts thread `name` running `body` (`what` names it if it panics).
    fn spawn(&mut self, name: String, what: &'static str, body: impl FnOnce() + Send + 'static) -> Result<()> {
        let h = std::thread::Builder::new()
            .name(name)
            .spawn(move || guarded(what, body))
            .map_err(io_err(format!("cannot start {what}")))?;
        self.handles.push(h);
        Ok(())
    }
}

/// Runs a pager thread; if it panics, the program's memory can no longer be served and
/// would hang on its next fault: abort loudly instead (docs/design.md, When something fails).
fn guarded(what: &str, body: impl FnOnce()) {
    crate::sys::block_signals();
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).is_err() {
        crate::sys::fatal(&format!("{what} panicked"));
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
        present_pages: s.acct.present_pages.load(Ordering::Relaxed).max(0) as u64,
        staged_pages: s.acct.staged_pages.load(Ordering::Relaxed).max(0) as u64,
        swap_slots: s.tiers.swap.slots_in_use(),
        swap_zero_pages: s.tiers.swap.count(Tag::Zero),
        swap_samefill_pages: s.tiers.swap.count(Tag::SameFilled),
        pool_stored_bytes: s.tiers.pool.stored_bytes(),
        pool_total_size: s.tiers.pool.total_bytes(),
        pool_limit: s.pool_limit(),
        pool_stored_pages: s.tiers.swap.count(Tag::Pool),
        file_pages: s.tiers.swap.count(Tag::File),
        file_blocks: s.tiers.file.as_ref().map_or(0, |f| f.blocks()),
        file_bytes: s.tiers.file.as_ref().map_or(0, |f| f.live_bytes()),
        metadata_bytes: metadata.total(),
        fault_latency_us: s.counters.latency_histogram(),
        remote_latency_us: s.counters.remote_latency_histogram(),
        remote_pages: s.tiers.swap.count(Tag::Remote),
        tree_ledger: s.tree.as_ref().map(|t| t.path().display().to_string()),
        tree_budget: s.tree.as_ref().map_or(0, |t| t.budget()),
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
        let slot = pte.slot();
        let e = self.shared.tiers.swap.load(slot);
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
        let _ev = s.gates.event_lock.lock().unwrap_or_else(|e| e.into_inner());
        let extents = {
            let mut map = s.regions.map.write().unwrap_or_else(|e| e.into_inner());
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
            let _gate = s.gates.install_gate.write().unwrap_or_else(|e| e.into_inner());
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
        crate::mm::teardown::teardown(s, r);
    }
}
