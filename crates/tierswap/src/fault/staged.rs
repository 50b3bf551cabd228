//! A fault on a staged page: it moves back from the mirror, with its staged neighbours in
//! the 64 KiB block (fault-around, one UFFDIO_MOVE per run) where the program runs along
//! the address space.
//!
//! Owns: nothing. Calls: the memory manager, `uffd` moves under the event gates.

use std::sync::atomic::Ordering;

use crate::mm::slots::put_slot;
use crate::mm::{RegionInner, Shared};
use crate::page::{BLOCK_PAGES, PAGE_SIZE};
use crate::pagetable::{Pte, PteState};
use crate::sys::{self, fatal};
use crate::uffd;

use super::first_touch::install_zero;

/// Moves the staged page at `idx` back, with its staged neighbours in the same 64 KiB block
/// (fault-around: they would otherwise cost a fault each), read-ahead pages excepted.
/// With `staged_around_adapt`, the neighbours come only when this fault continues where the
/// region's previous staged fault left off ([`around_wanted`]).
/// Wakes nobody on success: returns the pages the caller wakes once its bookkeeping is done.
pub(super) fn unstage_around(s: &Shared, r: &RegionInner, idx: usize) -> Option<(usize, usize)> {
    let block_start = idx - idx % BLOCK_PAGES;
    let block_end = (block_start + BLOCK_PAGES).min(r.n_pages);
    let around = around_wanted(s, r, idx, block_end - 1);
    // Lock the faulting page first (waiting), then neighbours opportunistically.
    let first = r.ptes.lock(idx);
    if first.state() != PteState::Staged {
        // Someone else moved it meanwhile: just make sure the waiter wakes.
        r.ptes.unlock(idx, first, first);
        s.wake(r.page_addr(idx), PAGE_SIZE);
        return None;
    }
    let mut locked = [false; BLOCK_PAGES];
    locked[idx - block_start] = true;
    for i in block_start..block_end {
        if i == idx || !around {
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
        moved_pages += move_back(s, r, run_start, i, idx);
    }
    s.acct.staged_pages.fetch_sub(moved_pages, Ordering::Relaxed);
    s.acct.present_pages.fetch_add(moved_pages, Ordering::Relaxed);
    s.counters.fault_around_pages.fetch_add(neighbours_moved(moved_pages), Ordering::Relaxed);
    s.counters.pgactivate.fetch_add(moved_pages as u64, Ordering::Relaxed);
    Some((block_start, block_end))
}

/// Whether a staged fault at page `idx` brings its staged neighbours (up to `block_last`,
/// its block's last page): always with plain fault-around; with `staged_around_adapt` only
/// when it lands within two pages of where the region's previous staged fault left off (a
/// program reading along the address space; the first fault of its run costs one more).
/// A random touch leaves the neighbours staged: it proves its own page hot, and the
/// neighbours are judged on their own by the time they reach the list's end. Pages, not
/// blocks: a program's small regions (a 1 MiB arena is 16 blocks) put random faults in
/// neighbouring blocks often.
fn around_wanted(s: &Shared, r: &RegionInner, idx: usize, block_last: usize) -> bool {
    if !s.config.fault_around {
        return false;
    }
    if !s.config.staged_around_adapt {
        return true;
    }
    let last = r.staged_last_page.load(Ordering::Relaxed);
    let around = last != usize::MAX && last.abs_diff(idx) <= 2;
    r.staged_last_page.store(if around { block_last } else { idx }, Ordering::Relaxed);
    around
}

/// The neighbours among `moved` pages moved back for one fault: all but the faulting page.
/// None when nothing moved (the faulting page stayed staged for an unmap's event handler).
fn neighbours_moved(moved: i64) -> u64 {
    (moved - 1).max(0) as u64
}

/// Moves locked staged pages `[from, to)` from the mirror back into the region and unlocks
/// them as present: active, or (with `active_protect_pct`) only the faulting page `idx`,
/// so that fault-around does not activate neighbours nobody touched. Returns the number of
/// pages moved or zero-filled.
fn move_back(s: &Shared, r: &RegionInner, from: usize, to: usize, idx: usize) -> i64 {
    let all_active = s.config.active_protect_pct == 0;
    let mut i = from;
    let mut n = 0;
    let mut again = 0;
    // Set once a move over several pages met the end of one of the kernel's VMAs (below).
    let mut one_by_one = false;
    while i < to {
        let len = if one_by_one { PAGE_SIZE } else { (to - i) * PAGE_SIZE };
        // SAFETY: the pages [i, to) are locked staged pages: their only copy is at the same
        // offset in the mirror, which only the pager touches, and the program's range there
        // is empty (the program faults on it). Moving them back is what the program expects.
        let res = s.guarded(r, || unsafe { s.uffd.move_pages(r.page_addr(i), r.mirror_addr(i), len, true, false) });
        let mut stop = false;
        let done_pages = match res {
            Ok(bytes) => bytes / PAGE_SIZE,
            Err(uffd::Error::NoPage { done_bytes, .. } | uffd::Error::Again { done_bytes, .. })
                if done_bytes == 0
                    && sys::is_resident(r.mirror_addr(i))
                    && !sys::is_resident(r.page_addr(i))
                    && !s.maps(r, r.page_addr(i)) =>
            {
                // The page is in the mirror but the program's range is gone (munmap, mremap
                // handled or queued): it stays staged for the event handler.
                unlock_unchanged(r, i, to);
                stop = true;
                0
            }
            Err(uffd::Error::NoPage { done_bytes, .. })
                if sys::is_resident(r.mirror_addr(i + done_bytes / PAGE_SIZE)) =>
            {
                // ENOENT with the page in the mirror: the destination is gone (an mremap or
                // munmap whose event is not handled yet). Leave the rest staged.
                let done = done_bytes / PAGE_SIZE;
                unlock_unchanged(r, i + done, to);
                stop = true;
                done
            }
            Err(uffd::Error::NoPage { done_bytes, .. }) => {
                // A hole in the mirror at the page after the moved ones: it was a zero page.
                let at = i + done_bytes / PAGE_SIZE;
                install_zero(s, Some(r), r.page_addr(at), false, true);
                done_bytes / PAGE_SIZE + 1
            }
            Err(uffd::Error::PageExist { done_bytes, .. }) => {
                let at = i + done_bytes / PAGE_SIZE;
                s.wake(r.page_addr(at), PAGE_SIZE);
                done_bytes / PAGE_SIZE + 1
            }
            Err(uffd::Error::Again { done_bytes, .. }) if done_bytes > 0 || again < 4 => {
                again += 1;
                done_bytes / PAGE_SIZE
            }
            Err(uffd::Error::Again { done_bytes, .. })
                if sys::is_resident(r.mirror_addr(i + done_bytes / PAGE_SIZE)) =>
            {
                // The page is there: EAGAIN means an event (REMOVE, UNMAP, REMAP) is queued
                // on the program's userfaultfd. Leave the rest staged; the woken thread
                // faults again once the event is handled.
                let done = done_bytes / PAGE_SIZE;
                unlock_unchanged(r, i + done, to);
                stop = true;
                done
            }
            Err(uffd::Error::Again { done_bytes, .. }) => {
                // EAGAIN with no progress, again and again, and no page in the mirror: this
                // kernel's answer for a hole there (see tests/uffd_ops.rs). The page read as
                // zeros when staged.
                let at = i + done_bytes / PAGE_SIZE;
                install_zero(s, Some(r), r.page_addr(at), false, true);
                done_bytes / PAGE_SIZE + 1
            }
            Err(uffd::Error::Invalid { .. }) | Err(uffd::Error::ProcessGone { .. })
                if r.dead.load(Ordering::Acquire) || !s.maps(r, r.page_addr(i)) =>
            {
                // The program's range is gone (munmap, mremap): the pages stay staged for
                // the event handler, which frees or moves them.
                unlock_unchanged(r, i, to);
                stop = true;
                0
            }
            Err(uffd::Error::Invalid { .. }) if !one_by_one && to - i > 1 => {
                // UFFDIO_MOVE takes its range within one VMA, and the program split its
                // range into several with advice that sets a VMA's flags (MADV_HUGEPAGE,
                // MADV_RANDOM, MADV_DONTDUMP: numpy on its arrays), possibly after these
                // pages were staged: the rest go one page at a time.
                one_by_one = true;
                s.counters.move_split_vma.fetch_add(1, Ordering::Relaxed);
                0
            }
            Err(e) => fatal(&format!("moving a staged page back to {:#x} failed: {e}", r.page_addr(i))),
        };
        let mut ra_hits = 0;
        for k in i..i + done_pages {
            let old = r.ptes.load(k);
            ra_hits += old.is_readahead() as u32;
            // The move maps the page writable, beyond write-protect tracking: it is no
            // longer known clean.
            if let Some(kept) = old.kept_slot() {
                put_slot(s, kept);
            }
            r.ptes.unlock(k, old, Pte::present().with_active(all_active || k == idx));
        }
        if ra_hits > 0 {
            r.ra.hit(ra_hits);
            s.counters.swap_ra_hit.fetch_add(ra_hits as u64, Ordering::Relaxed);
        }
        n += done_pages as i64;
        i += done_pages;
        if stop {
            break;
        }
    }
    n
}

/// Unlocks ptes `[from, to)` as they are (work left for a later fault).
fn unlock_unchanged(r: &RegionInner, from: usize, to: usize) {
    for k in from..to {
        let old = r.ptes.load(k);
        r.ptes.unlock(k, old, old);
    }
}

#[cfg(test)]
mod tests {
    use super::neighbours_moved;

    #[test]
    fn a_fault_that_moved_nothing_counts_no_neighbours() {
        assert_eq!(neighbours_moved(0), 0);
        assert_eq!(neighbours_moved(1), 0);
        assert_eq!(neighbours_moved(16), 15);
    }
}
