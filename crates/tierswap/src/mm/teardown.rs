//! Letting go of program memory: discarding pages (their slots, staged copies, kept
//! slots), cutting a range out of the map, and tearing a region down once nothing of it
//! is left.
//!
//! Owns: nothing. Calls: the region map, slot release, `uffd` and `sys` on mirrors.

use std::sync::atomic::Ordering;

use super::region::RegionInner;
use super::slots::put_slot;
use super::Shared;
use crate::page::{pages_to_bytes, BLOCK_PAGES, PAGE_SIZE};
use crate::pagetable::{Pte, PteState, PTES_PER_CHUNK};
use crate::sys;
use crate::trail::What;

/// Cuts `[start, end)` out of the map and frees the pages cut, tearing down the regions
/// left without an extent: the range is gone (an UNMAP's, or a stale extent the kernel
/// has handed out again).
pub(crate) fn forget(s: &Shared, start: usize, end: usize) {
    let pieces = s.regions.map.write().unwrap_or_else(|e| e.into_inner()).cut(start, end);
    for p in pieces {
        s.trail.mark(What::Cut, p.region.page_addr(p.lo), p.region.page_addr(p.hi), 0, p.region.id);
        discard(s, &p.region, p.lo, p.hi);
        if p.region.extents.load(Ordering::Acquire) == 0 && !s.regions.displaced.holds(&p.region) {
            teardown(s, &p.region);
        }
    }
}

/// Frees pages `[lo, hi)` of `r`: slots, staged copies, kept slots; every pte ends `None`.
/// Present pages are the kernel's to drop (the zap of a REMOVE, the unmap itself).
pub(crate) fn discard(s: &Shared, r: &RegionInner, lo: usize, hi: usize) {
    let (mut present, mut staged) = (0i64, 0i64);
    let mut olds = [Pte::NONE; BLOCK_PAGES];
    let mut b = lo;
    while b < hi {
        let e = (b - b % BLOCK_PAGES + BLOCK_PAGES).min(hi);
        if b.is_multiple_of(PTES_PER_CHUNK) && e - b == BLOCK_PAGES && skip_chunk(r, b, hi) {
            // A whole chunk of `None` ptes: nothing to free.
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
                PteState::Swapped => put_slot(s, old.slot()),
            }
            if let Some(kept) = old.kept_slot() {
                put_slot(s, kept);
            }
        }
        if any_staged || any_present {
            drop_mirror(r, b, (e - b) * PAGE_SIZE);
        }
        for i in b..e {
            r.ptes.unlock(i, olds[i - b], Pte::NONE);
        }
        b = e;
    }
    s.acct.present_pages.fetch_sub(present, Ordering::Relaxed);
    s.acct.staged_pages.fetch_sub(staged, Ordering::Relaxed);
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

/// Frees everything region `r` still holds and unmaps its mirror. Its program range is
/// already unmapped or moved away, and it is out of the map.
pub(crate) fn teardown(s: &Shared, r: &RegionInner) {
    r.dead.store(true, Ordering::SeqCst);
    // Wait for reclaim to finish anything it started on this region.
    let guard = r.reclaim_lock.write().unwrap_or_else(|e| e.into_inner());
    if r.gone.swap(true, Ordering::AcqRel) {
        return;
    }
    s.trail.mark(What::Teardown, r.start, r.start + r.len_bytes(), 0, r.id);
    discard(s, r, 0, r.n_pages);
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
