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
//!   while we still work; for UNMAP and REMAP the range is free already, and another
//!   mapping may be made there before we have handled the event. Every page is handled
//!   under its pte lock, taken in pte order.
//! - From the read of a REMOVE, UNMAP or REMAP to the end of its handling, the regions it
//!   concerns are *leaving* (`Shared::read_program_events` marks them under the install
//!   gate): nothing is installed in their program range and nothing is moved out of it
//!   (`Shared::guarded`). Before the read, the kernel answers EAGAIN itself. So a fault
//!   thread that locked a page before the handler cannot install its old bytes after a
//!   REMOVE's zap, and neither it nor reclaim can reach into a mapping made where an
//!   unmapped or moved range was. After the handler a REMOVE'd pte is `None`, and any
//!   later fault installs zeros.
//! - A new region enters the map under the event lock, and only once no old extent
//!   overlaps it (`Shared::claim_range`): the kernel queues UNMAP / REMAP only after it let
//!   go of the range, so another thread can map the address again before the event is read,
//!   or while it is being handled. The new region would otherwise be cut by the old event,
//!   and an mremap's swapped pages would follow it instead of the moved range (they read as
//!   zeros: tests/address_reuse.rs). The kernel follows a REMAP with an UNMAP of the old
//!   range, so that range stays claimed until then too ([`RemappedFrom`]).
//! - A *REMAP's* new range cannot wait that way (the handler holds the event lock the
//!   events behind it need). An old extent found there is stale just the same (the kernel
//!   has put the moved range there), so the handler *displaces* it: out of the map, its
//!   ptes kept and its region leaving, until its own UNMAP or REMAP comes and finds it
//!   ([`Displaced`]). That UNMAP / REMAP then acts on the displaced piece, not on the new
//!   region over it; so does the trailing UNMAP of an mremap whose old range a REMAP's
//!   new range has taken. (Seen once in CI: a thread preempted between its munmap's
//!   unlock and the queueing of its event; the old UNMAP then cut the moved region and its
//!   swapped pages faulted for good.)
//! - Installs into the program's range fail with EAGAIN while an event is queued; the
//!   fault path leaves such pages as they were and wakes the thread, which faults again.
//! - Reclaim and writeback: they hold the pte lock (reclaim) or the swap entry lock
//!   (writeback) across every change, so an event handler that takes the pte lock after
//!   them frees what they left (a slot, a staged page) and nothing comes back.
//! - Teardown (the last extent of a region unmapped, or its `Region` dropped) marks the
//!   region dead, waits for reclaim's lock, frees every pte and unmaps the mirror.
//! - A fault on an address the map does not know takes the event lock (so an event being
//!   handled, e.g. a REMAP creating the region, completes first) and looks again; memory
//!   still unknown then gets a zero page and is not managed if its mapping (VMA) holds a
//!   region too (an mremap that grew a mapping: the kernel reports only the old length).
//!   Otherwise the message outlived its page (queued before an munmap or mremap, read
//!   after) and the address may be another mapping's by now: it is only woken.

pub(crate) mod fork;
pub(crate) mod grant;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::mm::changes::DisplacedPiece;
use crate::mm::slots::put_slot;
use crate::mm::teardown::{discard, forget, teardown};
use crate::mm::{Piece, RegionInner, Shared};
use crate::page::{pages_to_bytes, BLOCK_PAGES, PAGE_SIZE};
use crate::pagetable::{Pte, PteState};
use crate::sys;
use crate::trail::What;
use crate::uffd::{self, Event, RegisterMode};

/// The parts of `[start, end)` outside every range of `holes` (sorted, disjoint).
fn outside(start: usize, end: usize, holes: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = start;
    for &(a, b) in holes {
        if a >= end {
            break;
        }
        if a > at {
            out.push((at, a));
        }
        at = at.max(b);
    }
    if at < end {
        out.push((at, end));
    }
    out
}

/// Handles one non-fault event. The caller holds `event_lock`.
pub(crate) fn handle_event(s: &Arc<Shared>, ev: Event) {
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
        Event::Fork { uffd } => {
            s.counters.event_fork.fetch_add(1, Ordering::Relaxed);
            crate::events::fork::fork(s, uffd);
        }
        Event::Unknown(_) | Event::PageFault { .. } => {}
    }
}

/// MADV_DONTNEED / MADV_REMOVE on `[start, end)`: the range stays mapped and reads zeros.
fn remove(s: &Shared, start: usize, end: usize) {
    let pieces = s.regions.map.read().unwrap_or_else(|e| e.into_inner()).overlapping(start, end);
    for p in pieces {
        discard(s, &p.region, p.lo, p.hi);
    }
}

/// munmap of `[start, end)`: the range is gone already. Where a REMAP's new range has
/// taken part of it meanwhile, the UNMAP is the old mapping's, and acts on what that
/// REMAP displaced (or, for the trailing UNMAP of an mremap, on nothing) instead.
pub(crate) fn unmap(s: &Shared, start: usize, end: usize) {
    let mut held = s.regions.remapped_from.unmapped(start, end);
    let displaced = s.regions.displaced.take(start, end);
    held.extend(displaced.iter().map(|d| (d.start, d.end())));
    held.sort_unstable();
    for &(a, b) in &held {
        s.trail.mark(What::Held, a, b, 0, 0);
    }
    for (a, b) in outside(start, end, &held) {
        forget(s, a, b);
    }
    for d in displaced {
        if !d.piece.region.dead.load(Ordering::Acquire) {
            discard(s, &d.piece.region, d.piece.lo, d.piece.hi);
        }
        s.regions.displaced.done(s, d);
    }
}

/// The runs of pages in `[addr, addr + n_pages pages)` that are mapped now (present in the
/// page table, per /proc/self/pagemap), as page offsets `[a, b)`. On any error it answers
/// "all of it", which only costs moves that find holes (ENOENT, skipped).
fn present_runs(addr: usize, n_pages: usize) -> Vec<(usize, usize)> {
    let Ok(map) = sys::page_map(addr, n_pages) else { return vec![(0, n_pages)] };
    let mut runs = Vec::new();
    let mut start = None;
    for (i, e) in map.iter().map(Some).chain([None]).enumerate() {
        let present = e.is_some_and(|e| e & sys::PAGEMAP_PRESENT != 0);
        match (present, start) {
            (true, None) => start = Some(i),
            (false, Some(a)) => {
                runs.push((a, i));
                start = None;
            }
            _ => {}
        }
    }
    runs
}

/// mremap moved `[from, from + len)` to `to`: the kernel moved the present pages; staged
/// and swapped pages follow here, into a new region per piece of the old range.
fn remap(s: &Shared, from: usize, to: usize, len: usize) {
    // What left `[from, from + len)`: the map's extents there, except where a REMAP's new
    // range took the address before this event came; there, the pieces it displaced.
    let displaced = s.regions.displaced.take(from, from + len);
    let held: Vec<(usize, usize)> = displaced.iter().map(|d| (d.start, d.end())).collect();
    let mut pieces: Vec<(usize, Piece, Option<DisplacedPiece>)> = {
        let mut map = s.regions.map.write().unwrap_or_else(|e| e.into_inner());
        outside(from, from + len, &held)
            .into_iter()
            .flat_map(|(a, b)| map.cut(a, b))
            .map(|p| (p.region.page_addr(p.lo), p, None))
            .collect()
    };
    for (at, p, _) in &pieces {
        s.trail.mark(What::Cut, *at, *at + pages_to_bytes(p.hi - p.lo), 0, p.region.id);
    }
    for d in displaced {
        let piece = Piece { region: d.piece.region.clone(), lo: d.piece.lo, hi: d.piece.hi };
        pieces.push((d.start, piece, Some(d)));
    }
    pieces.sort_by_key(|(at, _, _)| *at);
    s.regions.remapped_from.moved(from, from + len, Instant::now());
    for (at, p, displaced) in pieces {
        let r = &p.region;
        let n = p.hi - p.lo;
        let new_start = to + (at - from);
        // The kernel has put the moved range here: an extent still in the map here is a
        // mapping whose UNMAP / REMAP is on its way (displaced until it comes).
        let stale =
            s.regions.map.write().unwrap_or_else(|e| e.into_inner()).cut(new_start, new_start + pages_to_bytes(n));
        for q in stale {
            s.trail.mark(What::Displace, q.region.page_addr(q.lo), q.region.page_addr(q.hi), 0, q.region.id);
            s.counters.remap_displaced.fetch_add(1, Ordering::Relaxed);
            s.regions.displaced.push(q.region.page_addr(q.lo), q);
        }
        if r.dead.load(Ordering::Acquire) {
            // A displaced piece of a region torn down meanwhile: nothing to follow.
            if let Some(d) = displaced {
                s.regions.displaced.done(s, d);
            }
            continue;
        }
        let mode = RegisterMode { missing: true, wp: r.clean_tracking, minor: false };
        match s.new_region_at(new_start, n, r.hint, mode, true) {
            Ok(new) => {
                for k in 0..n {
                    // Fresh ptes: nobody else holds them. Faults on the new range wait
                    // until each page is in place.
                    new.ptes.lock(k);
                }
                // Leaving until the events in hand are handled: a later one may concern
                // the new range (the kernel made that change already).
                s.mark_leaving(&new);
                s.enter_region(new.clone());
                transfer(s, r, p.lo, p.hi, &new);
            }
            Err(e) => {
                s.trail.mark(What::RemapFailed, new_start, new_start + pages_to_bytes(n), 0, r.id);
                eprintln!(
                    "tierswap: cannot follow mremap to {new_start:#x} ({e}); the moved pages that were swapped out read as zeros"
                );
                discard(s, r, p.lo, p.hi);
            }
        }
        match displaced {
            Some(d) => s.regions.displaced.done(s, d),
            None if r.extents.load(Ordering::Acquire) == 0 && !s.regions.displaced.holds(r) => teardown(s, r),
            None => {}
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
            s.acct.inactive.lock().unwrap_or_else(|e| e.into_inner()).push_back((new.id, nb / BLOCK_PAGES));
        }
        for i in b..e {
            let o = olds[i - b];
            let moved = match o.state() {
                // Still poisoned where it went: mremap moves the marker with the page
                // tables, and had it not, the fault there re-arms it (`Present` and
                // poisoned). As plain `Present`, reclaim found no page to stage, set the
                // pte `None`, and a neighbour's fault-around installed zeros over the
                // marker: the page that gave SIGBUS read back as zeros (the 10-minute
                // injection stress, once in 1.8 M ops).
                PteState::Present if o.is_poisoned() => Pte::poisoned(),
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
    // Holes in the old mirror are staged zero pages: the new mirror reads the same there.
    // Present runs only, without ALLOW_SRC_HOLES: on Linux 6.18 a hole-allowing
    // UFFDIO_MOVE over a range being zapped at the same time was seen to spin in the
    // kernel for good (RELIABILITY.md).
    for (a, b) in present_runs(old.mirror_addr(from), n) {
        move_mirror_run(s, old, from + a, new, to + a, b - a);
    }
}

fn move_mirror_run(s: &Shared, old: &RegionInner, from: usize, new: &RegionInner, to: usize, n: usize) {
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
                false,
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
                        crate::sys::fatal(&format!("cannot follow an mremap'd staged page: {e}"));
                    }
                }
                k += 1;
            }
            // A hole after all (a staged zero page): the new mirror reads zeros there too.
            Err(uffd::Error::NoPage { done_bytes, .. }) => k += done_bytes / PAGE_SIZE + 1,
            Err(e) => crate::sys::fatal(&format!("cannot follow an mremap'd staged page: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::outside;

    #[test]
    fn outside_is_the_range_less_its_holes() {
        assert_eq!(outside(0x1000, 0x9000, &[]), vec![(0x1000, 0x9000)]);
        assert_eq!(
            outside(0x1000, 0x9000, &[(0x2000, 0x3000), (0x5000, 0x6000)]),
            vec![(0x1000, 0x2000), (0x3000, 0x5000), (0x6000, 0x9000)]
        );
        // Holes over the ends, overlapping each other, or covering it all.
        assert_eq!(
            outside(0x1000, 0x9000, &[(0x0, 0x2000), (0x1800, 0x4000), (0x8000, 0xa000)]),
            vec![(0x4000, 0x8000)]
        );
        assert_eq!(outside(0x1000, 0x9000, &[(0x0, 0xa000)]), vec![]);
        // Holes past the end change nothing.
        assert_eq!(outside(0x1000, 0x2000, &[(0x3000, 0x4000), (0x5000, 0x6000)]), vec![(0x1000, 0x2000)]);
    }
}
