//! Bringing pages in before they are touched, beside the program: stride prefetch after a
//! lone fault, and disk readahead into the mirror (staged pages on the inactive list).
//!
//! Owns: nothing. Calls: the memory manager, the stride and readahead policies.

use std::sync::atomic::Ordering;

use crate::backend::file::{AlignedBuf, UnitCache};
use crate::mm::slots::{free_backend, release_entry};
use crate::mm::swap_io::{read_entry, ReadIo};
use crate::mm::{RegionInner, Shared};
use crate::page::{BLOCK_PAGES, PAGE_SIZE};
use crate::pagetable::{Pte, PteState};
use crate::swap::{SwapEntry, Tag};

use super::swapin::{keeps_slot, pool_roomy};
use super::{settle_install, try_lock, Scratch};

/// Stride prefetch after a lone fault on swapped page `idx`, whose thread runs again
/// already: when the region's lone faults keep one stride, the next pages along it come
/// into place now (`policy/stride.rs`), each as a clean page where its tier allows. Stops
/// where the budget would be passed: a prefetch never makes a fault wait for room. Returns
/// whether the faults kept a stride (the caller then reads nothing ahead from the disk).
pub(super) fn prefetch_stride(s: &Shared, r: &RegionInner, idx: usize, scratch: &mut Scratch) -> bool {
    let max = s.config.stride_prefetch_max_pages;
    if max == 0 || r.hint == crate::config::Hint::Random {
        return false;
    }
    // Another thread deciding for this region meanwhile: this fault only loses its window.
    let Some(p) = r.stride.try_lock().ok().and_then(|mut st| st.fault(idx, r.n_pages, max)) else {
        return false;
    };
    s.counters.swap_prefetch_hit.fetch_add(p.passed as u64, Ordering::Relaxed);
    let mut shared_unit = s.tiers.unit_cache.as_ref().and_then(try_lock);
    let unit = match shared_unit.as_deref_mut() {
        Some(c) => c,
        None => &mut scratch.io.unit,
    };
    // Stride pages evicted together lie together in the file: read whole units.
    unit.whole = true;
    for k in 0..p.count as usize {
        if s.footprint_bytes() + PAGE_SIZE as u64 > s.budget() {
            s.kick_reclaim();
            break;
        }
        let j = p.first + k * p.step;
        prefetch_page(s, r, j, unit, &mut scratch.io.page, &mut scratch.io.read);
    }
    if s.footprint_bytes() > s.high_watermark() {
        s.kick_reclaim();
    }
    true
}

/// Brings swapped page `j` of `r` into place if it is free to take (pte and entry unlocked,
/// not shared with a forked child, not remote): a prefetch never waits, and a page it skips
/// comes in on its own fault as usual. An unreadable page is left for its fault to report.
fn prefetch_page(s: &Shared, r: &RegionInner, j: usize, unit: &mut UnitCache, page: &mut AlignedBuf, io: &mut ReadIo) {
    let Some(pte) = r.ptes.try_lock_in(j, PteState::Swapped) else {
        return;
    };
    let slot = pte.slot();
    let e = match s.tiers.swap.try_lock(slot) {
        Some(e) if e.count() == 1 && e.tag() != Tag::Remote => e,
        other => {
            if let Some(e) = other {
                s.tiers.swap.unlock(slot, e, e);
            }
            r.ptes.unlock(j, pte, pte);
            return;
        }
    };
    let addr = r.page_addr(j);
    let data = match read_entry(s, slot, e, page.as_mut_slice(), unit, io) {
        Ok(data) => data,
        Err(_) => {
            s.tiers.swap.unlock(slot, e, e);
            r.ptes.unlock(j, pte, pte);
            return;
        }
    };
    let keep = data && keeps_slot(s, r, e, slot, false, pool_roomy(s));
    let res = s.guarded(r, || {
        if data {
            s.uffd.copy(addr, &page.as_slice()[..PAGE_SIZE], false, keep)
        } else {
            s.uffd.zeropage(addr, PAGE_SIZE, false)
        }
    });
    if let Err(err) = res {
        // The range is changing (an event in flight) or going: the page stays swapped.
        let _ = settle_install(s, addr, Err(err));
        s.tiers.swap.unlock(slot, e, e);
        r.ptes.unlock(j, pte, pte);
        return;
    }
    if keep {
        s.tiers.swap.unlock(slot, e, e);
        r.ptes.unlock(j, pte, Pte::present_clean(slot));
    } else {
        release_entry(s, slot, e);
        r.ptes.unlock(j, pte, Pte::present());
    }
    s.acct.present_pages.fetch_add(1, Ordering::Relaxed);
    s.counters.swap_prefetch.fetch_add(1, Ordering::Relaxed);
}

/// The pages a readahead window of `window` pages (the faulting page `idx` included) reads,
/// as `[from, to)`, in a region of `n_pages`. When large swap-in is possible (`large`), the
/// rest of the faulting 64 KiB block is left alone: the block's next fault brings it in whole
/// in one swap-in, and the file copy holds its records already (`swap_in`), where a
/// read-ahead page costs a fault of its own on first touch. Readahead then only reaches past
/// the block, for a stream that crosses blocks; an empty range reads nothing.
pub(super) fn readahead_range(idx: usize, window: usize, n_pages: usize, large: bool) -> (usize, usize) {
    let to = idx.saturating_add(window).min(n_pages);
    let from = if large { (idx / BLOCK_PAGES + 1) * BLOCK_PAGES } else { idx + 1 };
    (from.min(to), to)
}

/// Reads the disk-backed pages among `[from, to)` into staging (marked read-ahead), where
/// their first touch finds them in memory. Pages in other tiers, shared by fork, or busy
/// are left alone: readahead is a guess and never waits.
pub(super) fn read_ahead(s: &Shared, r: &RegionInner, from: usize, to: usize, scratch: &mut Scratch) {
    // The copy the fault just read into, if free (see swap_in).
    let mut shared_unit = if scratch.in_thread { None } else { s.tiers.unit_cache.as_ref().and_then(try_lock) };
    let unit = match shared_unit.as_deref_mut() {
        Some(c) => c,
        None => &mut scratch.io.unit,
    };
    unit.whole = true;
    let mut read = 0u64;
    let mut last_block = usize::MAX;
    for j in from..to {
        let Some(old) = r.ptes.try_lock_in(j, PteState::Swapped) else {
            continue;
        };
        let slot = old.slot();
        let Some(e) = s.tiers.swap.try_lock(slot) else {
            r.ptes.unlock(j, old, old);
            continue;
        };
        let ok = e.tag() == Tag::File
            && e.count() == 1
            && matches!(read_entry(s, slot, e, scratch.io.page.as_mut_slice(), unit, &mut scratch.io.read), Ok(true))
            && s.mirror_uffd.copy(r.mirror_addr(j), &scratch.io.page.as_slice()[..PAGE_SIZE], true, false).is_ok();
        if !ok {
            // A failed read here is left for the page's own fault, which reports it.
            s.tiers.swap.unlock(slot, e, e);
            r.ptes.unlock(j, old, old);
            continue;
        }
        free_backend(s, e);
        s.tiers.swap.unlock(slot, e, SwapEntry::FREE);
        r.ptes.unlock(j, old, Pte::staged_readahead());
        s.acct.staged_pages.fetch_add(1, Ordering::Relaxed);
        read += 1;
        let block = j / BLOCK_PAGES;
        if block != last_block {
            // On the inactive list, like any staged block: evicted again if unused.
            s.acct.inactive.lock().unwrap_or_else(|e| e.into_inner()).push_back((r.id, block));
            last_block = block;
        }
    }
    s.counters.swap_ra.fetch_add(read, Ordering::Relaxed);
    if read > 0 && s.footprint_bytes() > s.high_watermark() {
        s.kick_reclaim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readahead_leaves_the_faulting_block_to_large_swap_in() {
        // Order-0 swap-ins: the window starts at the next page.
        assert_eq!(readahead_range(5, 8, 1000, false), (6, 13));
        // Large swap-in: nothing of block 0 (pages 0..16) is read ahead…
        assert_eq!(readahead_range(5, 8, 1000, true), (13, 13));
        // …only what the window reaches past it.
        assert_eq!(readahead_range(5, 32, 1000, true), (16, 37));
        assert_eq!(readahead_range(15, 2, 1000, true), (16, 17));
        assert_eq!(readahead_range(16, 32, 1000, true), (32, 48));
        // The region's end bounds both forms.
        assert_eq!(readahead_range(995, 32, 1000, false), (996, 1000));
        assert_eq!(readahead_range(990, 32, 1000, true), (992, 1000));
        assert_eq!(readahead_range(997, 32, 1000, true), (1000, 1000));
    }
}
