//! Making a region: mapping the program's range and its mirror, registering both, and
//! entering the region in the map once no stale extent of a gone mapping overlaps it.
//!
//! Owns: nothing. Calls: the region map, teardown (a stale extent no event came for),
//! `uffd` registration, `sys` mappings.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::error::{io_err, Error, Result};
use super::region::RegionInner;
use super::Shared;
use crate::config::Hint;
use crate::forkgate::Busy;
use crate::page::{pages_for, pages_to_bytes, PAGE_SIZE};
use crate::pagetable::{PageTable, Pte, PteState};
use crate::policy::admission::Locality;
use crate::policy::readahead::Readahead;
use crate::sys;
use crate::uffd::RegisterMode;

/// Largest region: 64 TiB.
const MAX_REGION_BYTES: usize = 64 << 40;

/// How long a new mapping waits for the event of the mapping the kernel had at its address
/// before (`Shared::claim_range`); fault threads read events between faults, so this is
/// reached only when none can read for that long.
const STALE_EXTENT_PATIENCE: Duration = Duration::from_secs(60);

/// How often the reclaim thread looks again at inherited pages still shared with the
/// parent ([`Shared::take_unshared_inherited`]), for each [`SHARED_LOOK_PAGES`] of them:
/// a look reads /proc/self/pagemap over every region that has some (8 bytes a page), which
/// took 10–15 ms for 1 GiB here, so ~1.6 % of a CPU at this pace.
pub(crate) const SHARED_LOOK_MS: u64 = 50;
/// See [`SHARED_LOOK_MS`]: 64 MiB.
pub(crate) const SHARED_LOOK_PAGES: usize = 16384;

/// What `Shared::claim_range` holds: a busy section (forkgate.rs) and the event lock.
type Claim<'a> = (Busy, std::sync::MutexGuard<'a, ()>);

impl Shared {
    /// Maps a program range (at `near` when that is free, 0: anywhere) and its mirror,
    /// registers both and enters the region in the map.
    pub(crate) fn map_region(
        &self,
        len_bytes: usize,
        hint: Hint,
        detached: bool,
        near: usize,
    ) -> Result<Arc<RegionInner>> {
        if len_bytes == 0 || len_bytes > MAX_REGION_BYTES {
            return Err(Error::RegionSize { len_bytes });
        }
        let n_pages = pages_for(len_bytes);
        let len = pages_to_bytes(n_pages);
        let start = sys::mmap_reserve_near(near, len).map_err(io_err(format!("cannot map a region of {len} bytes")))?;
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
                crate::mm::teardown::forget(self, start, start + len);
                held
            }
        };
        self.enter_region(r.clone());
        Ok(r)
    }

    /// Takes over `[start, start + len)` of memory this process inherited at its fork, which
    /// its parent's server has just unregistered from the child's userfaultfd and granted
    /// (events/fork.rs): registers it with this pager's own and makes it a region whose
    /// missing pages read zeros (the server installed every page it held there before the
    /// grant). Resident pages this process maps alone become present (dirty: no slot of
    /// this pager's holds them); pages it still shares copy-on-write (with its parent) stay
    /// out of its footprint, which counts memory once in a tree, until it writes one: they
    /// are write-protected, and the write-protect fault makes the page's copy present
    /// (fault/wp.rs); without write protection (`keep-clean` off) they count as this
    /// process's own from the start. Pages the program made other than read-write since the fork are found
    /// in /proc/self/maps (the pager knew nothing of this memory until now). Returns the
    /// pages taken as present.
    pub(crate) fn adopt_inherited(&self, start: usize, len: usize) -> Result<usize> {
        let (r, wp) = self.enter_inherited(start, len)?;
        // Every write from here on faults once (a 64 KiB block at a time): a shared page's
        // write makes its copy this pager's. Without the protection, shared pages count as
        // this process's own at once (else a write would copy one uncounted).
        let protected = wp && self.protect_inherited(start, len);
        let present = self.count_inherited(&r, protected)?;
        self.counters.adopted_pages.fetch_add(present as u64, Ordering::Relaxed);
        Ok(present)
    }

    /// [`Self::adopt_inherited`]'s first step, under the event lock: checks the range is
    /// mapped, registers it, makes its region and enters it in the map. Returns the region
    /// and whether it is registered for write protection.
    fn enter_inherited(&self, start: usize, len: usize) -> Result<(Arc<RegionInner>, bool)> {
        let bad = Error::NotInherited { addr: start, len_bytes: len };
        if len == 0 || !start.is_multiple_of(PAGE_SIZE) || !len.is_multiple_of(PAGE_SIZE) {
            return Err(bad);
        }
        let n_pages = len / PAGE_SIZE;
        let Ok((_busy, _ev)) = self.claim_range(start, start + len, Duration::from_secs(2)) else {
            return Err(bad);
        };
        // Still mapped, all of it: the program may have unmapped part since the grant.
        let maps = sys::mappings_in(start, start + len).map_err(io_err("cannot read /proc/self/maps"))?;
        let end = maps.iter().try_fold(start, |at, &(lo, hi, _)| (lo == at).then_some(hi));
        if end != Some(start + len) {
            return Err(bad);
        }
        let mut mode = RegisterMode { missing: true, wp: self.config.keep_clean, minor: false };
        if mode.wp && self.uffd.register(start, len, mode).is_err() {
            mode.wp = false;
        }
        if !mode.wp {
            self.uffd.register(start, len, mode)?;
        }
        let r = self.new_region_at(start, n_pages, Hint::Normal, mode, true).inspect_err(|_| {
            let _ = self.uffd.unregister(start, len);
        })?;
        for &(lo, hi, _) in maps.iter().filter(|&&(_, _, rw)| !rw) {
            r.protections.set((lo - start) / PAGE_SIZE, (hi - start) / PAGE_SIZE, false);
        }
        self.enter_region(r.clone());
        Ok((r, mode.wp))
    }

    /// Write-protects `[start, start + len)`; false when it cannot be done. Not under the
    /// event lock: while an event of this pager's is queued unread the kernel answers EAGAIN,
    /// and only a fault thread holding that lock reads events (tried for up to 20 ms; a
    /// Python worker unmaps and madvises often enough that one try alone failed).
    fn protect_inherited(&self, start: usize, len: usize) -> bool {
        for _ in 0..200 {
            // (DONTWAKE is refused with a protection: EINVAL.)
            match self.uffd.writeprotect(start, len, true, false) {
                Ok(()) => return true,
                Err(crate::uffd::Error::Again { .. }) => std::thread::sleep(Duration::from_micros(100)),
                Err(_) => return false,
            }
        }
        false
    }

    /// Marks present the resident pages of inherited region `r` this process maps alone
    /// (all resident pages when they are not `protected`), unless an UNMAP tore the region
    /// down meanwhile (teardown takes the reclaim lock after marking it dead); notes how many
    /// it left shared.
    fn count_inherited(&self, r: &RegionInner, protected: bool) -> Result<usize> {
        let map = sys::page_map(r.start, r.n_pages).map_err(io_err(format!(
            "the page map of {:#x}+{}",
            r.start,
            r.len_bytes()
        )))?;
        let (present, shared) = self.take_inherited(r, &map, protected);
        r.shared_inherited.store(shared, Ordering::Relaxed);
        Ok(present)
    }

    /// Inherited memory the parent has written or dropped since this process took it over
    /// is this process's alone: the parent's write gave the parent a new copy and left the
    /// old one here, mapped once. Nothing tells this process so (it wrote nothing), and
    /// uncounted, such pages piled up: a redis BGSAVE child beside a parent overwriting keys
    /// held 230 MiB more than its footprint under a 256 MiB tree. Looks again at the regions
    /// with shared pages left (the reclaim thread, every [`SHARED_LOOK_MS`]) and marks
    /// present those now mapped here alone; reclaim then moves them out like any other
    /// (`unshare_busy` first: the kernel still marks them shared). Returns the pages taken
    /// and those still shared.
    pub(crate) fn take_unshared_inherited(&self) -> (usize, usize) {
        let (mut taken, mut left) = (0, 0);
        for r in self.all_regions() {
            if r.shared_inherited.load(Ordering::Relaxed) == 0 || r.dead.load(Ordering::Acquire) {
                continue;
            }
            let Ok(map) = sys::page_map(r.start, r.n_pages) else { continue };
            let (present, shared) = self.take_inherited(&r, &map, true);
            r.shared_inherited.store(shared, Ordering::Relaxed);
            (taken, left) = (taken + present, left + shared);
        }
        self.counters.adopted_unshared.fetch_add(taken as u64, Ordering::Relaxed);
        (taken, left)
    }

    /// Marks present the pages of region `r` that `map` (its /proc/self/pagemap entries)
    /// shows resident and mapped here alone, or resident at all when not `protected`;
    /// returns them and the resident pages left shared. A page present already (a write
    /// fault made it so) is left as it is; nothing is marked in a region torn down.
    fn take_inherited(&self, r: &RegionInner, map: &[u64], protected: bool) -> (usize, usize) {
        let _reclaim = r.reclaim_lock.read().unwrap_or_else(|e| e.into_inner());
        if r.dead.load(Ordering::Acquire) {
            return (0, 0);
        }
        let (mut present, mut shared) = (0, 0);
        for (i, e) in map.iter().enumerate() {
            if e & sys::PAGEMAP_PRESENT == 0 {
                continue;
            }
            if protected && e & sys::PAGEMAP_EXCLUSIVE == 0 {
                shared += usize::from(r.ptes.load(i).state() == PteState::None);
                continue;
            }
            if let Some(old) = r.ptes.try_lock_in(i, PteState::None) {
                r.ptes.unlock(i, old, Pte::present());
                present += 1;
            }
        }
        self.acct.present_pages.fetch_add(present as i64, Ordering::Relaxed);
        (present, shared)
    }

    /// Enters region `r` in the map (the caller made sure nothing overlaps it).
    pub(crate) fn enter_region(&self, r: Arc<RegionInner>) {
        self.trail.mark(crate::trail::What::Enter, r.start, r.start + r.len_bytes(), 0, r.id);
        self.regions.map.write().unwrap_or_else(|e| e.into_inner()).insert(r);
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
    pub(crate) fn claim_range(
        &self,
        start: usize,
        end: usize,
        patience: Duration,
    ) -> std::result::Result<Claim<'_>, Claim<'_>> {
        let t0 = Instant::now();
        loop {
            let busy = crate::forkgate::enter();
            let ev = self.gates.event_lock.lock().unwrap_or_else(|e| e.into_inner());
            let stale = !self.regions.map.read().unwrap_or_else(|e| e.into_inner()).overlapping(start, end).is_empty()
                || self.regions.remapped_from.pending(start, end, Instant::now());
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
            id: self.regions.next_id.fetch_add(1, Ordering::Relaxed),
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
            wp_last_block: AtomicUsize::new(usize::MAX),
            staged_last_page: AtomicUsize::new(usize::MAX),
            detached,
            extents: AtomicUsize::new(0),
            gone: AtomicBool::new(false),
            leaving: AtomicU32::new(0),
            marked_in: AtomicU64::new(0),
            protections: Default::default(),
            shared_inherited: AtomicUsize::new(0),
        }))
    }
}
