//! The swap-in path: fault threads read the userfaultfd and serve each missing-page fault
//! from wherever the page is: first touch (zero page), staging (move back), or a swap slot
//! (zero / same-filled / pool / file, then UFFDIO_COPY).
//!
//! A fault thread serves one fault at a time under the pte lock, so a page is swapped in
//! once however many threads touch it; a second message for the same page finds it present
//! and only wakes the waiters. Nothing here allocates on the fault path: each thread owns
//! its buffers.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::compress::decompress;
use crate::backend::file::{AlignedBuf, UnitCache};
use crate::backend::pool::PoolHandle;
use crate::backend::zero::fill_pattern;
use crate::page::{BLOCK_PAGES, PAGE_SIZE};
use crate::pager::{Lookup, RegionInner, Shared};
use crate::pagetable::{Pte, PteState};
use crate::swap::{SwapEntry, Tag};
use crate::uffd::{self, Event};

/// Per-thread buffers of the fault path.
pub(crate) struct Scratch {
    /// One page being assembled for UFFDIO_COPY.
    page: AlignedBuf,
    /// Compressed bytes read from the file.
    compressed: Vec<u8>,
    /// The last file unit read (pages evicted together come back together).
    unit: UnitCache,
}

impl Scratch {
    pub(crate) fn new(unit_bytes: usize) -> std::io::Result<Scratch> {
        Ok(Scratch {
            page: AlignedBuf::new(PAGE_SIZE)?,
            compressed: vec![0u8; PAGE_SIZE],
            unit: UnitCache::new(unit_bytes)?,
        })
    }
}

/// Why a slot's bytes could not be read.
#[derive(Debug)]
pub(crate) enum ReadFail {
    /// Checksum or structure mismatch.
    Corrupt(String),
    /// IO error.
    Io(String),
}

impl std::fmt::Display for ReadFail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadFail::Corrupt(m) => write!(f, "corrupt: {m}"),
            ReadFail::Io(m) => write!(f, "read error: {m}"),
        }
    }
}

/// The fault thread's loop.
pub(crate) fn fault_thread(s: Arc<Shared>) {
    let mut scratch = match Scratch::new(s.config.file_unit_bytes) {
        Ok(b) => b,
        Err(e) => fatal(&format!("a fault thread cannot map its buffers: {e}")),
    };
    let mut events = Vec::with_capacity(64);
    while !s.shutdown.load(Ordering::Acquire) {
        match s.uffd.poll_readable(200, Some(s.stop_fd.as_raw_fd())) {
            Ok(r) if r.uffd => {}
            Ok(_) => continue,
            Err(e) => fatal(&format!("polling the userfaultfd failed: {e}")),
        }
        events.clear();
        match s.uffd.read_events(&mut events, 64) {
            Ok(_) => {}
            Err(e) => fatal(&format!("reading the userfaultfd failed: {e}")),
        }
        for ev in events.drain(..) {
            if let Event::PageFault { addr, write, .. } = ev {
                handle_fault(&s, addr, write, &mut scratch);
            }
        }
    }
}

/// The pager cannot serve faults any more: the program would hang. Say so and abort.
pub(crate) fn fatal(msg: &str) -> ! {
    eprintln!("tierswap: {msg}; the program's memory can no longer be served, aborting");
    std::process::abort()
}

fn handle_fault(s: &Shared, addr: usize, write: bool, scratch: &mut Scratch) {
    let t0 = Instant::now();
    let page_addr = addr & !(PAGE_SIZE - 1);
    let (r, idx) = match s.lookup(page_addr) {
        Lookup::Region(r, idx) => (r, idx),
        Lookup::Mirror => {
            // Only the pager reads mirrors, and only pages it staged; a hole here means the
            // page was zero (it read as such before staging).
            install_zero(s, page_addr, false);
            return;
        }
        Lookup::Unknown => {
            let _ = s.uffd.wake(page_addr, PAGE_SIZE);
            return;
        }
    };
    // Make room before adding a page, not while holding its lock.
    let cur = r.ptes.load(idx);
    if cur.state() != PteState::Present && cur.state() != PteState::Staged {
        wait_for_room(s);
    }
    let old = r.ptes.lock(idx);
    let new = match old.state() {
        PteState::None => {
            install_zero(s, page_addr, write);
            s.present_pages.fetch_add(1, Ordering::Relaxed);
            s.counters.faults_first_touch.fetch_add(1, Ordering::Relaxed);
            Pte::present()
        }
        PteState::Present => {
            // Already served (a second message for the page), or the program discarded it:
            // either way a zero page is right, and EEXIST tells us it was the former.
            install_zero(s, page_addr, write);
            r.ptes.unlock(idx, old, old);
            return;
        }
        PteState::Staged => {
            r.ptes.unlock(idx, old, old);
            unstage_around(s, &r, idx);
            s.counters.faults_staged.fetch_add(1, Ordering::Relaxed);
            finish_fault(s, t0);
            return;
        }
        PteState::Swapped => {
            let slot = old.payload();
            let (tag, res) = read_slot(s, slot, scratch);
            match res {
                Ok(Some(())) => {
                    let _ = copy_page(s, page_addr, scratch.page.as_slice());
                }
                Ok(None) => install_zero(s, page_addr, write),
                Err(fail) => {
                    poison(s, page_addr, slot, &fail);
                }
            }
            put_slot(s, slot);
            s.present_pages.fetch_add(1, Ordering::Relaxed);
            s.counters.faults_swapped.fetch_add(1, Ordering::Relaxed);
            r.ptes.unlock(idx, old, Pte::present());
            finish_fault(s, t0);
            if tag == Tag::File {
                // The program runs again already; read its likely next pages meanwhile.
                let window = r.ra.next(idx, r.hint, s.config.readahead_max_pages);
                if window <= 1 {
                    s.counters.swap_ra_off.fetch_add(1, Ordering::Relaxed);
                } else {
                    read_ahead(s, &r, idx + 1, (idx + window as usize).min(r.n_pages), scratch);
                }
            }
            return;
        }
    };
    r.ptes.unlock(idx, old, new);
    finish_fault(s, t0);
}

/// Reads the disk-backed pages among `[from, to)` into staging (marked read-ahead), where
/// their first touch finds them in memory. Pages in other tiers, shared by fork, or busy
/// are left alone: readahead is a guess and never waits.
fn read_ahead(s: &Shared, r: &RegionInner, from: usize, to: usize, scratch: &mut Scratch) {
    let mut read = 0u64;
    let mut last_block = usize::MAX;
    for j in from..to {
        let Some(old) = r.ptes.try_lock_in(j, PteState::Swapped) else {
            continue;
        };
        let slot = old.payload();
        let Some(e) = s.swap.try_lock(slot) else {
            r.ptes.unlock(j, old, old);
            continue;
        };
        let ok = e.tag() == Tag::File
            && e.count() == 1
            && matches!(read_entry(s, slot, e, scratch), Ok(Some(())))
            && s.uffd.copy(r.mirror_addr(j), &scratch.page.as_slice()[..PAGE_SIZE], true, false).is_ok();
        if !ok {
            // A failed read here is left for the page's own fault, which reports it.
            s.swap.unlock(slot, e, e);
            r.ptes.unlock(j, old, old);
            continue;
        }
        free_backend(s, e);
        s.swap.unlock(slot, e, SwapEntry::FREE);
        r.ptes.unlock(j, old, Pte::staged_readahead());
        s.staged_pages.fetch_add(1, Ordering::Relaxed);
        read += 1;
        let block = j / BLOCK_PAGES;
        if block != last_block {
            // On the inactive list, like any staged block: evicted again if unused.
            s.inactive.lock().unwrap_or_else(|e| e.into_inner()).push_back((r.id, block));
            last_block = block;
        }
    }
    s.counters.swap_ra.fetch_add(read, Ordering::Relaxed);
    if read > 0 && s.footprint_bytes() > s.high_watermark() {
        s.kick_reclaim();
    }
}

fn finish_fault(s: &Shared, t0: Instant) {
    s.counters.faults.fetch_add(1, Ordering::Relaxed);
    s.counters.record_fault_latency(t0.elapsed().as_micros() as u64);
    if s.footprint_bytes() > s.high_watermark() {
        s.kick_reclaim();
    }
}

/// Blocks while the footprint is over the budget and reclaim can still bring it down.
/// It cannot when its last pass found nothing to evict, or when what eviction cannot
/// shrink (a pool that could not be written back, metadata) already fills the budget:
/// then the program goes on over budget, which reclaim counts and reports.
fn wait_for_room(s: &Shared) {
    let hopeless = || s.reclaim_stuck.load(Ordering::Relaxed) || s.footprint_floor() >= s.low_watermark();
    if s.footprint_bytes() <= s.budget() || hopeless() {
        return;
    }
    s.counters.throttled_faults.fetch_add(1, Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(2);
    let (m, cv) = &s.room;
    let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
    while s.footprint_bytes() > s.budget() && !s.shutdown.load(Ordering::Relaxed) {
        s.kick_reclaim();
        let now = Instant::now();
        if now >= deadline {
            // Reclaim cannot make room (nothing evictable left): going over budget beats
            // hanging the program. Reclaim counts and reports it.
            return;
        }
        let gen = *g;
        let (g2, _) = cv.wait_timeout(g, Duration::from_millis(5)).unwrap_or_else(|e| e.into_inner());
        g = g2;
        if *g != gen && (s.footprint_bytes() <= s.budget() || hopeless()) {
            return;
        }
    }
}

/// Maps a zero page at `addr` (a zeroed copy for writes, saving the write fault after).
fn install_zero(s: &Shared, addr: usize, write: bool) {
    let res = if write {
        static ZERO_PAGE: [u8; PAGE_SIZE] = [0; PAGE_SIZE];
        s.uffd.copy(addr, &ZERO_PAGE, false, false)
    } else {
        s.uffd.zeropage(addr, PAGE_SIZE, false)
    };
    settle_install(s, addr, res);
}

fn copy_page(s: &Shared, addr: usize, page: &[u8]) -> bool {
    settle_install(s, addr, s.uffd.copy(addr, &page[..PAGE_SIZE], false, false))
}

/// Handles the outcome of an install: EEXIST means the page is there already (wake the
/// waiters ourselves, the kernel did not), EAGAIN is retried.
fn settle_install(s: &Shared, addr: usize, res: uffd::Result<usize>) -> bool {
    match res {
        Ok(_) => true,
        Err(uffd::Error::PageExist { .. }) => {
            let _ = s.uffd.wake(addr, PAGE_SIZE);
            true
        }
        Err(uffd::Error::ProcessGone { .. }) => false,
        Err(e) => {
            // The address is no longer mapped (region dropped) or the mm is changing; wake
            // whoever waits so that it retries the access.
            let _ = s.uffd.wake(addr, PAGE_SIZE);
            if !matches!(e, uffd::Error::NoPage { .. } | uffd::Error::Invalid { .. }) {
                eprintln!("tierswap: installing a page at {addr:#x} failed: {e}");
            }
            false
        }
    }
}

/// Moves the staged page at `idx` back, with its staged neighbours in the same 64 KiB block
/// (fault-around: they would otherwise cost a fault each), read-ahead pages excepted.
fn unstage_around(s: &Shared, r: &RegionInner, idx: usize) {
    let block_start = idx - idx % BLOCK_PAGES;
    let block_end = (block_start + BLOCK_PAGES).min(r.n_pages);
    // Lock the faulting page first (waiting), then neighbours opportunistically.
    let first = r.ptes.lock(idx);
    if first.state() != PteState::Staged {
        // Someone else moved it meanwhile: just make sure the waiter wakes.
        r.ptes.unlock(idx, first, first);
        let _ = s.uffd.wake(r.page_addr(idx), PAGE_SIZE);
        return;
    }
    let mut locked = [false; BLOCK_PAGES];
    locked[idx - block_start] = true;
    for i in block_start..block_end {
        if i == idx {
            continue;
        }
        if let Some(old) = r.ptes.try_lock_in(i, PteState::Staged) {
            if old.is_readahead() {
                // A read-ahead page comes in on its own touch, so that swap_ra_hit counts
                // pages really used and the window follows the program, not fault-around.
                r.ptes.unlock(i, old, old);
            } else {
                locked[i - block_start] = true;
            }
        }
    }
    let mut i = block_start;
    let mut moved_pages = 0i64;
    while i < block_end {
        if !locked[i - block_start] {
            i += 1;
            continue;
        }
        let run_start = i;
        while i < block_end && locked[i - block_start] {
            i += 1;
        }
        moved_pages += move_back(s, r, run_start, i);
    }
    s.staged_pages.fetch_sub(moved_pages, Ordering::Relaxed);
    s.present_pages.fetch_add(moved_pages, Ordering::Relaxed);
    s.counters.pgactivate.fetch_add(moved_pages as u64, Ordering::Relaxed);
}

/// Moves locked staged pages `[from, to)` from the mirror back into the region and unlocks
/// them as present (active). Returns the number of pages moved or zero-filled.
fn move_back(s: &Shared, r: &RegionInner, from: usize, to: usize) -> i64 {
    let mut i = from;
    let mut n = 0;
    let mut again = 0;
    while i < to {
        let len = (to - i) * PAGE_SIZE;
        // SAFETY: the pages [i, to) are locked staged pages: their only copy is at the same
        // offset in the mirror, which only the pager touches, and the program's range there
        // is empty (the program faults on it). Moving them back is what the program expects.
        let res = unsafe { s.uffd.move_pages(r.page_addr(i), r.mirror_addr(i), len, false, false) };
        let done_pages = match res {
            Ok(bytes) => bytes / PAGE_SIZE,
            Err(uffd::Error::NoPage { done_bytes, .. }) => {
                // A hole in the mirror at the page after the moved ones: it was a zero page.
                let at = i + done_bytes / PAGE_SIZE;
                install_zero(s, r.page_addr(at), false);
                done_bytes / PAGE_SIZE + 1
            }
            Err(uffd::Error::PageExist { done_bytes, .. }) => {
                let at = i + done_bytes / PAGE_SIZE;
                let _ = s.uffd.wake(r.page_addr(at), PAGE_SIZE);
                done_bytes / PAGE_SIZE + 1
            }
            Err(uffd::Error::Again { done_bytes, .. }) if done_bytes > 0 || again < 4 => {
                again += 1;
                done_bytes / PAGE_SIZE
            }
            Err(uffd::Error::Again { done_bytes, .. }) => {
                // EAGAIN with no progress, again and again: this kernel's answer for a hole
                // in the mirror (see tests/uffd_ops.rs). The page read as zeros when staged.
                let at = i + done_bytes / PAGE_SIZE;
                install_zero(s, r.page_addr(at), false);
                done_bytes / PAGE_SIZE + 1
            }
            Err(e) => fatal(&format!("moving a staged page back to {:#x} failed: {e}", r.page_addr(i))),
        };
        let mut ra_hits = 0;
        for k in i..i + done_pages {
            let old = r.ptes.load(k);
            ra_hits += old.is_readahead() as u32;
            r.ptes.unlock(k, old, Pte::present().with_active(true));
        }
        if ra_hits > 0 {
            r.ra.hit(ra_hits);
            s.counters.swap_ra_hit.fetch_add(ra_hits as u64, Ordering::Relaxed);
        }
        n += done_pages as i64;
        i += done_pages;
    }
    n
}

/// Reads slot `slot`'s bytes into `scratch.page`, and says which tier they came from.
/// `Ok(None)` means a zero page (nothing to copy). The slot keeps its reference; the caller
/// puts it.
pub(crate) fn read_slot(s: &Shared, slot: u64, scratch: &mut Scratch) -> (Tag, Result<Option<()>, ReadFail>) {
    let e = s.swap.lock(slot);
    let res = read_entry(s, slot, e, scratch);
    s.swap.unlock(slot, e, e);
    (e.tag(), res)
}

fn read_entry(s: &Shared, slot: u64, e: SwapEntry, scratch: &mut Scratch) -> Result<Option<()>, ReadFail> {
    let page = &mut scratch.page.as_mut_slice()[..PAGE_SIZE];
    match e.tag() {
        Tag::Zero => {
            s.counters.swpin_zero.fetch_add(1, Ordering::Relaxed);
            Ok(None)
        }
        Tag::SameFilled => {
            fill_pattern(page, e.pattern());
            s.counters.swpin_samefill.fetch_add(1, Ordering::Relaxed);
            Ok(Some(()))
        }
        Tag::Pool => {
            let (h, len) = e.addr_len();
            let handle = PoolHandle::from_raw(h).ok_or_else(|| ReadFail::Corrupt(format!("bad pool handle {h:#x}")))?;
            // SAFETY: the entry is locked and points at this object, so it stays allocated
            // until we unlock.
            let obj = unsafe { s.pool.object(handle, len) };
            if len == PAGE_SIZE {
                page.copy_from_slice(obj);
            } else {
                decompress(s.config.compressor, obj, page).map_err(|err| {
                    ReadFail::Corrupt(format!("pool object of slot {slot} does not decompress: {err}"))
                })?;
            }
            s.counters.zswpin.fetch_add(1, Ordering::Relaxed);
            Ok(Some(()))
        }
        Tag::File => {
            let file = s.file.as_ref().ok_or_else(|| ReadFail::Corrupt("file entry without a file tier".into()))?;
            let (off, len) = e.addr_len();
            let hit =
                file.read_cached(off, len, slot, &mut scratch.unit, &mut scratch.compressed).map_err(
                    |err| match err {
                        crate::backend::file::FileError::Corrupt { .. } => {
                            s.counters.checksum_errors.fetch_add(1, Ordering::Relaxed);
                            ReadFail::Corrupt(err.to_string())
                        }
                        _ => {
                            s.counters.read_errors.fetch_add(1, Ordering::Relaxed);
                            ReadFail::Io(err.to_string())
                        }
                    },
                )?;
            if hit {
                s.counters.file_unit_hits.fetch_add(1, Ordering::Relaxed);
            } else {
                s.counters.file_unit_reads.fetch_add(1, Ordering::Relaxed);
            }
            if len == PAGE_SIZE {
                page.copy_from_slice(&scratch.compressed[..PAGE_SIZE]);
            } else {
                decompress(s.config.compressor, &scratch.compressed[..len], page).map_err(|err| {
                    ReadFail::Corrupt(format!("file record of slot {slot} does not decompress: {err}"))
                })?;
            }
            s.counters.pswpin.fetch_add(1, Ordering::Relaxed);
            Ok(Some(()))
        }
        Tag::Free | Tag::Reserved | Tag::Remote => {
            Err(ReadFail::Corrupt(format!("slot {slot} is {:?}, not a placed page", e.tag())))
        }
    }
}

/// Drops one reference to `slot`; the last one frees the slot and its backend storage.
pub(crate) fn put_slot(s: &Shared, slot: u64) {
    let e = s.swap.lock(slot);
    if e.count() > 1 {
        s.swap.unlock(slot, e, e.with_count(e.count() - 1));
        return;
    }
    free_backend(s, e);
    s.swap.unlock(slot, e, SwapEntry::FREE);
}

/// Frees the storage behind a placed entry (not the slot).
pub(crate) fn free_backend(s: &Shared, e: SwapEntry) {
    match e.tag() {
        Tag::Pool => {
            let (h, len) = e.addr_len();
            if let Some(handle) = PoolHandle::from_raw(h) {
                s.pool.free(handle, len);
            }
        }
        Tag::File => {
            if let Some(f) = &s.file {
                let (off, len) = e.addr_len();
                f.free(off, len);
            }
        }
        _ => {}
    }
}

/// A page that cannot be read is never returned as data: the faulting thread gets SIGBUS.
fn poison(s: &Shared, addr: usize, slot: u64, fail: &ReadFail) {
    eprintln!(
        "tierswap: page at {addr:#x} (slot {slot}) cannot be read back ({fail}); the accessing thread gets SIGBUS"
    );
    match s.uffd.poison(addr, PAGE_SIZE, false) {
        Ok(_) => {}
        Err(uffd::Error::PageExist { .. }) => {
            let _ = s.uffd.wake(addr, PAGE_SIZE);
        }
        Err(e) => fatal(&format!("cannot poison unreadable page {addr:#x}: {e}")),
    }
}
