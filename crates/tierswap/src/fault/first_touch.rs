//! First touch: a zero page (a zeroed copy for a write), and first-touch fault-around for
//! a program filling memory in order.
//!
//! Owns: nothing. Calls: the memory manager, `uffd` installs under the event gates.

use std::sync::atomic::Ordering;

use crate::config::MAX_FAULT_AROUND_PAGES;
use crate::mm::{RegionInner, Shared};
use crate::page::{BLOCK_PAGES, PAGE_SIZE};
use crate::pagetable::{Pte, PteState};
use crate::uffd;

use super::settle_install;

/// Maps a zero page at `addr` (a zeroed copy for writes, saving the write fault after).
/// Says whether a page is there now.
pub(super) fn install_zero(s: &Shared, r: Option<&RegionInner>, addr: usize, write: bool, dontwake: bool) -> bool {
    let install = || {
        if write {
            static ZERO_PAGE: [u8; PAGE_SIZE] = [0; PAGE_SIZE];
            s.uffd.copy(addr, &ZERO_PAGE, dontwake, false)
        } else {
            s.uffd.zeropage(addr, PAGE_SIZE, dontwake)
        }
    };
    // Memory no region holds (`r` None) is unmanaged: nothing of ours can be there.
    let res = match r {
        Some(r) => s.guarded(r, install),
        None => install(),
    };
    settle_install(s, addr, res)
}

/// First-touch fault-around: when a first-touch fault at `idx` continues a fill in order,
/// the untouched pages after it are mapped in the same call: zeroed pages of their own for
/// a write (the writes that follow take no fault), the zero page for a read. A fill in
/// order is a fault where the region's last first touch ended: the window is 64 KiB to
/// start with and doubles while the fill goes on, up to `fault_around_max_pages`. Or a
/// fault right after a present page (one of several fills taking turns in one region: a
/// heap's size-class spans, Python's objects in an allocator's arena; `first_touch_follow`):
/// 64 KiB. Returns how many pages were mapped after `idx`; `idx` itself is installed and
/// locked by the caller.
pub(super) fn first_touch_around(s: &Shared, r: &RegionInner, idx: usize, write: bool) -> usize {
    let continues = r.first_touch_next.load(Ordering::Relaxed) == idx;
    let follows =
        !continues && s.config.first_touch_follow && idx > 0 && r.ptes.load(idx - 1).state() == PteState::Present;
    if !(continues || follows) || !s.config.fault_around {
        r.first_touch_next.store(idx + 1, Ordering::Relaxed);
        r.first_touch_window.store(0, Ordering::Relaxed);
        return 0;
    }
    let budget_pages = (s.budget() / PAGE_SIZE as u64) as usize;
    let max = (s.config.fault_around_max_pages as usize).min(budget_pages / 64).clamp(1, MAX_FAULT_AROUND_PAGES);
    let window = if continues || s.config.first_touch_follow_grow {
        let w = (r.first_touch_window.load(Ordering::Relaxed) * 2).clamp(BLOCK_PAGES.min(max), max);
        r.first_touch_window.store(w, Ordering::Relaxed);
        w
    } else {
        BLOCK_PAGES.min(max)
    };
    // Not into pages the program cannot touch (an uncommitted part of a reservation): the
    // kernel would install them, and reclaim could not stage them (mm/protect.rs).
    let to = (idx + window).min(r.n_pages);
    let to = r.protections.first_in(idx + 1, to).unwrap_or(to);
    let mut olds = [Pte::NONE; MAX_FAULT_AROUND_PAGES];
    let mut end = idx + 1;
    while end < to {
        let Some(p) = r.ptes.try_lock_in(end, PteState::None) else { break };
        olds[end - idx - 1] = p;
        end += 1;
    }
    let n = end - idx - 1;
    if n == 0 || !s.maps(r, r.page_addr(end - 1)) {
        unlock_unchanged_from(r, &olds, idx + 1, idx + 1, end);
        r.first_touch_next.store(idx + 1, Ordering::Relaxed);
        return 0;
    }
    // Installed a 64 KiB block at a time: one zeroed source serves every chunk.
    static ZEROS: [u8; BLOCK_PAGES * PAGE_SIZE] = [0; BLOCK_PAGES * PAGE_SIZE];
    let mut done = 0;
    while done < n {
        let chunk = (n - done).min(BLOCK_PAGES);
        let (addr, len) = (r.page_addr(idx + 1 + done), chunk * PAGE_SIZE);
        let res = s.guarded(r, || {
            if write {
                s.uffd.copy(addr, &ZEROS[..len], true, false)
            } else {
                s.uffd.zeropage(addr, len, true)
            }
        });
        // A partial install (the range going away, a page the kernel has already) leaves
        // the rest untouched: they fault on their own.
        let (got, whole) = match res {
            Ok(bytes) => (bytes / PAGE_SIZE, bytes == len),
            Err(
                uffd::Error::PageExist { done_bytes, .. }
                | uffd::Error::Again { done_bytes, .. }
                | uffd::Error::NoPage { done_bytes, .. },
            ) => (done_bytes / PAGE_SIZE, false),
            Err(_) => (0, false),
        };
        done += got.min(chunk);
        if !whole {
            break;
        }
    }
    for k in idx + 1..idx + 1 + done {
        r.ptes.unlock(k, olds[k - idx - 1], Pte::present());
    }
    unlock_unchanged_from(r, &olds, idx + 1, idx + 1 + done, end);
    s.acct.present_pages.fetch_add(done as i64, Ordering::Relaxed);
    s.counters.fault_around_pages.fetch_add(done as u64, Ordering::Relaxed);
    r.first_touch_next.store(idx + 1 + done, Ordering::Relaxed);
    done
}

/// Unlocks pages `[from, to)` unchanged, locked as `olds[k - base]`.
fn unlock_unchanged_from(r: &RegionInner, olds: &[Pte], base: usize, from: usize, to: usize) {
    for k in from..to {
        r.ptes.unlock(k, olds[k - base], olds[k - base]);
    }
}
