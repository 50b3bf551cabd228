//! A write to a clean page (present, write-protected, keeping its slot): the slot is given
//! up and the write let through, for the whole 64 KiB block or (`wp_block_adapt`, unless
//! the region's last write fault was nearby or the page before is written) the page alone.
//! A write to a page of inherited memory taken over while still shared makes the page
//! present.
//!
//! Owns: nothing. Calls: the memory manager's slot release, `uffd` write protection.

use std::sync::atomic::Ordering;

use crate::mm::slots::put_slot;
use crate::mm::{Lookup, Shared};
use crate::page::{BLOCK_PAGES, PAGE_SIZE};
use crate::pagetable::{Pte, PteState};

/// A write to a clean page (one that kept its slot, write-protected): its slot no longer
/// matches what the page will hold, so give it up, then let the write through. The whole
/// 64 KiB block is done at once: a program writing one page of a block it read in usually
/// writes the rest, and each page would cost a fault of its own. With `wp_block_adapt`
/// only when the region's last write fault was in this block or a neighbour, or the page
/// before this one is written already (present without a kept slot): a program
/// writing one item here and one there (memcached's access times, sqlite's page headers)
/// writes none of the pages around it, which keep their slots and leave again for free.
pub(super) fn handle_wp_fault(s: &Shared, addr: usize) {
    let page_addr = addr & !(PAGE_SIZE - 1);
    let Lookup::Region(r, idx) = s.lookup(page_addr) else {
        s.wake(page_addr, PAGE_SIZE);
        return;
    };
    s.counters.faults_wp.fetch_add(1, Ordering::Relaxed);
    let block_start = idx - idx % BLOCK_PAGES;
    // Counted whatever the setting: write prediction weighs the same faults.
    let nearby = s.writes.note_write_fault(&r.wp_last_block, idx / BLOCK_PAGES);
    // The page before written already (present, no kept slot) is a writer running along the
    // address space, whichever thread wrote it (threads filling their own parts of one
    // region take turns in `wp_last_block`).
    let whole = !s.config.wp_block_adapt
        || nearby
        || idx > 0 && {
            let prev = r.ptes.load(idx - 1);
            prev.state() == PteState::Present && prev.kept_slot().is_none()
        };
    let block_end = (block_start + BLOCK_PAGES).min(r.n_pages);
    let mut locked = [None; BLOCK_PAGES];
    let first = r.ptes.lock(idx);
    if !s.maps(&r, page_addr) {
        // Cut from the region since the lookup (see handle_fault): fault again.
        r.ptes.unlock(idx, first, first);
        s.wake(page_addr, PAGE_SIZE);
        return;
    }
    locked[idx - block_start] = Some(first);
    for i in block_start..block_end {
        if i != idx && whole {
            locked[i - block_start] = r.ptes.try_lock_in(i, PteState::Present);
        }
    }
    // Only pages whose slot is gone (or never kept) may become writable: a page left locked
    // by someone else keeps its protection, and faults again if written.
    let mut i = block_start;
    while i < block_end {
        let Some(old) = locked[i - block_start] else {
            i += 1;
            continue;
        };
        let run = i;
        let mut cur = Some(old);
        while let Some(old) = cur {
            if old.state() == PteState::Present {
                if let Some(kept) = old.kept_slot() {
                    put_slot(s, kept);
                }
            }
            i += 1;
            cur = if i < block_end { locked[i - block_start] } else { None };
        }
        // Pages of the run that are not present (staged or swapped meanwhile) have no pte
        // in the program's range; unprotecting them is a no-op.
        let _ = s.guarded(&r, || s.uffd.writeprotect(r.page_addr(run), (i - run) * PAGE_SIZE, false, true));
        for k in run..i {
            let old = locked[k - block_start].expect("locked above");
            let new = match old.state() {
                PteState::Present => old.without_kept_slot(),
                // A page of inherited memory still shared with the parent when this pager
                // took it over (mm/mapping.rs, `adopt_inherited`): written, it is a copy of
                // this process's own from now on, counted and evicted like any.
                PteState::None if k == idx && crate::sys::is_resident(page_addr) => {
                    s.acct.present_pages.fetch_add(1, Ordering::Relaxed);
                    Pte::present()
                }
                _ => old,
            };
            r.ptes.unlock(k, old, new);
        }
    }
    // Wakes the writer: it retries, and takes a missing-page fault if its page was staged.
    s.wake(page_addr, PAGE_SIZE);
}
