//! Eviction: the oldest staged blocks whose pages were not touched are classified (zero,
//! same-filled, compressible, incompressible), stored in a backend behind freshly allocated
//! slots, and dropped from the mirror, several blocks' ranges at once.
//!
//! Owns: the pending releases. Calls: the memory manager, the backends.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;

use super::{Reclaim, LANE, RELEASE_RANGES};
use crate::backend::compress::{compress_page, INCOMPRESSIBLE_LIMIT};
use crate::backend::zero::same_filled_pattern;
use crate::mm::RegionInner;
use crate::page::{BLOCK_PAGES, PAGE_SIZE};
use crate::pagetable::{Pte, PteState};
use crate::swap::{SwapEntry, Tag};
use crate::sys::{self};

/// Evicted pages whose mirror copies are not dropped yet. Their bytes are stored and their
/// slots placed, but their ptes stay locked (a fault on one waits) until
/// [`Reclaim::release`] drops every range at once and points the ptes at their slots.
/// Dropping a range costs a TLB shootdown while the program runs on the other CPU: one
/// process_madvise over 8 blocks measured 26 µs a block here, against 40–46 µs for one
/// madvise each. Always released before the region's reclaim lock is let go.
#[derive(Default)]
pub(super) struct Pending {
    /// Mirror ranges (address, bytes), adjacent ones merged.
    pub(super) ranges: Vec<(usize, usize)>,
    /// (page index, slot) of every page whose range is pending.
    pub(super) pages: Vec<(usize, u64)>,
    pub(super) blocks: usize,
}

impl Pending {
    pub(super) fn push_range(&mut self, addr: usize, len: usize) {
        match self.ranges.last_mut() {
            Some((a, l)) if *a + *l == addr => *l += len,
            _ => self.ranges.push((addr, len)),
        }
    }
}

/// The bytes of a locked staged page, in the mirror.
pub(super) fn mirror_page(r: &RegionInner, idx_page: usize) -> &[u8] {
    // SAFETY: the caller holds the page's pte locked in the Staged state: its bytes sit in
    // the mirror, which only the pager touches, and nobody else reads or writes them while
    // the lock is held. The mirror lives as long as the region.
    unsafe { std::slice::from_raw_parts(r.mirror_addr(idx_page) as *const u8, PAGE_SIZE) }
}

pub(super) enum Stored {
    /// Placed: the entry to store.
    Entry(SwapEntry),
    /// Queued in the file unit at this offset with this payload length.
    ToFile(usize, usize),
    /// The file unit is full: write it, then store the page again.
    UnitFull,
    /// Nothing can take the page now: it stays staged, in memory.
    Keep,
}

impl Reclaim {
    /// Evicts up to `max_blocks` of the oldest staged blocks (blocks whose pages were all
    /// touched again meanwhile do not count). Returns pages evicted.
    pub(super) fn evict(&mut self, max_blocks: usize) -> usize {
        let mut evicted = 0;
        let mut blocks = 0;
        let mut busy = Vec::new();
        while blocks < max_blocks {
            let Some((id, b)) = self.s.acct.inactive.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else {
                break;
            };
            let Some(r) = self.s.region_by_id(id) else {
                continue;
            };
            let Ok(_guard) = r.reclaim_lock.try_read() else {
                busy.push((id, b));
                continue;
            };
            if r.dead.load(Ordering::Acquire) {
                continue;
            }
            // Evict this block and the ones after it in the queue from the same region
            // under one hold of its lock, their mirror ranges dropped in batches.
            let mut b = b;
            loop {
                let n = self.evict_block(&r, b);
                if n > 0 {
                    evicted += n;
                    blocks += 1;
                }
                if self.pending.blocks >= self.release_blocks {
                    self.release(&r);
                }
                if blocks >= max_blocks {
                    break;
                }
                let mut q = self.s.acct.inactive.lock().unwrap_or_else(|e| e.into_inner());
                match q.front() {
                    Some(&(next_id, next_b)) if next_id == id => {
                        q.pop_front();
                        b = next_b;
                    }
                    _ => break,
                }
            }
            self.release(&r);
        }
        if !busy.is_empty() {
            let mut q = self.s.acct.inactive.lock().unwrap_or_else(|e| e.into_inner());
            for x in busy.into_iter().rev() {
                q.push_front(x);
            }
        }
        evicted
    }

    pub(super) fn evict_block(&mut self, r: &RegionInner, b: usize) -> usize {
        let start = b * BLOCK_PAGES;
        let end = (start + BLOCK_PAGES).min(r.n_pages);
        let mut pages = [usize::MAX; BLOCK_PAGES];
        let mut hot = [false; BLOCK_PAGES];
        let mut n = 0;
        let mut clean = [false; BLOCK_PAGES];
        let mut any_clean = false;
        for i in start..end {
            if let Some(old) = r.ptes.try_lock_in(i, PteState::Staged) {
                let old = match old.kept_slot() {
                    Some(kept) if !self.kept_copy_reachable(kept) => {
                        // Its only other copy is on a remote that is failing: evicting it
                        // clean would leave it there alone. It goes out like a written page.
                        crate::mm::slots::put_slot(&self.s, kept);
                        r.ptes.unlock(i, old, old.without_kept_slot());
                        match r.ptes.try_lock_in(i, PteState::Staged) {
                            Some(p) => p,
                            None => continue,
                        }
                    }
                    _ => old,
                };
                if old.kept_slot().is_some() {
                    clean[i - start] = true;
                    any_clean = true;
                } else {
                    pages[n] = i;
                    hot[n] = old.was_active();
                    n += 1;
                }
            }
        }
        let clean_evicted = if any_clean { self.evict_clean(r, start, &clean) } else { 0 };
        if n == 0 {
            if clean_evicted > 0 {
                self.pending.blocks += 1;
            }
            return clean_evicted;
        }
        let mut slots = std::mem::take(&mut self.slots);
        slots.clear();
        let got = match self.s.tiers.swap.alloc(LANE, n, &mut slots) {
            Ok(got) => got,
            Err(e) => {
                eprintln!("tierswap: {e}; pages stay in memory");
                0
            }
        };
        // Pages without a slot stay staged.
        for &i in &pages[got..n] {
            let old = r.ptes.load(i);
            r.ptes.unlock(i, old, old);
        }
        let mut placed = [true; BLOCK_PAGES];
        let mut file_pending: Vec<(usize, u64, usize)> = Vec::new();
        for k in 0..got {
            let page = mirror_page(r, pages[k]);
            let mut stored = self.store_page(page, slots[k]);
            if let Stored::UnitFull = stored {
                self.flush_file_pending(r, &pages, &slots, &mut file_pending, &mut placed);
                stored = self.store_page(page, slots[k]);
            }
            match stored {
                // A page that was hot once gets a second chance against pool writeback.
                Stored::Entry(e) if hot[k] && e.tag() == Tag::Pool => self.place(slots[k], e.with_referenced(true)),
                Stored::Entry(e) => self.place(slots[k], e),
                Stored::ToFile(off_in_unit, len) => file_pending.push((k, off_in_unit as u64, len)),
                Stored::UnitFull | Stored::Keep => placed[k] = false,
            }
        }
        if !file_pending.is_empty() {
            self.flush_file_pending(r, &pages, &slots, &mut file_pending, &mut placed);
        }
        // The stored pages stay locked until their mirror copies are dropped, with the
        // next blocks', in [`Reclaim::release`].
        let mut evicted = 0;
        for k in 0..got {
            let i = pages[k];
            if placed[k] {
                self.pending.push_range(r.mirror_addr(i), PAGE_SIZE);
                self.pending.pages.push((i, slots[k]));
                evicted += 1;
            } else {
                // Nowhere to put it now: give the slot back, the page stays staged.
                let e = self.s.tiers.swap.lock(slots[k]);
                self.s.tiers.swap.unlock(slots[k], e, SwapEntry::FREE);
                let old = r.ptes.load(i);
                r.ptes.unlock(i, old, old);
            }
        }
        if evicted + clean_evicted > 0 {
            self.pending.blocks += 1;
        }
        self.slots = slots;
        evicted + clean_evicted
    }

    /// Drops the mirror copies of the pending evicted pages of `r` and points their ptes
    /// at their slots. A range that cannot be dropped is reported and its pages count as
    /// evicted all the same: their bytes are in their slots, only the memory stays taken.
    pub(super) fn release(&mut self, r: &RegionInner) {
        if self.pending.pages.is_empty() {
            return;
        }
        let mut done = 0;
        while done < self.pending.ranges.len() {
            done += self.drop_ranges(done);
        }
        // Each page's own eviction time goes into its pte (workingset detection).
        let stamp = self.s.tiers.swap.evict_stamp_now();
        for &(i, slot) in &self.pending.pages {
            let old = r.ptes.load(i);
            r.ptes.unlock(i, old, Pte::swapped_at(slot, stamp));
        }
        let evicted = self.pending.pages.len();
        self.s.acct.staged_pages.fetch_sub(evicted as i64, Ordering::Relaxed);
        self.s.counters.pgsteal.fetch_add(evicted as u64, Ordering::Relaxed);
        self.s.tiers.swap.note_evictions(evicted as u64);
        self.pending.ranges.clear();
        self.pending.pages.clear();
        self.pending.blocks = 0;
    }

    /// Drops pending ranges from `from` on: up to [`RELEASE_RANGES`] with one
    /// process_madvise, or one with madvise where that is not available or stopped short.
    /// Returns how many ranges it finished.
    pub(super) fn drop_ranges(&mut self, from: usize) -> usize {
        let ranges = &self.pending.ranges[from..];
        if let Some(pidfd) = &self.pidfd {
            let n = ranges.len().min(RELEASE_RANGES);
            let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; RELEASE_RANGES];
            for (v, &(addr, len)) in iov.iter_mut().zip(&ranges[..n]) {
                *v = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
            }
            // SAFETY: the mirror pages of locked, stored pages; nothing else refers to them.
            match unsafe { sys::process_madvise(pidfd.as_fd(), &iov[..n], libc::MADV_DONTNEED) } {
                Ok(bytes) => {
                    // Whole ranges advised before a failing one; that one goes to madvise.
                    let mut left = bytes;
                    let mut whole = 0;
                    while whole < n && left >= ranges[whole].1 {
                        left -= ranges[whole].1;
                        whole += 1;
                    }
                    if whole > 0 {
                        return whole;
                    }
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS | libc::EPERM)) => {
                    // This kernel cannot: madvise from now on.
                    self.pidfd = None;
                }
                Err(_) => {}
            }
        }
        let (addr, len) = ranges[0];
        // SAFETY: as above.
        if let Err(e) = unsafe { sys::madvise(addr, len, libc::MADV_DONTNEED) } {
            eprintln!("tierswap: releasing staged pages at {addr:#x} failed: {e}");
        }
        1
    }

    /// Evicts the locked, clean staged pages of the block at `start` (`clean[k]` for page
    /// `start + k`): their kept slot still holds exactly their bytes (a write would have
    /// faulted and dropped it first), so eviction is dropping the page and pointing the pte
    /// back at the slot. No compression, no IO.
    pub(super) fn evict_clean(&mut self, r: &RegionInner, start: usize, clean: &[bool; BLOCK_PAGES]) -> usize {
        let mut evicted = 0;
        for (k, _) in clean.iter().enumerate().filter(|(_, &c)| c) {
            let i = start + k;
            let old = r.ptes.load(i);
            match old.kept_slot() {
                Some(slot) => {
                    // Dropped from the mirror with the block's other pages in [`Reclaim::release`].
                    self.pending.push_range(r.mirror_addr(i), PAGE_SIZE);
                    self.pending.pages.push((i, slot));
                    if !self.s.config.workingset_page_stamp {
                        self.s.tiers.swap.restamp(slot);
                    }
                    evicted += 1;
                }
                None => r.ptes.unlock(i, old, old),
            }
        }
        self.s.counters.swpout_clean.fetch_add(evicted as u64, Ordering::Relaxed);
        evicted
    }

    /// Whether a clean page's kept slot can stand for it: its copy is in memory or on the
    /// file, or on a remote that has not failed since its last batch written.
    pub(super) fn kept_copy_reachable(&self, slot: u64) -> bool {
        self.s.tiers.swap.load(slot).tag() != Tag::Remote || self.s.tiers.remote.as_ref().is_some_and(|r| r.healthy())
    }

    pub(super) fn place(&self, slot: u64, e: SwapEntry) {
        let old = self.s.tiers.swap.lock(slot);
        self.s.tiers.swap.unlock(slot, old, e);
    }

    /// Classifies and stores one page.
    pub(super) fn store_page(&mut self, page: &[u8], slot: u64) -> Stored {
        let s = &self.s;
        let tiers = s.config.tiers;
        if tiers.zero {
            if let Some(p) = same_filled_pattern(page) {
                if p == 0 {
                    s.counters.swpout_zero.fetch_add(1, Ordering::Relaxed);
                    return Stored::Entry(SwapEntry::zero());
                }
                if let Some(e) = SwapEntry::same_filled(p) {
                    s.counters.swpout_samefill.fetch_add(1, Ordering::Relaxed);
                    return Stored::Entry(e);
                }
            }
        }
        let limit = if tiers.pool { INCOMPRESSIBLE_LIMIT } else { PAGE_SIZE - 64 };
        let clen = compress_page(s.config.compressor, s.config.literal_retry, page, &mut self.compressed, limit);
        match clen {
            Some(len) if tiers.pool => match s.tiers.pool.store(&self.compressed[..len]) {
                Ok(h) => {
                    s.counters.zswpout.fetch_add(1, Ordering::Relaxed);
                    let e = SwapEntry::pool(h.raw(), len);
                    crate::mm::slots::count_recompressible(s, e, true);
                    Stored::Entry(e)
                }
                Err(_) => self.store_in_file_or_raw(page, slot, Some(len)),
            },
            Some(len) => self.store_in_file_or_raw(page, slot, Some(len)),
            None => {
                s.counters.pool_reject_incompressible.fetch_add(1, Ordering::Relaxed);
                self.store_in_file_or_raw(page, slot, None)
            }
        }
    }

    /// Puts a page in the file unit being filled (compressed if `clen`), or keeps it raw in
    /// the pool when there is no file tier.
    pub(super) fn store_in_file_or_raw(&mut self, page: &[u8], slot: u64, clen: Option<usize>) -> Stored {
        if self.s.tiers.file_off.load(Ordering::Acquire) {
            return self.store_raw(page);
        }
        if let Some(w) = self.writer.as_mut() {
            let payload: &[u8] = match clen {
                Some(len) => &self.compressed[..len],
                None => page,
            };
            if let Some(off) = w.push(slot, payload) {
                return Stored::ToFile(off, payload.len());
            }
            if w.records() > 0 {
                return Stored::UnitFull;
            }
        }
        self.store_raw(page)
    }

    pub(super) fn store_raw(&self, page: &[u8]) -> Stored {
        match self.s.tiers.pool.store(page) {
            Ok(h) => {
                self.s.counters.pool_stored_raw.fetch_add(1, Ordering::Relaxed);
                Stored::Entry(SwapEntry::pool(h.raw(), PAGE_SIZE))
            }
            Err(_) => Stored::Keep,
        }
    }

    /// Writes the pending file records of a block and places their entries; on a write
    /// error the pages go to the pool raw instead (never dropped), or stay staged.
    pub(super) fn flush_file_pending(
        &mut self,
        r: &RegionInner,
        pages: &[usize],
        slots: &[u64],
        pending: &mut Vec<(usize, u64, usize)>,
        placed: &mut [bool],
    ) {
        let (Some(file), Some(w)) = (self.s.tiers.file.as_ref(), self.writer.as_mut()) else {
            return;
        };
        if pending.is_empty() {
            return;
        }
        let gate = self.s.tiers.file_gate.read().unwrap_or_else(|e| e.into_inner());
        let res = if self.s.tiers.file_off.load(Ordering::Acquire) {
            Err(crate::backend::file::FileError::Off)
        } else {
            file.write_unit(w)
        };
        drop(gate);
        let io_bytes = w.io_bytes() as u64;
        w.clear();
        match res {
            Ok(base) => {
                self.s.counters.file_writes.fetch_add(1, Ordering::Relaxed);
                self.s.counters.file_io_bytes.fetch_add(io_bytes, Ordering::Relaxed);
                for &(k, off, len) in pending.iter() {
                    self.s.counters.pswpout.fetch_add(1, Ordering::Relaxed);
                    self.s.counters.file_write_bytes.fetch_add(len as u64, Ordering::Relaxed);
                    self.place(slots[k], SwapEntry::file(base + off, len));
                }
            }
            Err(e) => {
                let drained = matches!(e, crate::backend::file::FileError::Off);
                if !drained {
                    self.s.counters.writeback_errors.fetch_add(1, Ordering::Relaxed);
                }
                if !drained && !self.warned_write_error {
                    self.warned_write_error = true;
                    eprintln!("tierswap: {e}; keeping pages in memory instead (the footprint may exceed the budget)");
                }
                for &(k, _, _) in pending.iter() {
                    match self.store_raw(mirror_page(r, pages[k])) {
                        Stored::Entry(e) => self.place(slots[k], e),
                        _ => placed[k] = false,
                    }
                }
            }
        }
        pending.clear();
    }
}
