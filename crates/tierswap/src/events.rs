//! The program's own changes to managed memory, as userfaultfd events: MADV_DONTNEED /
//! MADV_REMOVE (REMOVE), munmap (UNMAP) and mremap (REMAP). The shim hands out mappings the
//! program owns ([`crate::Pager::map_detached`]); it frees, empties and moves them with
//! plain system calls, and the pager follows here.
//!
//! Owns: what an event does to ptes, slots, mirrors and the region map; region teardown.
//! Calls: the page table, the swap space (through `fault::put_slot`), `uffd` on mirrors.
//!
//! Ordering rules (where the races live):
//! - Fault threads read the program's userfaultfd under `Shared::event_lock` and handle the
//!   events of a read before releasing it, so events are handled one at a time and in the
//!   order the kernel queued them. Faults read in the same batch are served after.
//! - The thread doing madvise / munmap / mremap stays blocked until its event is *read*,
//!   then goes on at once: for REMOVE the kernel zaps the range after our read, maybe
//!   while we still work. Every page is handled under its pte lock, taken in pte order. A
//!   fault thread that locked a page first and installs its old bytes after the zap would
//!   leave stale data mapped: so REMOVE moves every present page of the range out to the
//!   mirror (through the mirror's userfaultfd, which has no events) and drops it there.
//!   After that the pte is `None` and any later fault installs zeros. (Left open: between
//!   such a stale install and the move-out, a thread of the program could read the old
//!   bytes after its madvise returned; it takes a second thread touching the page while
//!   it is being discarded.)
//! - A new region enters the map under the event lock: the kernel may reuse an address
//!   whose UNMAP event was read (so munmap returned) but is still being handled.
//! - Installs into the program's range fail with EAGAIN while an event is queued; the
//!   fault path leaves such pages as they were and wakes the thread, which faults again.
//! - Reclaim and writeback: they hold the pte lock (reclaim) or the swap entry lock
//!   (writeback) across every change, so an event handler that takes the pte lock after
//!   them frees what they left (a slot, a staged page) and nothing comes back.
//! - Teardown (the last extent of a region unmapped, or its `Region` dropped) marks the
//!   region dead, waits for reclaim's lock, frees every pte and unmaps the mirror.
//! - A fault on an address the map does not know takes the event lock (so an event being
//!   handled, e.g. a REMAP creating the region, completes first) and looks again; memory
//!   still unknown then (an mremap that grew a mapping: the kernel reports only the old
//!   length) gets a zero page and is not managed.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::fault::put_slot;
use crate::page::{pages_to_bytes, BLOCK_PAGES, PAGE_SIZE};
use crate::pager::{RegionInner, Shared};
use crate::pagetable::{Pte, PteState, PTES_PER_CHUNK};
use crate::sys;
use crate::uffd::{self, features, Event, RegisterMode};

/// Features of the program ranges' userfaultfd.
pub(crate) const PROGRAM_FEATURES: u64 =
    features::MOVE | features::EVENT_REMOVE | features::EVENT_UNMAP | features::EVENT_REMAP;

/// Handles one non-fault event. The caller holds `event_lock`.
pub(crate) fn handle_event(s: &Shared, ev: Event) {
    match ev {
        Event::Remove { start, end } => {
            s.counters.event_remove.fetch_add(1, Ordering::Relaxed);
            remove(s, start, end);
        }
        Event::Unmap { start, end } => {
            s.counters.event_unmap.fetch_add(1, Ordering::Relaxed);
            unmap(s, start, end);
        }
        Event::Remap { from, to, len } => {
            s.counters.event_remap.fetch_add(1, Ordering::Relaxed);
            remap(s, from, to, len);
        }
        // Not negotiated; a child's descriptor closes when dropped.
        Event::Fork { .. } | Event::Unknown(_) | Event::PageFault { .. } => {}
    }
}

/// MADV_DONTNEED / MADV_REMOVE on `[start, end)`: the range stays mapped and reads zeros.
fn remove(s: &Shared, start: usize, end: usize) {
    let pieces = s.regions.read().unwrap_or_else(|e| e.into_inner()).overlapping(start, end);
    for p in pieces {
        discard(s, &p.region, p.lo, p.hi, true);
    }
}

/// munmap of `[start, end)`: the range is gone already.
fn unmap(s: &Shared, start: usize, end: usize) {
    let pieces = s.regions.write().unwrap_or_else(|e| e.into_inner()).cut(start, end);
    for p in pieces {
        discard(s, &p.region, p.lo, p.hi, false);
        if p.region.extents.load(Ordering::Acquire) == 0 {
            teardown(s, &p.region);
        }
    }
}

/// Frees pages `[lo, hi)` of `r`: slots, staged copies, kept slots; every pte ends `None`.
/// `mapped`: the program's range is still mapped (REMOVE), so present pages are moved out
/// and dropped too (see the module comment for why the kernel's own zap is not enough).
pub(crate) fn discard(s: &Shared, r: &RegionInner, lo: usize, hi: usize, mapped: bool) {
    let (mut present, mut staged) = (0i64, 0i64);
    let mut olds = [Pte::NONE; BLOCK_PAGES];
    let mut b = lo;
    while b < hi {
        let e = (b - b % BLOCK_PAGES + BLOCK_PAGES).min(hi);
        if b.is_multiple_of(PTES_PER_CHUNK) && e - b == BLOCK_PAGES && skip_chunk(r, b, hi) {
            // A whole chunk of `None` ptes: nothing to free (a fault that locked one of
            // them first installs into the range after our move-out below could not
            // anyway: it sees `None` and installs zeros, which the zap then drops).
            b = (b + PTES_PER_CHUNK).min(hi);
            continue;
        }
        let (mut any_present, mut any_staged) = (false, false);
        for i in b..e {
            let old = r.ptes.lock(i);
            olds[i - b] = old;
            match old.state() {
                PteState::None => {}
                PteState::Present => {
                    present += 1;
                    any_present = true;
                }
                PteState::Staged => {
                    staged += 1;
                    any_staged = true;
                }
                PteState::Swapped => put_slot(s, old.payload()),
            }
            if let Some(kept) = old.kept_slot() {
                put_slot(s, kept);
            }
        }
        let len = (e - b) * PAGE_SIZE;
        if any_staged || any_present {
            drop_mirror(r, b, len);
        }
        if mapped && any_present {
            move_out(s, r, b, e);
            drop_mirror(r, b, len);
        }
        for i in b..e {
            r.ptes.unlock(i, olds[i - b], Pte::NONE);
        }
        b = e;
    }
    s.present_pages.fetch_sub(present, Ordering::Relaxed);
    s.staged_pages.fetch_sub(staged, Ordering::Relaxed);
}

/// Whether the chunk starting at pte `b` lies within `[b, hi)` and holds no live pte.
fn skip_chunk(r: &RegionInner, b: usize, hi: usize) -> bool {
    b + PTES_PER_CHUNK <= hi && !r.ptes.chunk_in_use(b / PTES_PER_CHUNK)
}

/// Drops the mirror's pages `[idx, idx + len_bytes)`.
fn drop_mirror(r: &RegionInner, idx: usize, len_bytes: usize) {
    // SAFETY: mirror pages of locked ptes being discarded: only the pager touches the
    // mirror, and nothing refers to these pages while their ptes are locked. The mirror's
    // userfaultfd has no REMOVE event, so this raises none.
    if let Err(e) = unsafe { sys::madvise(r.mirror_addr(idx), len_bytes, libc::MADV_DONTNEED) } {
        eprintln!("tierswap: releasing discarded staged pages at {:#x} failed: {e}", r.mirror_addr(idx));
    }
}

/// Moves whatever is mapped in the program's pages `[lo, hi)` (locked) to the mirror, where
/// the caller drops it. A page the kernel will not move (shared after fork: EBUSY) is left
/// to the kernel's own zap: it was mapped before the event, not installed after it.
fn move_out(s: &Shared, r: &RegionInner, lo: usize, hi: usize) {
    let mut i = lo;
    let mut again = 0;
    while i < hi {
        // SAFETY: the pages are locked ptes being discarded by the program's own
        // MADV_DONTNEED: their contents are thrown away whatever we do, and the mirror's
        // pages at the same offsets were just dropped (holes, as the move needs).
        let res =
            unsafe { s.mirror_uffd.move_pages(r.mirror_addr(i), r.page_addr(i), (hi - i) * PAGE_SIZE, true, true) };
        match res {
            Ok(_) => return,
            Err(uffd::Error::Busy { done_bytes, .. }) | Err(uffd::Error::PageExist { done_bytes, .. }) => {
                i += done_bytes / PAGE_SIZE + 1;
            }
            Err(uffd::Error::Again { done_bytes, .. }) if again < 8 => {
                again += 1;
                i += done_bytes / PAGE_SIZE;
            }
            // The range went away meanwhile (munmap follows): nothing left to zap.
            Err(_) => return,
        }
    }
}

/// mremap moved `[from, from + len)` to `to`: the kernel moved the present pages; staged
/// and swapped pages follow here, into a new region per piece of the old range.
fn remap(s: &Shared, from: usize, to: usize, len: usize) {
    let pieces = s.regions.write().unwrap_or_else(|e| e.into_inner()).cut(from, from + len);
    for p in pieces {
        let r = &p.region;
        let n = p.hi - p.lo;
        let new_start = to + (r.page_addr(p.lo) - from);
        let mode = RegisterMode { missing: true, wp: r.clean_tracking, minor: false };
        match s.new_region_at(new_start, n, r.hint, mode, true) {
            Ok(new) => {
                for k in 0..n {
                    // Fresh ptes: nobody else holds them. Faults on the new range wait
                    // until each page is in place.
                    new.ptes.lock(k);
                }
                s.regions.write().unwrap_or_else(|e| e.into_inner()).insert(new.clone());
                transfer(s, r, p.lo, p.hi, &new);
            }
            Err(e) => {
                eprintln!(
                    "tierswap: cannot follow mremap to {new_start:#x} ({e}); the moved pages that were swapped out read as zeros"
                );
                discard(s, r, p.lo, p.hi, false);
            }
        }
        if r.extents.load(Ordering::Acquire) == 0 {
            teardown(s, r);
        }
    }
}

/// Moves the state of pages `[lo, hi)` of `old` to pages `[0, hi - lo)` of `new` (whose
/// ptes the caller locked): staged pages move mirror to mirror, slots change hands.
fn transfer(s: &Shared, old: &RegionInner, lo: usize, hi: usize, new: &Arc<RegionInner>) {
    let mut olds = [Pte::NONE; BLOCK_PAGES];
    let mut b = lo;
    while b < hi {
        // Blocks aligned in the new region, so staged pages land in its inactive blocks.
        let nb = b - lo;
        let e = (b + BLOCK_PAGES - nb % BLOCK_PAGES).min(hi);
        let mut any_staged = false;
        for i in b..e {
            olds[i - b] = old.ptes.lock(i);
            any_staged |= olds[i - b].state() == PteState::Staged;
        }
        if any_staged {
            let mut i = b;
            while i < e {
                if olds[i - b].state() != PteState::Staged {
                    i += 1;
                    continue;
                }
                let run = i;
                while i < e && olds[i - b].state() == PteState::Staged {
                    i += 1;
                }
                move_mirror(s, old, run, new, run - lo, i - run);
            }
            s.inactive.lock().unwrap_or_else(|e| e.into_inner()).push_back((new.id, nb / BLOCK_PAGES));
        }
        for i in b..e {
            let o = olds[i - b];
            let moved = match o.state() {
                PteState::Present => {
                    // The kernel moved the page; it may still be write-protected, and a
                    // write then only drops the (gone) kept slot. Known dirty from here.
                    if let Some(kept) = o.kept_slot() {
                        put_slot(s, kept);
                    }
                    Pte::present()
                }
                _ => o,
            };
            old.ptes.unlock(i, o, Pte::NONE);
            new.ptes.unlock(i - lo, Pte::NONE, moved);
        }
        b = e;
    }
}

/// Moves `n` staged pages from `old`'s mirror at `from` to `new`'s mirror at `to`; a page
/// that cannot move is copied.
fn move_mirror(s: &Shared, old: &RegionInner, from: usize, new: &RegionInner, to: usize, n: usize) {
    let mut k = 0;
    while k < n {
        // SAFETY: locked staged pages: their only copy is in `old`'s mirror, which only the
        // pager touches; `new`'s mirror is fresh and empty there.
        let res = unsafe {
            s.mirror_uffd.move_pages(
                new.mirror_addr(to + k),
                old.mirror_addr(from + k),
                (n - k) * PAGE_SIZE,
                true,
                true,
            )
        };
        match res {
            Ok(_) => return,
            Err(uffd::Error::Busy { done_bytes, .. })
            | Err(uffd::Error::Again { done_bytes, .. })
            | Err(uffd::Error::PageExist { done_bytes, .. }) => {
                k += done_bytes / PAGE_SIZE;
                // SAFETY: the staged page's bytes in `old`'s mirror, under its pte lock.
                let page = unsafe { std::slice::from_raw_parts(old.mirror_addr(from + k) as *const u8, PAGE_SIZE) };
                if let Err(e) = s.mirror_uffd.copy(new.mirror_addr(to + k), page, true, false) {
                    if !matches!(e, uffd::Error::PageExist { .. }) {
                        crate::fault::fatal(&format!("cannot follow an mremap'd staged page: {e}"));
                    }
                }
                k += 1;
            }
            Err(e) => crate::fault::fatal(&format!("cannot follow an mremap'd staged page: {e}")),
        }
    }
}

/// Frees everything region `r` still holds and unmaps its mirror. Its program range is
/// already unmapped or moved away, and it is out of the map.
pub(crate) fn teardown(s: &Shared, r: &RegionInner) {
    r.dead.store(true, Ordering::SeqCst);
    // Wait for reclaim to finish anything it started on this region.
    let guard = r.reclaim_lock.lock().unwrap_or_else(|e| e.into_inner());
    if r.gone.swap(true, Ordering::AcqRel) {
        return;
    }
    discard(s, r, 0, r.n_pages, false);
    let len = pages_to_bytes(r.n_pages);
    let _ = s.mirror_uffd.unregister(r.mirror, len);
    // SAFETY: every pte is None, the region is out of the map and dead: nothing will look
    // at its mirror again (fault threads only touch mirror pages of locked staged ptes).
    unsafe {
        let _ = sys::munmap(r.mirror, len);
    }
    drop(guard);
    s.refresh_metadata();
}
