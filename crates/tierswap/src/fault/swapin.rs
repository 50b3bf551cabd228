//! Swap-in of a swapped page: admission picks how many pages come in (one, the 64 KiB
//! block, or a larger window), every page of that range still swapped is read from its own
//! backend, and the range is installed in as few ioctls as its runs allow; the faulting
//! page's refault is judged for the workingset.
//!
//! Owns: [`swap_in`] and its phases. Calls: the memory manager (entries, slots, reads),
//! the admission and workingset policies, `uffd` installs under the event gates.

use std::sync::atomic::Ordering;

use crate::backend::file::{record_bytes, AlignedBuf, UnitCache};
use crate::backend::remote::RemotePrefetch;
use crate::mm::slots::release_entry;
use crate::mm::swap_io::{read_entry, ReadFail, ReadIo};
use crate::mm::{RegionInner, Shared};
use crate::page::{BLOCK_PAGES, PAGE_SIZE};
use crate::pagetable::{Pte, PteState};
use crate::policy::admission::{range_of, Limits};
use crate::swap::{SwapEntry, Tag};
use crate::sys::fatal;
use crate::uffd;

use super::{settle_install, try_lock, Scratch};

/// One page of a swap-in range, from probe to install.
#[derive(Clone, Copy, Debug)]
pub(super) struct Planned {
    /// The pte as locked (unlocked form); `None` when the page is not part of the swap-in.
    pte: Option<Pte>,
    /// The entry as locked.
    entry: SwapEntry,
    /// What the bytes are once read.
    kind: Kind,
    /// Keep the slot: the page comes in clean and write-protected.
    keep: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Not part of the swap-in (left as it was).
    Skip,
    /// Read: bytes in the range buffer.
    Data,
    /// A zero page (mapped with UFFDIO_ZEROPAGE).
    Zero,
    /// Unreadable: the faulting page gets SIGBUS; a neighbour is left for its own fault.
    Failed,
}

impl Planned {
    const SKIP: Planned = Planned { pte: None, entry: SwapEntry::FREE, kind: Kind::Skip, keep: false };
}

/// One swap-in: the faulting page and the range admitted around it.
struct SwapIn<'a> {
    s: &'a Shared,
    r: &'a RegionInner,
    /// The faulting page and its pte as locked.
    idx: usize,
    old: Pte,
    write: bool,
    /// A read fault installing its page writable (`write_predict`): writes follow reads here.
    write_predicted: bool,
    /// The range `[first, end)` of pages that may come in, and the window admission gave.
    first: usize,
    end: usize,
    window: u32,
}

/// Serves a fault on swapped page `idx` (its pte locked, `old`): admission picks how many
/// pages come in; every page of that range still swapped is read from its own backend
/// (mixed ranges: pool, zero, same-filled and file pages side by side, the file's records
/// from one read) and the range is installed in as few ioctls as its runs allow. Wakes
/// nobody: the caller wakes `[first, first + n)` once its bookkeeping is done. Returns the
/// tier the faulting page came from, `first` and `n`.
pub(super) fn swap_in(
    s: &Shared,
    r: &RegionInner,
    idx: usize,
    old: Pte,
    write: bool,
    scratch: &mut Scratch,
) -> (Option<Tag>, usize, usize) {
    let (first, end, window) = plan_window(s, r, idx);
    let write_predicted = !write && s.config.write_predict && s.writes.predict_write();
    let si = SwapIn { s, r, idx, old, write, write_predicted, first, end, window };
    let Scratch { io, range, plan, in_thread, .. } = scratch;
    // The file copy of the fault threads, shared: the next fault of a stream is often
    // served by the other thread. Taken only if free (else this thread's own); signal
    // mode keeps one per buffer, as its faulting threads run independent streams.
    let mut shared_unit = if *in_thread { None } else { s.tiers.unit_cache.as_ref().and_then(try_lock) };
    let unit = match shared_unit.as_deref_mut() {
        Some(c) => c,
        None => &mut io.unit,
    };
    // Whole units when a readahead follows this lone page (which wants them); else what
    // the copy has learnt (see UnitCache).
    unit.whole = end - first == 1 && !*in_thread && r.ra.window() > 1;
    let (need, fallback) = si.lock_range(plan, &mut io.read.remote);
    si.fetch_records(unit, need);
    si.read_each(unit, plan, range, &mut io.read);
    drop(shared_unit);
    si.install_runs(plan, range);
    let from_tag = si.settle(plan, fallback);
    (from_tag, first, end - first)
}

/// The range a fault on page `idx` brings in, as `[first, end)`, and its window in pages: what admission decides
/// (one page, the 64 KiB block, or a larger window where the region streams), a large
/// window narrowed to the block over memory that is mostly in already.
fn plan_window(s: &Shared, r: &RegionInner, idx: usize) -> (usize, usize, u32) {
    let c = &s.config;
    let limits = Limits {
        policy: c.swapin_policy,
        max_pages: c.swapin_max_pages,
        start_pages: c.swapin_start_pages,
        learn: c.swapin_learn_blocks,
    };
    let d = r.locality.decide(idx, r.hint, limits);
    if d.vetoed {
        s.counters.swpin_large_veto.fetch_add(1, Ordering::Relaxed);
    }
    let mut pages = d.pages;
    if pages as usize > BLOCK_PAGES && !mostly_swapped(s, r, range_of(idx, pages, r.n_pages)) {
        pages = BLOCK_PAGES as u32;
    }
    let (first, end) = if pages > 1 { range_of(idx, pages, r.n_pages) } else { (idx, idx + 1) };
    (first, end, pages)
}

impl SwapIn<'_> {
    /// Locks the pages of the range still swapped and in the same place as a lock-free
    /// snapshot saw them (the faulting page's pte is locked already; its entry is locked
    /// here, waiting), entering each in the plan. A neighbour whose backend changed between
    /// the two (written back, drained), or shared with a child, is left for its own fault
    /// (counted as a fallback). Remote neighbours are prefetched first, in one round trip
    /// per node. Returns the file bytes spanning the range's records and the fallbacks.
    fn lock_range(&self, plan: &mut Vec<Planned>, remote: &mut RemotePrefetch) -> ((u64, u64), u64) {
        let (s, r, idx, first, end) = (self.s, self.r, self.idx, self.first, self.end);
        let n = end - first;
        plan.clear();
        plan.resize(n, Planned::SKIP);
        let mut snapshot = [Tag::Free; crate::config::MAX_SWAPIN_PAGES as usize];
        if n > 1 {
            for j in first..end {
                let p = r.ptes.load(j);
                if j != idx && p.state() == PteState::Swapped && !p.locked() {
                    snapshot[j - first] = s.tiers.swap.load(p.slot()).tag();
                }
            }
        }
        self.prefetch_remote(&snapshot, remote);
        let mut fallback = 0u64;
        let mut need = (u64::MAX, 0u64);
        for j in first..end {
            let k = j - first;
            let (pte, e) = if j == idx {
                (self.old, s.tiers.swap.lock(self.old.slot()))
            } else {
                if !snapshot[k].in_memory() && snapshot[k] != Tag::File && snapshot[k] != Tag::Remote {
                    continue;
                }
                let Some(p) = r.ptes.try_lock_in(j, PteState::Swapped) else {
                    continue;
                };
                let slot = p.slot();
                let e = match s.tiers.swap.try_lock(slot) {
                    // A remote neighbour comes only from the range's prefetch: it never waits
                    // for a round trip (or retries) of its own.
                    Some(e) if e.tag() == Tag::Remote && !remote.holds(e.addr_len().0) => {
                        s.tiers.swap.unlock(slot, e, e);
                        r.ptes.unlock(j, p, p);
                        continue;
                    }
                    Some(e) if e.tag() == snapshot[k] && e.count() == 1 => e,
                    other => {
                        if let Some(e) = other {
                            s.tiers.swap.unlock(slot, e, e);
                        }
                        r.ptes.unlock(j, p, p);
                        fallback += 1;
                        continue;
                    }
                };
                (p, e)
            };
            plan[k] = Planned { pte: Some(pte), entry: e, kind: Kind::Skip, keep: false };
            if e.tag() == Tag::File {
                let (off, len) = e.addr_len();
                need = (need.0.min(off), need.1.max(off + record_bytes(len) as u64));
            }
        }
        (need, fallback)
    }

    /// Fetches the remote pages of the range (the faulting page's and the neighbours the
    /// snapshot saw there) in one round trip per node, before any entry is locked; each is
    /// opened against its locked entry (slot and version) when read.
    fn prefetch_remote(&self, snapshot: &[Tag], prefetched: &mut RemotePrefetch) {
        let (s, r, idx, first) = (self.s, self.r, self.idx, self.first);
        prefetched.clear();
        let Some(remote) = s.tiers.remote.as_ref() else { return };
        let mut wants = [(0u64, 0usize); crate::config::MAX_SWAPIN_PAGES as usize];
        let mut w = 0;
        for j in first..self.end {
            let slot = if j == idx { self.old.slot() } else { r.ptes.load(j).slot() };
            if j != idx && snapshot[j - first] != Tag::Remote {
                continue;
            }
            let e = s.tiers.swap.load(slot);
            if e.tag() == Tag::Remote {
                wants[w] = e.addr_len();
                w += 1;
            }
        }
        if w > 1 {
            remote.prefetch(&wants[..w], prefetched, &s.counters);
        }
    }

    /// The file records of the range (bytes `need`) in one read where they lie together:
    /// those of a large swap-in, or a lone fault's and (when that has paid) the rest of its
    /// block's. A failed read is counted; the records are read again one by one after, and
    /// a fault whose own record still cannot be read is reported there.
    fn fetch_records(&self, unit: &mut UnitCache, need: (u64, u64)) {
        let s = self.s;
        let (Some(file), true) = (s.tiers.file.as_ref(), need.0 < need.1) else { return };
        let (block, witness) = if self.end - self.first == 1 && unit.wants_block() {
            block_records(s, self.r, self.idx, need, file.unit_bytes() as u64)
        } else {
            (need, None)
        };
        match file.fill(unit, need, block) {
            Ok(reads) => {
                s.counters.file_unit_reads.fetch_add(reads as u64, Ordering::Relaxed);
            }
            Err(_) => {
                s.counters.read_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some((slot, e)) = witness {
            s.tiers.swap.unlock(slot, e, e);
        }
    }

    /// Reads each locked page of the plan into the range buffer, and decides whether it
    /// comes in clean (keeping its slot). An unreadable faulting page is poisoned; an
    /// unreadable neighbour, or the faulting page while an event in hand concerns the
    /// region, is left swapped for its own fault to report.
    fn read_each(&self, unit: &mut UnitCache, plan: &mut [Planned], range: &mut AlignedBuf, io: &mut ReadIo) {
        let (s, r, idx, first) = (self.s, self.r, self.idx, self.first);
        let pool_roomy = pool_roomy(s);
        for (k, planned) in plan.iter_mut().enumerate() {
            let Planned { pte: Some(pte), entry: e, .. } = *planned else { continue };
            let j = first + k;
            let slot = pte.slot();
            let buf = &mut range.as_mut_slice()[k * PAGE_SIZE..(k + 1) * PAGE_SIZE];
            let kind = match read_entry(s, slot, e, buf, unit, io) {
                Ok(true) => Kind::Data,
                Ok(false) => Kind::Zero,
                Err(fail) if j == idx && !s.is_leaving(r) => {
                    poison(s, r, r.page_addr(idx), slot, &fail);
                    Kind::Failed
                }
                Err(_) => {
                    // Left swapped: its own fault reports it. So is the faulting page while
                    // an event read but not handled concerns its region: a REMOVE in hand
                    // discards the page (poisoning it would log a loss of memory the program
                    // dropped, and its retried access reads zeros), a REMAP moves it, swapped,
                    // and the access at its new place reports it. A fault served in its own
                    // thread meets this (it does not queue behind the events as a fault
                    // thread's message does).
                    s.tiers.swap.unlock(slot, e, e);
                    r.ptes.unlock(j, pte, pte);
                    *planned = Planned::SKIP;
                    continue;
                }
            };
            let written = j == idx && (self.write || self.write_predicted);
            let keep = kind == Kind::Data && keeps_slot(s, r, e, slot, written, pool_roomy);
            if keep && j == idx && s.config.write_predict {
                s.writes.note_clean_read();
            }
            *planned = Planned { pte: Some(pte), entry: e, kind, keep };
        }
    }

    /// Installs runs of pages of one kind: one ioctl each, no wake until the end. A write
    /// to a zero page gets a zeroed copy of its own (saving the write fault after); its zero
    /// neighbours share one UFFDIO_ZEROPAGE. Pages the kernel did not install stay swapped,
    /// their slots intact (the program faults on them again); the common cause is the
    /// region going away.
    fn install_runs(&self, plan: &mut [Planned], range: &AlignedBuf) {
        let (s, r, first) = (self.s, self.r, self.first);
        let n = self.end - first;
        let zero_copy_at = self.write.then_some(self.idx - first).filter(|&k| plan[k].kind == Kind::Zero);
        let mut k = 0;
        while k < n {
            let p = plan[k];
            if matches!(p.kind, Kind::Skip | Kind::Failed) {
                k += 1;
                continue;
            }
            let run = k;
            while k + 1 < n
                && plan[k + 1].kind == p.kind
                && plan[k + 1].keep == p.keep
                && zero_copy_at != Some(k)
                && zero_copy_at != Some(k + 1)
            {
                k += 1;
            }
            k += 1;
            let addr = r.page_addr(first + run);
            let len = (k - run) * PAGE_SIZE;
            let res = s.guarded(r, || match p.kind {
                Kind::Data => {
                    let bytes = &range.as_slice()[run * PAGE_SIZE..k * PAGE_SIZE];
                    s.uffd.copy(addr, bytes, true, p.keep)
                }
                _ if zero_copy_at == Some(run) => {
                    static ZERO_PAGE: [u8; PAGE_SIZE] = [0; PAGE_SIZE];
                    s.uffd.copy(addr, &ZERO_PAGE, true, false)
                }
                _ => s.uffd.zeropage(addr, len, true),
            });
            if let Err(e) = res {
                let done = match &e {
                    uffd::Error::PageExist { done_bytes, .. }
                    | uffd::Error::Again { done_bytes, .. }
                    | uffd::Error::NoPage { done_bytes, .. } => done_bytes / PAGE_SIZE,
                    _ => 0,
                };
                let _ = settle_install(s, addr + done * PAGE_SIZE, Err(e));
                for q in &mut plan[run + done..k] {
                    q.kind = Kind::Skip;
                }
            }
        }
    }

    /// Settles each page: installed ones free their slot (or keep it, clean) and turn
    /// present, the faulting one judged for the workingset; the rest go back as they were.
    /// Counts the swap-in and tells admission where the stream goes on. Returns the tier
    /// the faulting page came from.
    fn settle(&self, plan: &[Planned], fallback: u64) -> Option<Tag> {
        let (s, r, idx, first, end) = (self.s, self.r, self.idx, self.first, self.end);
        let mut installed = 0i64;
        let mut tags = 0u8;
        let mut from_tag = None;
        for (k, &p) in plan.iter().enumerate().take(end - first) {
            let Some(pte) = p.pte else { continue };
            let j = first + k;
            let slot = pte.slot();
            match p.kind {
                Kind::Data | Kind::Zero => {
                    tags |= 1 << p.entry.tag().index();
                    if j == idx {
                        from_tag = Some(p.entry.tag());
                    }
                    let new = if p.keep { Pte::present_clean(slot) } else { Pte::present() };
                    // Judged while the slot still carries its eviction time.
                    let new = if j == idx { workingset_refault(s, pte, new, p.entry.tag() == Tag::Pool) } else { new };
                    if p.keep {
                        s.tiers.swap.unlock(slot, p.entry, kept_entry(s, p.entry));
                    } else {
                        release_entry(s, slot, p.entry);
                    }
                    r.ptes.unlock(j, pte, new);
                    installed += 1;
                }
                Kind::Failed => {
                    // Poisoned: the page reads as SIGBUS until the program discards it.
                    release_entry(s, slot, p.entry);
                    r.ptes.unlock(j, pte, Pte::poisoned());
                    installed += 1;
                    from_tag = Some(p.entry.tag());
                }
                Kind::Skip => {
                    s.tiers.swap.unlock(slot, p.entry, p.entry);
                    r.ptes.unlock(j, pte, pte);
                }
            }
        }
        s.acct.present_pages.fetch_add(installed, Ordering::Relaxed);
        s.counters.faults_swapped.fetch_add(1, Ordering::Relaxed);
        if installed > 1 {
            s.counters.swpin_large.fetch_add(1, Ordering::Relaxed);
            s.counters.swpin_large_pages.fetch_add(installed as u64, Ordering::Relaxed);
            if tags.count_ones() > 1 {
                s.counters.swpin_large_mixed.fetch_add(1, Ordering::Relaxed);
            }
        }
        if fallback > 0 {
            s.counters.swpin_large_fallback.fetch_add(fallback, Ordering::Relaxed);
        }
        // The stream goes on from the end of what is now in memory past the fault.
        let mut hi = idx + 1;
        while hi < end && plan[hi - first].pte.is_some() && plan[hi - first].kind != Kind::Skip {
            hi += 1;
        }
        r.locality.note_swapin(hi, self.window);
        from_tag
    }
}

/// Whether the pool may keep the objects of clean pages: while it is under its limit. A
/// kept object doubles its page's memory until the page is written or evicted, but it is
/// what makes evicting the page again free; past the limit, writeback moves the coldest
/// objects to the file (kept ones too: their pages stay clean, on a file slot). With a
/// quarter of the limit held free instead, a dense pool (zstd on the lab's pages: 1 GiB in
/// ~110 MiB of a 128 MiB limit) kept nothing, and every page refaulted in order was
/// compressed again when evicted: usemem refaulted 2.2× slower than with lz4.
pub(super) fn pool_roomy(s: &Shared) -> bool {
    s.tiers.pool.total_bytes() < s.pool_limit()
}

/// Whether a page read from locked entry `e` of `slot` comes in clean, keeping its slot (so
/// evicting it unwritten costs no compression and no IO): not for a write, nor for a slot a
/// forked child shares, nor for a pool object while the pool is short of room, nor (with
/// `reread_to_pool`) for a file record read back clean once already.
pub(super) fn keeps_slot(s: &Shared, r: &RegionInner, e: SwapEntry, slot: u64, write: bool, pool_roomy: bool) -> bool {
    let tag = e.tag();
    r.clean_tracking
        && !write
        && e.count() == 1
        && slot <= Pte::MAX_KEPT_SLOT
        && (tag == Tag::Remote || (tag == Tag::Pool && pool_roomy) || (tag == Tag::File && !reread(s, e)))
}

/// Whether file entry `e` was read back clean before and, with `reread_to_pool`, should now
/// give its slot up.
fn reread(s: &Shared, e: SwapEntry) -> bool {
    s.config.reread_to_pool && e.referenced()
}

/// The entry a page read in clean leaves in its kept slot: with `reread_to_pool`, a file
/// record is marked read once (see [`PagerConfig::reread_to_pool`]).
///
/// [`PagerConfig::reread_to_pool`]: crate::config::PagerConfig::reread_to_pool
fn kept_entry(s: &Shared, e: SwapEntry) -> SwapEntry {
    if s.config.reread_to_pool && e.tag() == Tag::File {
        e.with_referenced(true)
    } else {
        e
    }
}

/// For a lone fault on the file record at bytes `rec` (its entry locked): the file bytes
/// spanning it and the records of the rest of its 64 KiB block that lie in its unit or in
/// one unit beside it (the side holding more of them), read without locks. Reaching into
/// the other unit takes a witness: one of its records' entries, locked (and returned for
/// the caller to unlock after the read), so that unit is not rewritten while it is read.
fn block_records(
    s: &Shared,
    r: &RegionInner,
    idx: usize,
    rec: (u64, u64),
    unit_bytes: u64,
) -> ((u64, u64), Option<(u64, SwapEntry)>) {
    let unit = rec.0 / unit_bytes;
    let block_start = idx - idx % BLOCK_PAGES;
    let mut own = rec;
    // Records in the unit before and after: (lowest start, highest end, count, one slot).
    let mut sides = [(u64::MAX, 0u64, 0u32, 0u64); 2];
    for j in block_start..(block_start + BLOCK_PAGES).min(r.n_pages) {
        let p = r.ptes.load(j);
        if j == idx || p.state() != PteState::Swapped || p.locked() {
            continue;
        }
        let e = s.tiers.swap.load(p.slot());
        if e.tag() != Tag::File {
            continue;
        }
        let (off, len) = e.addr_len();
        let span = (off, off + record_bytes(len) as u64);
        let u = off / unit_bytes;
        if u == unit {
            own = (own.0.min(span.0), own.1.max(span.1));
        } else if u + 1 == unit || u == unit + 1 {
            let side = &mut sides[(u > unit) as usize];
            *side = (side.0.min(span.0), side.1.max(span.1), side.2 + 1, p.slot());
        }
    }
    let side = if sides[1].2 >= sides[0].2 { sides[1] } else { sides[0] };
    if side.2 == 0 {
        return (own, None);
    }
    let slot = side.3;
    match s.tiers.swap.try_lock(slot) {
        Some(e) if e.tag() == Tag::File && e.addr_len().0 / unit_bytes != unit => {
            let u = e.addr_len().0 / unit_bytes;
            if u + 1 == unit || u == unit + 1 {
                ((own.0.min(side.0), own.1.max(side.1)), Some((slot, e)))
            } else {
                s.tiers.swap.unlock(slot, e, e);
                (own, None)
            }
        }
        Some(e) => {
            s.tiers.swap.unlock(slot, e, e);
            (own, None)
        }
        None => (own, None),
    }
}

/// Bounded sampling for windows beyond 64 KiB (up to 2 MiB): 16 ptes spread over the range
/// decide whether it is worth probing page by page: at least half of them swapped.
fn mostly_swapped(s: &Shared, r: &RegionInner, (first, end): (usize, usize)) -> bool {
    const SAMPLES: usize = 16;
    let n = end - first;
    let swapped = (0..SAMPLES)
        .map(|k| first + k * n / SAMPLES)
        .filter(|&j| {
            let p = r.ptes.load(j);
            p.state() == PteState::Swapped && !p.locked() && s.tiers.swap.load(p.slot()).count() == 1
        })
        .count();
    swapped * 2 >= SAMPLES
}

/// Workingset detection on the refault of the page of swapped pte `old`: if it was evicted
/// so recently that a little more memory would have kept it (its refault distance, in
/// evictions since, is within the budget), it is working set: count it and activate it at
/// once, so the next aging round passes it over. `new` is the pte the page gets otherwise;
/// `from_pool`: it was read from the pool (the pool's share weighs those).
fn workingset_refault(s: &Shared, old: Pte, new: Pte, from_pool: bool) -> Pte {
    if !s.config.workingset {
        return new;
    }
    let distance = if s.config.workingset_page_stamp {
        s.tiers.swap.distance_since(old.evict_stamp())
    } else {
        s.tiers.swap.refault_distance(old.slot())
    };
    let budget_pages = s.workingset_pages();
    let hot = distance.is_some_and(|d| d <= budget_pages);
    if from_pool {
        // A refault the pool costs: one from within the budget's pages, or with
        // `pool_weigh_room` from within its room's (had the room held program pages, only
        // those would have stayed resident; one from farther, up to the many more pages
        // the room holds compressed, is a file read it saved).
        let within =
            if s.config.pool_weigh_room { s.tiers.pool.total_bytes() / PAGE_SIZE as u64 } else { budget_pages };
        s.tiers.pool_share.note_pool_refault(distance.is_some_and(|d| d <= within));
    }
    let Some(distance) = distance else {
        return new;
    };
    s.counters.workingset_refault.fetch_add(1, Ordering::Relaxed);
    if distance <= s.inactive_reach_of(budget_pages) {
        s.counters.workingset_refault_near.fetch_add(1, Ordering::Relaxed);
    }
    s.tiers.pool_share.note_refault(distance);
    if hot {
        s.counters.workingset_activate.fetch_add(1, Ordering::Relaxed);
        new.with_active(true)
    } else {
        new
    }
}

/// A page that cannot be read is never returned as data: the faulting thread gets SIGBUS.
fn poison(s: &Shared, r: &RegionInner, addr: usize, slot: u64, fail: &ReadFail) {
    eprintln!(
        "tierswap: page at {addr:#x} (slot {slot}) cannot be read back ({fail}); the accessing thread gets SIGBUS"
    );
    if arm_poison(s, r, addr) {
        s.wake(addr, PAGE_SIZE);
    }
}

/// Puts a poison marker at `addr`. True when the caller should wake the page's waiters
/// (the marker was there already); false when the install woke them or nobody is left.
/// The pte says poisoned either way: if the range is changing under an event (munmap or
/// mremap in flight: ENOENT, EINVAL, EAGAIN), the event clears or moves that pte, or the
/// retried access faults again and lands here once more.
pub(super) fn arm_poison(s: &Shared, r: &RegionInner, addr: usize) -> bool {
    match s.guarded(r, || s.uffd.poison(addr, PAGE_SIZE, false)) {
        Ok(_) => false,
        Err(uffd::Error::PageExist { .. }) => true,
        Err(uffd::Error::ProcessGone { .. }) => false,
        Err(uffd::Error::NoPage { .. } | uffd::Error::Invalid { .. } | uffd::Error::Again { .. }) => true,
        Err(e) => fatal(&format!("cannot poison unreadable page {addr:#x}: {e}")),
    }
}
