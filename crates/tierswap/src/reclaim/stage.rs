//! Deactivation (staging): a CLOCK hand walks each region in 64 KiB blocks and moves the
//! present pages of a run of blocks to the mirror with one UFFDIO_MOVE each, through a
//! small window registered on the program's userfaultfd (so a move out of a range whose
//! event is unread fails with EAGAIN instead of taking another mapping's pages).
//!
//! Owns: the staging window and its bookkeeping. Calls: the memory manager, `uffd` moves.

use std::sync::atomic::Ordering;

use super::{
    Reclaim, ACTIVE_WINDOW_PAGES, CHUNK_BLOCKS, SELECTIVE_EWMA_DIV, SELECTIVE_HYSTERESIS_PCT,
    SELECTIVE_WINDOW_EVICTIONS, SPAN_BLOCKS,
};
use crate::mm::{RegionInner, Shared};
use crate::page::{BLOCK_PAGES, PAGE_SIZE};
use crate::pagetable::{Pte, PteState};
use crate::sys::{self, fatal};
use crate::uffd;

/// What a staging move's error leaves to do (`Reclaim::after_move_error`).
enum AfterMove {
    /// `done` pages count as moved; the page after them is skipped in `skip`'s state.
    Go { done: usize, skip: Option<PteState> },
    /// The window held a page of nobody's: the `ours` pages before it are staged and the
    /// window is set aside.
    SetAside { ours: usize },
}

/// What a staging run did, move by move: kept per window so that the internal error for a
/// page found in the window can say which run it could be from (the run before).
#[derive(Clone, Copy, Default)]
pub(super) struct RunLog {
    region: u64,
    /// Each move into the window: (first page, pages asked, pages taken, outcome).
    moves: [(usize, usize, usize, &'static str); 8],
    n: usize,
}

impl RunLog {
    pub(super) fn start(&mut self, region: u64) {
        *self = RunLog { region, ..RunLog::default() };
    }

    pub(super) fn push(&mut self, at: usize, asked: usize, taken: usize, outcome: &'static str) {
        if let Some(m) = self.moves.get_mut(self.n) {
            *m = (at, asked, taken, outcome);
        }
        self.n += 1;
    }
}

impl std::fmt::Display for RunLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "region {}:", self.region)?;
        for &(at, asked, taken, outcome) in &self.moves[..self.n.min(self.moves.len())] {
            write!(f, " [pages {at}+{asked}: {taken} taken, {outcome}]")?;
        }
        if self.n > self.moves.len() {
            write!(f, " and {} more moves", self.n - self.moves.len())?;
        }
        Ok(())
    }
}

/// The errno behind a move's outcome, for [`RunLog`].
pub(super) fn outcome(res: &uffd::Result<usize>) -> &'static str {
    match res {
        Ok(_) => "ok",
        Err(uffd::Error::PageExist { .. }) => "EEXIST",
        Err(uffd::Error::Again { op, .. }) if op.starts_with("change to a leaving") => "leaving",
        Err(uffd::Error::Again { .. }) => "EAGAIN",
        Err(uffd::Error::NoPage { .. }) => "ENOENT",
        Err(uffd::Error::Busy { .. }) => "EBUSY",
        Err(uffd::Error::BadAddress { .. }) => "EFAULT",
        Err(uffd::Error::Invalid { .. }) => "EINVAL",
        Err(_) => "other",
    }
}

/// Where staging moves a run of the program's pages first, on its way to the mirror: a
/// range of ours registered on the *program's* userfaultfd. The move out of the program's
/// range is then an ioctl of that userfaultfd, which the kernel refuses (EAGAIN) while an
/// event about the program's memory is unread, checked under its own lock together with
/// the move; and [`Shared::guarded`] refuses it from the event's read to its handling.
/// Moved straight into the mirror (the mirror's userfaultfd, which has no events), a page
/// would be taken after an munmap or mremap the pager has not handled yet: the page of
/// whatever the kernel has mapped at that address since (tests/address_reuse.rs). A second
/// move, window to mirror, follows at once, so the window is empty between runs.
/// Never touched, never advised (a REMOVE event), never inherited by a child.
pub(super) fn map_window(s: &Shared, wp: bool, pages: usize) -> std::io::Result<usize> {
    let len = pages * PAGE_SIZE;
    let addr = sys::mmap_reserve(len)?;
    // SAFETY: our fresh, unused mapping.
    unsafe {
        let _ = sys::madvise(addr, len, libc::MADV_NOHUGEPAGE);
        let _ = sys::madvise(addr, len, libc::MADV_DONTDUMP);
        let _ = sys::madvise(addr, len, libc::MADV_DONTFORK);
    }
    // The regions' mode: UFFDIO_MOVE wants equal protections on both sides.
    let mode = uffd::RegisterMode { missing: true, wp, minor: false };
    if let Err(e) = s.uffd.register(addr, len, mode) {
        // SAFETY: as above.
        unsafe {
            let _ = sys::munmap(addr, len);
        }
        return Err(std::io::Error::other(e));
    }
    Ok(addr)
}

/// What the window holds, for an internal-error message: each resident page's offset and
/// first word.
pub(super) fn window_contents(window: usize, n: usize) -> String {
    let mut resident = [false; SPAN_BLOCKS * BLOCK_PAGES];
    sys::residency(window, &mut resident[..n]);
    let pages: Vec<String> = (0..n)
        .filter(|&k| resident[k])
        .map(|k| {
            // SAFETY: a resident page of our window (no fault), which only this reclaimer
            // uses; the read changes nothing.
            let w = unsafe { std::ptr::read_volatile((window + k * PAGE_SIZE) as *const u64) };
            format!("page {k}: {w:#x}")
        })
        .collect();
    pages.join(", ")
}

/// Pages a staging move took, from the residency after it failed with EEXIST having
/// counted `reported`: of the window's pages (`in_window`) and of the program pages they
/// came from (`in_program`, same offsets). The window's resident prefix counts when each of
/// its pages past the count stands for a program page that is gone (moved, not counted);
/// otherwise the count stands.
pub(super) fn moved_by_run(reported: usize, in_window: &[bool], in_program: &[bool]) -> usize {
    let prefix = in_window.iter().take_while(|&&x| x).count();
    if prefix > reported && in_program[reported..prefix].iter().all(|&x| !x) {
        prefix
    } else {
        reported
    }
}

/// Where locked present page `idx` is after a move that did not take it: still in the
/// program's range (present), or nowhere (a hole the program made with MADV_DONTNEED, which
/// reads as zeros).
pub(super) fn where_is(r: &RegionInner, idx: usize) -> PteState {
    if !is_mapped(r.page_addr(idx)) {
        // The program's range is gone (munmap) or moved (mremap): the page went with it or
        // away, and the event handler decides which. Leave the pte as it is.
        return PteState::Present;
    }
    if sys::is_resident(r.page_addr(idx)) {
        PteState::Present
    } else {
        PteState::None
    }
}

/// Whether the page at `addr` is in some mapping (mincore fails with ENOMEM otherwise).
pub(super) fn is_mapped(addr: usize) -> bool {
    let mut vec = 0u8;
    // SAFETY: mincore writes one byte for one page into `vec`; it only reads page tables.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, PAGE_SIZE, &mut vec) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOMEM)
}

impl Reclaim {
    /// Moves up to `max_blocks` blocks of present pages to staging. Returns pages moved.
    pub(super) fn deactivate(&mut self, max_blocks: usize) -> usize {
        let regions = self.regions();
        if regions.is_empty() {
            return 0;
        }
        let mut moved = 0;
        let mut blocks_done = 0;
        for k in 0..regions.len() {
            let r = &regions[(self.next_region + k) % regions.len()];
            let Ok(_guard) = r.reclaim_lock.try_read() else {
                continue;
            };
            if r.dead.load(Ordering::Acquire) {
                continue;
            }
            let n_blocks = r.n_pages.div_ceil(BLOCK_PAGES);
            let mut scanned = 0;
            while scanned < n_blocks && blocks_done < max_blocks {
                let b = r.clock_block.fetch_add(1, Ordering::Relaxed) % n_blocks;
                scanned += 1;
                if !r.ptes.chunk_has_present(b * BLOCK_PAGES) {
                    // Nothing present in this block's 2 MiB chunk: the hand jumps past it.
                    let rest = (CHUNK_BLOCKS - 1 - b % CHUNK_BLOCKS).min(n_blocks - 1 - b);
                    r.clock_block.fetch_add(rest, Ordering::Relaxed);
                    scanned += rest;
                    continue;
                }
                // The blocks after it in its chunk go with it: one move per run of pages
                // (one TLB flush) instead of one per block.
                let span = (max_blocks - blocks_done)
                    .min(self.span_blocks)
                    .min(CHUNK_BLOCKS - b % CHUNK_BLOCKS)
                    .min(n_blocks - b);
                if span > 1 {
                    r.clock_block.fetch_add(span - 1, Ordering::Relaxed);
                    scanned += span - 1;
                }
                let mut per_block = [0usize; SPAN_BLOCKS];
                moved += self.deactivate_span(r, b, span, false, &mut per_block);
                for (k, &n) in per_block[..span].iter().enumerate() {
                    if n > 0 {
                        blocks_done += 1;
                        self.s.acct.inactive.lock().unwrap_or_else(|e| e.into_inner()).push_back((r.id, b + k));
                    }
                }
            }
            if blocks_done >= max_blocks {
                self.next_region = (self.next_region + k + 1) % regions.len();
                break;
            }
        }
        self.s.counters.pgdeactivate.fetch_add(moved as u64, Ordering::Relaxed);
        moved
    }

    /// Stages the present pages of block `b`. Returns pages staged.
    pub(super) fn deactivate_block(&mut self, r: &RegionInner, b: usize, force: bool) -> usize {
        self.deactivate_span(r, b, 1, force, &mut [0; SPAN_BLOCKS])
    }

    /// Stages the present pages of blocks `[b, b + n)`, `n` ≤ [`SPAN_BLOCKS`], all in one
    /// 2 MiB chunk (the kernel moves a run within one page table with one TLB flush).
    /// `per_block[k]` gets the pages staged of block `b + k`. Returns pages staged.
    pub(super) fn deactivate_span(
        &mut self,
        r: &RegionInner,
        b: usize,
        n: usize,
        force: bool,
        per_block: &mut [usize; SPAN_BLOCKS],
    ) -> usize {
        debug_assert!(n <= SPAN_BLOCKS && (b % CHUNK_BLOCKS) + n <= CHUNK_BLOCKS);
        let start = b * BLOCK_PAGES;
        let end = (start + n * BLOCK_PAGES).min(r.n_pages);
        let mut locked = [false; SPAN_BLOCKS * BLOCK_PAGES];
        let mut any = false;
        for i in start..end {
            let p = r.ptes.load(i);
            if p.is_poisoned() {
                // A poison marker holds no data and cannot be moved: nothing to stage.
                continue;
            }
            if !force && p.state() == PteState::Present && !p.locked() && self.age_active(r, i, p) {
                continue;
            }
            if force {
                // Forced eviction waits out a fault in flight: the program may already run
                // on a page whose pte its fault thread has yet to mark present.
                let old = r.ptes.lock(i);
                if old.state() == PteState::Present && !old.is_poisoned() {
                    locked[i - start] = true;
                    any = true;
                } else {
                    r.ptes.unlock(i, old, old);
                }
            } else if let Some(old) = r.ptes.try_lock_in(i, PteState::Present) {
                if old.is_poisoned() {
                    r.ptes.unlock(i, old, old);
                } else {
                    locked[i - start] = true;
                    any = true;
                }
            }
        }
        if !any {
            return 0;
        }
        let mut staged = 0;
        let mut i = start;
        while i < end {
            if !locked[i - start] {
                i += 1;
                continue;
            }
            let run_start = i;
            while i < end && locked[i - start] {
                i += 1;
            }
            staged += self.stage_run(r, run_start, i, start, per_block);
        }
        self.s.acct.present_pages.fetch_sub(staged as i64, Ordering::Relaxed);
        self.s.acct.staged_pages.fetch_add(staged as i64, Ordering::Relaxed);
        staged
    }

    /// Reclaim's hand meets present page `i` (pte `p`, unlocked when loaded): an active page
    /// is passed over, keeping its bit while active pages are within their share of the
    /// present pages seen (`PagerConfig::active_protect_pct`), or demoted for one more
    /// round (its bit cleared) when they are over it or protection is off. Returns whether
    /// the page is passed over.
    fn age_active(&mut self, r: &RegionInner, i: usize, p: Pte) -> bool {
        let pct = self.s.config.active_protect_pct as u64;
        let seen = &mut self.active_seen;
        seen.0 += 1;
        seen.1 += p.active() as u64;
        if seen.0 >= ACTIVE_WINDOW_PAGES {
            // Over the share: demote what the hand meets until the next look.
            let within = seen.1 * 100 <= seen.0 * pct;
            *seen = (0, 0);
            let selective = self.activations_selective();
            if pct > 0 && !selective {
                self.s.counters.protect_suspended.fetch_add(1, Ordering::Relaxed);
            }
            self.protect_active = pct > 0 && within && selective;
            if pct > 0 {
                // Hot pages that do not fit beside the pool ask it for room (policy/pool_share.rs).
                self.s.tiers.pool_share.note_active_look(!within);
            }
        }
        if !p.active() {
            return false;
        }
        if !self.protect_active {
            if let Some(old) = r.ptes.try_lock_in(i, PteState::Present) {
                r.ptes.unlock(i, old, old.aged_hot());
            }
        }
        true
    }

    /// Whether workingset activations single pages out: protection holds until the running
    /// rate of activations per eviction (each [`SELECTIVE_WINDOW_EVICTIONS`] weighed in at
    /// 1/[`SELECTIVE_EWMA_DIV`]) goes over `protect_selective_pct`, and comes back once it is
    /// [`SELECTIVE_HYSTERESIS_PCT`] points under; always with the setting at 0.
    fn activations_selective(&mut self) -> bool {
        let pct = self.s.config.protect_selective_pct as u64;
        if pct == 0 {
            return true;
        }
        let c = &self.s.counters;
        let now = (c.workingset_activate.load(Ordering::Relaxed), c.pgsteal.load(Ordering::Relaxed));
        let (activated, evicted) = (now.0 - self.activations_seen.0, now.1 - self.activations_seen.1);
        if evicted >= SELECTIVE_WINDOW_EVICTIONS {
            let window = (activated * 1000 / evicted).min(2000);
            self.activation_rate_permille = next_rate(self.activation_rate_permille, window);
            self.activations_selective =
                selective_after(self.activations_selective, self.activation_rate_permille, pct);
            self.activations_seen = now;
        }
        self.activations_selective
    }

    /// The staging window for regions of this registration mode (see [`map_window`]).
    pub(super) fn window(&mut self, wp: bool) -> Option<usize> {
        let k = wp as usize;
        if self.windows[k].is_none() {
            match map_window(&self.s, wp, self.span_blocks * BLOCK_PAGES) {
                Ok(addr) => self.windows[k] = Some(addr),
                Err(e) => {
                    if !self.warned_window {
                        self.warned_window = true;
                        eprintln!("tierswap: cannot map a staging window ({e}); pages stay in memory");
                    }
                }
            }
        }
        self.windows[k]
    }

    /// Moves locked present pages `[from, to)` to the mirror, through the window, and
    /// unlocks them: staged if moved; None if the program had discarded it (a hole);
    /// present if the move could not be done now. Counts each page staged in
    /// `per_block[(page - span_start) / BLOCK_PAGES]`. Returns pages staged.
    pub(super) fn stage_run(
        &mut self,
        r: &RegionInner,
        from: usize,
        to: usize,
        span_start: usize,
        per_block: &mut [usize],
    ) -> usize {
        let Some(window) = self.window(r.clean_tracking) else {
            for k in from..to {
                let old = r.ptes.load(k);
                r.ptes.unlock(k, old, old);
            }
            return 0;
        };
        let mut i = from;
        let mut staged = 0;
        let mut again = 0;
        // Set once a move over several pages met the end of one of the kernel's VMAs.
        let mut one_by_one = false;
        let k = r.clean_tracking as usize;
        let before = self.last_runs[k];
        self.last_runs[k].start(r.id);
        while i < to {
            // A move stops short of pages the program made other than read-write: UFFDIO_MOVE
            // fails whole on a range that reaches them (mm/protect.rs). Such a page stays.
            // (`to` below: this move's end.)
            let to = match r.protections.first_in(i, to) {
                Some(p) if p == i => {
                    self.s.counters.stage_skipped_protected.fetch_add(1, Ordering::Relaxed);
                    self.skip_page(r, i, PteState::Present);
                    i += 1;
                    continue;
                }
                Some(p) => p,
                None => to,
            };
            let to = if one_by_one { i + 1 } else { to };
            let len = (to - i) * PAGE_SIZE;
            // SAFETY: pages [i, to) are locked present pages of the program's range and the
            // window is empty; guarded, the range is still the region's. Moving them out is
            // atomic with respect to the program, which faults on a touch and is served
            // from the mirror once we unlock.
            let res = self.s.guarded(r, || unsafe { self.s.uffd.move_pages(window, r.page_addr(i), len, true, false) });
            // The window, not the count, says how many pages moved: Linux 6.18 can report
            // fewer than a batched move took before it ended in EAGAIN (the events stress
            // caught 4 reported of 12 moved).
            let taken = match &res {
                Ok(bytes) => bytes / PAGE_SIZE,
                Err(e @ uffd::Error::PageExist { .. }) => self.moved_before_eexist(r, window, i, to, e.done_bytes()),
                Err(_) => self.moved_into_window(window, to - i),
            };
            self.last_runs[k].push(i, to - i, taken, outcome(&res));
            let (done, skip) = match res {
                Ok(bytes) => (bytes / PAGE_SIZE, None),
                Err(e) => match self.after_move_error(r, (i, to), taken, e, (&mut again, &mut one_by_one)) {
                    AfterMove::Go { done, skip } => (done, skip),
                    AfterMove::SetAside { ours } => {
                        self.set_aside(r, window, (i, to), ours, &before, span_start, per_block);
                        return staged + ours;
                    }
                },
            };
            if done > 0 {
                self.unwindow(r, window, i, done);
            }
            for k in i..i + done {
                let old = r.ptes.load(k);
                r.ptes.unlock(k, old, old.staged_keeping_hotness());
                per_block[(k - span_start) / BLOCK_PAGES] += 1;
            }
            staged += done;
            i += done;
            if let (Some(state), true) = (skip, i < to) {
                self.skip_page(r, i, state);
                i += 1;
            }
        }
        staged
    }

    /// What the error `e` of a move of `[i, to)` that took `taken` pages into the window
    /// leaves to do: how many pages count as moved and whether the page after them is
    /// skipped (left present, or None where the program dropped it), or that the window
    /// held a foreign page. `again` counts EAGAINs without progress; `one_by_one` is set
    /// when the rest of the run is to be moved a page at a time.
    fn after_move_error(
        &mut self,
        r: &RegionInner,
        (i, to): (usize, usize),
        taken: usize,
        e: uffd::Error,
        (again, one_by_one): (&mut u32, &mut bool),
    ) -> AfterMove {
        // EEXIST: the window was not empty, so `taken` is the count, not checked against
        // the window (see stage_run).
        let done = taken.max(e.done_bytes() / PAGE_SIZE);
        let at = i + done;
        let skip = match e {
            uffd::Error::Busy { .. } => {
                if self.busy.len() < self.busy.capacity() {
                    self.busy.push(r.page_addr(at));
                }
                Some(PteState::Present)
            }
            // An event about this range is in hand: its handler settles these ptes.
            uffd::Error::Again { .. } if self.s.is_leaving(r) => Some(PteState::Present),
            uffd::Error::Again { .. } if *again < 8 => {
                *again += 1;
                None
            }
            // ENOENT, or EAGAIN without progress after retries (Linux 6.18's answer for a
            // hole): the program may have dropped the page. The errno alone is not trusted
            // with data: where the page is decides.
            uffd::Error::NoPage { .. } | uffd::Error::Again { .. } => (at < to).then(|| where_is(r, at)),
            // The move ran into pages it had moved itself without counting them (see
            // `moved_before_eexist`): go on after them.
            uffd::Error::PageExist { done_bytes, .. } if taken > done_bytes / PAGE_SIZE => {
                self.s.counters.move_uncounted.fetch_add((taken - done_bytes / PAGE_SIZE) as u64, Ordering::Relaxed);
                None
            }
            uffd::Error::PageExist { done_bytes, .. } => return AfterMove::SetAside { ours: done_bytes / PAGE_SIZE },
            // The program unmapped or moved the range (munmap / mremap): its event is on
            // the way and settles these ptes. Nothing to say.
            uffd::Error::BadAddress { .. } => Some(PteState::Present),
            // A page under a protection other than read-write (mm/protect.rs): it stays.
            uffd::Error::Invalid { .. } if r.protections.first_in(at, at + 1).is_some() => {
                self.s.counters.stage_skipped_protected.fetch_add(1, Ordering::Relaxed);
                Some(PteState::Present)
            }
            // UFFDIO_MOVE takes its range within one VMA, and the program split its range
            // into several with advice that sets a VMA's flags (MADV_HUGEPAGE, MADV_RANDOM,
            // MADV_DONTDUMP: numpy on its arrays): the rest of the run goes one page at a
            // time (a run is a span at most, and each page moved costs its own TLB flush
            // on this kernel anyway).
            uffd::Error::Invalid { .. } if taken == 0 && to - at > 1 => {
                *one_by_one = true;
                self.s.counters.move_split_vma.fetch_add(1, Ordering::Relaxed);
                None
            }
            e => {
                if !self.warned_move {
                    self.warned_move = true;
                    eprintln!(
                        "tierswap: staging pages at {:#x} failed: {e} (said once; such pages stay in memory)",
                        r.page_addr(at)
                    );
                }
                Some(PteState::Present)
            }
        };
        AfterMove::Go { done, skip }
    }

    /// Something put a page in the window that no staging run did: a bug. Whose it is
    /// cannot be told, so it stays where it is, in a window set aside for good. The `ours`
    /// pages the move took before it (EEXIST stops the move there) are staged; the rest of
    /// `[i, to)` stay present.
    #[allow(clippy::too_many_arguments)]
    fn set_aside(
        &mut self,
        r: &RegionInner,
        window: usize,
        (i, to): (usize, usize),
        ours: usize,
        before: &RunLog,
        span_start: usize,
        per_block: &mut [usize],
    ) {
        eprintln!(
            "tierswap: internal error: the staging window at {window:#x} holds pages no staging run put there ({}); set aside, a new window is used (this run: region {} pages {i}..{to}; the run before through it: {before})",
            window_contents(window, to - i),
            r.id
        );
        if ours > 0 {
            self.unwindow(r, window, i, ours);
        }
        for k in i..to {
            let old = r.ptes.load(k);
            let new = if k < i + ours { old.staged_keeping_hotness() } else { old };
            r.ptes.unlock(k, old, new);
            if k < i + ours {
                per_block[(k - span_start) / BLOCK_PAGES] += 1;
            }
        }
        self.windows[r.clean_tracking as usize] = None;
    }

    /// Makes the pages staging found shared the process's own again, so that the next pass
    /// can move them. A page present at a fork loses its exclusive mark in the kernel, and
    /// only a write fault sets it again, even once the child is gone: a process that only
    /// reads a page after a fork keeps it out of UFFDIO_MOVE's reach (EBUSY) for good. A
    /// read that pins the page (`process_vm_readv` of this process, which pins the pages
    /// it reads) takes the kernel's unshare path instead: the mark comes back, the pte and
    /// its write protection stay as they were, no byte changes. While a child lives, only
    /// for the pages no other process maps any more (/proc/self/pagemap's exclusive bit:
    /// every child wrote its own copy or dropped the page): one a child still maps would be
    /// copied for this process and free nothing. Returns the pages made this process's own.
    /// Called with no lock of the pager's held: a page the program dropped since its move
    /// failed faults here like a program access (mincore first makes that rare), and a
    /// fault thread serves it while this thread holds nothing anyone waits for. Not under a
    /// seccomp filter: one a sandboxing program applied to every thread could kill the
    /// process on a system call it did not expect.
    pub(super) fn unshare_busy(&mut self) -> usize {
        if self.busy.is_empty() {
            return 0;
        }
        if crate::sys::seccomp_filtered() {
            // A sandboxing program's filter may kill on a call it does not expect.
            self.busy.clear();
            return 0;
        }
        let mut bytes = [0u8; super::UNSHARE_BATCH];
        let mut local = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; super::UNSHARE_BATCH];
        let mut remote = local;
        // While a child lives, a page it still maps would be copied by the read (the
        // kernel's unshare of a page mapped twice): only the pages mapped here alone are
        // taken, those every child has written (its own copy) or dropped since the fork.
        let mut alone = [true; super::UNSHARE_BATCH];
        if self.s.fork.children.live() > 0 && crate::sys::mapped_alone(&self.busy, &mut alone).is_err() {
            self.busy.clear();
            return 0;
        }
        let mut n = 0;
        for (k, &addr) in self.busy.iter().enumerate() {
            if !alone[k] {
                continue;
            }
            if crate::sys::is_resident(addr) {
                local[n] = libc::iovec { iov_base: bytes[n..].as_mut_ptr().cast(), iov_len: 1 };
                remote[n] = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: 1 };
                n += 1;
            }
        }
        self.busy.clear();
        if n == 0 {
            return 0;
        }
        // SAFETY: `local` points at `bytes`, ours; `remote` names one byte of each page in this
        // process, which the kernel reads (or fails on with EFAULT) without writing it.
        let read = unsafe {
            libc::process_vm_readv(
                libc::getpid(),
                local.as_ptr(),
                n as libc::c_ulong,
                remote.as_ptr(),
                n as libc::c_ulong,
                0,
            )
        };
        if read <= 0 {
            return 0;
        }
        self.s.counters.stage_unshared.fetch_add(read as u64, Ordering::Relaxed);
        read as usize
    }

    /// Unlocks page `i`, which a move could not take: as it is, or None (with its kept slot
    /// given back) where the program dropped it (MADV_DONTNEED: it reads as zeros).
    fn skip_page(&self, r: &RegionInner, i: usize, state: PteState) {
        let old = r.ptes.load(i);
        let new = match state {
            PteState::None => {
                self.s.acct.present_pages.fetch_sub(1, Ordering::Relaxed);
                if let Some(kept) = old.kept_slot() {
                    crate::mm::slots::put_slot(&self.s, kept);
                }
                Pte::NONE
            }
            _ => old,
        };
        r.ptes.unlock(i, old, new);
    }

    /// How many pages, from the window's start, a move of `n` pages into it took: the
    /// resident prefix. A resident page after a gap would be one the kernel moved out of
    /// order, which nothing here expects: it is reported and the pager stops rather than
    /// lose it.
    pub(super) fn moved_into_window(&self, window: usize, n: usize) -> usize {
        let mut resident = [false; SPAN_BLOCKS * BLOCK_PAGES];
        let resident = &mut resident[..n];
        sys::residency(window, resident);
        let moved = resident.iter().take_while(|&&x| x).count();
        if let Some(k) = resident[moved..].iter().position(|&x| x) {
            fatal(&format!(
                "UFFDIO_MOVE left page {} of a staging run in the window at {window:#x} but not page {moved}",
                moved + k
            ));
        }
        moved
    }

    /// How many pages a move of locked pages `[i, to)` of `r` into the empty window took
    /// when it failed with EEXIST after reporting `done_bytes`. Linux 6.18 can move a batch
    /// of pages without counting it, then retry the batch's first page and find the window
    /// taken there by its own move: EEXIST, with the batch left out of the count (the events
    /// stress found a run's first page at window offset 0 so). The window's resident prefix
    /// is this run's when every program page it stands for has left the program's range;
    /// if one is still there, the window page beside it is not this run's (a bug elsewhere)
    /// and only the reported count is taken.
    pub(super) fn moved_before_eexist(
        &self,
        r: &RegionInner,
        window: usize,
        i: usize,
        to: usize,
        done_bytes: usize,
    ) -> usize {
        let reported = (done_bytes / PAGE_SIZE).min(to - i);
        let n = to - i;
        let mut in_window = [false; SPAN_BLOCKS * BLOCK_PAGES];
        let mut in_program = [false; SPAN_BLOCKS * BLOCK_PAGES];
        sys::residency(window, &mut in_window[..n]);
        sys::residency(r.page_addr(i), &mut in_program[..n]);
        moved_by_run(reported, &in_window[..n], &in_program[..n])
    }

    /// Moves the `n` pages at the start of the window to the mirror at page `i` of `r`
    /// (locked ptes, about to be unlocked as staged). The mirror there should be empty: a
    /// copy found there is a stale one (its pte said present) and is dropped, loudly.
    pub(super) fn unwindow(&mut self, r: &RegionInner, window: usize, i: usize, n: usize) {
        let mut k = 0;
        let mut tries = 0;
        while k < n {
            // SAFETY: the window's pages [k, n) are the locked pages [i + k, i + n) just
            // moved out of the program's range; the mirror there is theirs.
            let res = unsafe {
                self.s.mirror_uffd.move_pages(
                    r.mirror_addr(i + k),
                    window + k * PAGE_SIZE,
                    (n - k) * PAGE_SIZE,
                    true,
                    false,
                )
            };
            let err = match res {
                Ok(bytes) if bytes > 0 => {
                    k += bytes / PAGE_SIZE;
                    continue;
                }
                Ok(_) => None,
                Err(e) => Some(e),
            };
            match err {
                Some(uffd::Error::PageExist { done_bytes, .. }) => {
                    k += done_bytes / PAGE_SIZE;
                    // As below: pages gone from the window are in the mirror already.
                    while k < n && !sys::is_resident(window + k * PAGE_SIZE) {
                        k += 1;
                    }
                    if k == n {
                        continue;
                    }
                    eprintln!(
                        "tierswap: a stale copy sat in the mirror at {:#x} under a present page; dropped it",
                        r.mirror_addr(i + k)
                    );
                    // SAFETY: the mirror page of a locked pte whose bytes are in the window:
                    // what is in the mirror there is no page's only copy.
                    if let Err(e) = unsafe { sys::madvise(r.mirror_addr(i + k), PAGE_SIZE, libc::MADV_DONTNEED) } {
                        fatal(&format!("cannot drop a stale mirror page at {:#x}: {e}", r.mirror_addr(i + k)));
                    }
                }
                Some(uffd::Error::Again { done_bytes, .. } | uffd::Error::Busy { done_bytes, .. }) if tries < 1000 => {
                    k += done_bytes / PAGE_SIZE;
                    // The count can fall short of the pages moved (see `stage_run`): a page
                    // gone from the window is in the mirror.
                    while k < n && !sys::is_resident(window + k * PAGE_SIZE) {
                        k += 1;
                    }
                    tries += 1;
                    std::thread::yield_now();
                }
                e => fatal(&format!(
                    "moving staged pages from the window into the mirror at {:#x} failed: {}",
                    r.mirror_addr(i + k),
                    e.map_or_else(|| "no progress".to_string(), |e| e.to_string())
                )),
            }
        }
    }
}

/// The running activation rate (per 1,000 evictions) with one more window weighed in.
fn next_rate(rate: u64, window: u64) -> u64 {
    (rate * (SELECTIVE_EWMA_DIV - 1) + window) / SELECTIVE_EWMA_DIV
}

/// Whether protection holds at running rate `rate` (per 1,000 evictions) under a setting of
/// `pct`, given whether it held: off above `pct`, on again at `pct` less the hysteresis.
fn selective_after(held: bool, rate: u64, pct: u64) -> bool {
    if held {
        rate <= pct * 10
    } else {
        rate + SELECTIVE_HYSTERESIS_PCT * 10 <= pct * 10
    }
}

#[cfg(test)]
mod tests {
    use super::{moved_by_run, next_rate, selective_after};

    #[test]
    fn protection_goes_off_on_a_sustained_rate_and_comes_back_under_the_hysteresis() {
        // One window at 100 % activations from a rate of 0 moves the rate an eighth of the way.
        assert_eq!(next_rate(0, 1000), 125);
        // Bursts of one window in four at 100 %, the rest at 20 %, stay well under 70 %.
        let mut rate = 0;
        for w in 0..64 {
            rate = next_rate(rate, if w % 4 == 0 { 1000 } else { 200 });
            assert!(rate < 600, "window {w}: rate {rate}");
        }
        // Sustained 85 % turns protection off after several windows, not at the first.
        let (mut held, mut off_at) = (true, None);
        rate = 200;
        for w in 0..32 {
            rate = next_rate(rate, 850);
            held = selective_after(held, rate, 70);
            if !held && off_at.is_none() {
                off_at = Some(w);
            }
        }
        let off_at = off_at.expect("protection never went off");
        assert!((3..16).contains(&off_at), "went off at window {off_at}");
        // Back at 65 %, inside the hysteresis: it stays off; at 55 % it comes back.
        assert!(!selective_after(false, 650, 70));
        assert!(selective_after(false, 600, 70));
        assert!(selective_after(true, 700, 70));
        assert!(!selective_after(true, 701, 70));
    }

    #[test]
    fn an_uncounted_move_is_taken_only_where_the_program_pages_are_gone() {
        let (t, f) = (true, false);
        // Counted 1, the window holds 3 and the program lost pages 1 and 2: 3 moved.
        assert_eq!(moved_by_run(1, &[t, t, t, f], &[f, f, f, t]), 3);
        // Counted 0 (EEXIST at the run's first page): the whole prefix is this run's.
        assert_eq!(moved_by_run(0, &[t, t, f, f], &[f, f, t, t]), 2);
        // Program page 1 is still there: window page 1 is not this run's.
        assert_eq!(moved_by_run(1, &[t, t, t, f], &[f, t, f, t]), 1);
        assert_eq!(moved_by_run(0, &[t, f], &[t, t]), 0);
        // Nothing past the count: the count stands.
        assert_eq!(moved_by_run(2, &[t, t, f], &[f, f, t]), 2);
        // A resident page after a gap is not part of the prefix.
        assert_eq!(moved_by_run(0, &[t, f, t], &[f, f, f]), 1);
    }
}
