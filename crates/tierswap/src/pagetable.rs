//! The page table of a region: one [`Pte`] word per 4 KiB page.
//!
//! The words live in a virtual array reserved with MAP_NORESERVE, one 4 KiB page of it
//! ("a chunk") per 512 ptes = 2 MiB of region. The kernel commits a chunk on its first
//! write, so untouched parts of a region cost nothing: a 1 TiB region that touches 1 GiB
//! pays for 512 chunks (2 MiB). A chunk whose ptes are all `None` is released with
//! MADV_DONTNEED and reads back as `None` again; since the array is never unmapped while
//! the region lives, a racing reader can never touch freed memory.
//!
//! Each chunk also counts its present ptes, so that reclaim's clock passes over a 2 MiB
//! stretch with nothing present (the swapped-out bulk of a sparse working set) with one load
//! instead of 512.
//!
//! Owns: pte words, their lock bits, per-chunk use and present counts. Calls: `crate::sys` only.

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};

use crate::sys;

/// Ptes per chunk (one 4 KiB page of ptes, mapping 2 MiB).
pub const PTES_PER_CHUNK: usize = 512;

/// Where a page is, as far as the pager knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PteState {
    /// Never touched (or discarded): the next touch gets a zero page.
    None,
    /// Mapped in the region.
    Present,
    /// Moved to the staging mirror: off the program's page table, still in memory
    /// (the inactive list; a touch moves it back without a copy).
    Staged,
    /// Evicted: its bytes are behind the swap slot in the payload.
    Swapped,
}

/// A page table entry.
///
/// ```text
///  63  62  61  60  59                                             2  1   0
/// +---+-------+---+------------------------------------------------+-------+
/// | L | state | A |              payload (60 bits)                          |
/// +---+-------+---+------------------------------------------------+-------+
///  L       lock bit: the page is in transition; only the holder changes the pte
///  state   0 None, 1 Present, 2 Staged, 3 Swapped
///  A       active: the page was refaulted from the inactive list (workingset)
///  payload Swapped: the swap slot id (all 60 bits).
///          Present / Staged:
///          +------------------------------------------------+-------+
///          |            kept slot + 1 (58 bits)             | mark  |
///          +------------------------------------------------+-------+
///          kept slot: the page came back from a slot that still holds its bytes and
///            has not been written since (clean): evicting it again reuses the slot.
///            0 = none. A present page with a kept slot is write-protected, so a write
///            faults and drops the slot before it lands.
///          mark: 0 none, 1 staged by readahead and not yet used, 2 active in the
///            previous aging round (hot once), 3 poisoned (present only: the program's
///            page is a UFFDIO_POISON marker, every touch gets SIGBUS)
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Pte(u64);

impl Pte {
    const LOCK: u64 = 1 << 63;
    const STATE_SHIFT: u32 = 61;
    const STATE_MASK: u64 = 0b11 << Self::STATE_SHIFT;
    const ACTIVE: u64 = 1 << 60;
    /// Bits available for the payload.
    pub const PAYLOAD_BITS: u32 = 60;
    const PAYLOAD_MASK: u64 = (1 << Self::PAYLOAD_BITS) - 1;
    const MARK_MASK: u64 = 0b11;
    const KEPT_SHIFT: u32 = 2;
    /// Bits of a swapped pte's slot id; the eviction stamp takes the other 30.
    pub const SLOT_BITS: u32 = 30;
    const SLOT_MASK: u64 = (1 << Self::SLOT_BITS) - 1;
    /// Largest slot id a present or staged pte can keep.
    pub const MAX_KEPT_SLOT: u64 = (1 << (Self::PAYLOAD_BITS - Self::KEPT_SHIFT)) - 2;
    const MARK_READAHEAD: u64 = 1;
    const MARK_WAS_ACTIVE: u64 = 2;
    const MARK_POISONED: u64 = 3;

    /// The `None` pte (all bits zero, which is what an untouched chunk reads as).
    pub const NONE: Pte = Pte(0);

    /// A pte in `state` with `payload` (masked to 60 bits).
    pub const fn new(state: PteState, payload: u64) -> Pte {
        let s = match state {
            PteState::None => 0,
            PteState::Present => 1,
            PteState::Staged => 2,
            PteState::Swapped => 3,
        };
        Pte((s << Self::STATE_SHIFT) | (payload & Self::PAYLOAD_MASK))
    }

    /// A present pte.
    pub const fn present() -> Pte {
        Pte::new(PteState::Present, 0)
    }

    /// A present pte of a clean page whose bytes `slot` still holds.
    pub const fn present_clean(slot: u64) -> Pte {
        Pte::new(PteState::Present, (slot + 1) << Self::KEPT_SHIFT)
    }

    /// A staged pte.
    pub const fn staged() -> Pte {
        Pte::new(PteState::Staged, 0)
    }

    /// A staged pte of a page read ahead from disk, not yet used by the program.
    pub const fn staged_readahead() -> Pte {
        Pte::new(PteState::Staged, Self::MARK_READAHEAD)
    }

    const fn mark(self) -> u64 {
        if matches!(self.state(), PteState::Present | PteState::Staged) {
            self.payload() & Self::MARK_MASK
        } else {
            0
        }
    }

    /// This present page, marked active in the previous aging round (its active bit
    /// cleared: one more round before it may be staged). Keeps a kept slot.
    pub const fn aged_hot(self) -> Pte {
        Pte::new(PteState::Present, (self.payload() & !Self::MARK_MASK) | Self::MARK_WAS_ACTIVE)
    }

    /// Whether the page was active in the previous aging round (present or staged).
    pub const fn was_active(self) -> bool {
        self.mark() == Self::MARK_WAS_ACTIVE
    }

    /// The staged pte of this present page, keeping its was-active mark and kept slot.
    pub const fn staged_keeping_hotness(self) -> Pte {
        let mark = if self.was_active() { Self::MARK_WAS_ACTIVE } else { 0 };
        Pte::new(PteState::Staged, (self.payload() & !Self::MARK_MASK) | mark)
    }

    /// A present pte whose page could not be read back and is a poison marker now: it
    /// keeps giving SIGBUS until the program discards it, and reclaim leaves it alone.
    pub const fn poisoned() -> Pte {
        Pte::new(PteState::Present, Self::MARK_POISONED)
    }

    /// Whether the page is a poison marker (see [`Pte::poisoned`]).
    pub const fn is_poisoned(self) -> bool {
        matches!(self.state(), PteState::Present) && self.mark() == Self::MARK_POISONED
    }

    /// Whether this is a staged page read ahead and not yet used.
    pub const fn is_readahead(self) -> bool {
        matches!(self.state(), PteState::Staged) && self.mark() == Self::MARK_READAHEAD
    }

    /// The slot a clean present or staged page keeps, if any.
    pub const fn kept_slot(self) -> Option<u64> {
        if !matches!(self.state(), PteState::Present | PteState::Staged) {
            return None;
        }
        match self.payload() >> Self::KEPT_SHIFT {
            0 => None,
            k => Some(k - 1),
        }
    }

    /// This present or staged pte without its kept slot (the page is, or may be, dirty).
    pub const fn without_kept_slot(self) -> Pte {
        Pte::new(self.state(), self.payload() & Self::MARK_MASK).with_active(self.active())
    }

    /// A swapped pte pointing at `slot`, with no eviction stamp.
    pub const fn swapped(slot: u64) -> Pte {
        Pte::swapped_at(slot, 0)
    }

    /// A swapped pte pointing at `slot` (below 2^30), its page evicted at eviction clock
    /// `stamp` (30 bits kept; 0: unknown). The stamp is the page's own, as the kernel's
    /// shadow entry is: its refault distance is measured from it.
    pub const fn swapped_at(slot: u64, stamp: u32) -> Pte {
        let stamp = (stamp as u64) & Self::SLOT_MASK;
        Pte::new(PteState::Swapped, (stamp << Self::SLOT_BITS) | (slot & Self::SLOT_MASK))
    }

    /// The slot of a swapped pte.
    pub const fn slot(self) -> u64 {
        self.payload() & Self::SLOT_MASK
    }

    /// The eviction stamp of a swapped pte (0: none).
    pub const fn evict_stamp(self) -> u32 {
        if matches!(self.state(), PteState::Swapped) {
            (self.payload() >> Self::SLOT_BITS) as u32
        } else {
            0
        }
    }

    /// The state.
    pub const fn state(self) -> PteState {
        match (self.0 & Self::STATE_MASK) >> Self::STATE_SHIFT {
            0 => PteState::None,
            1 => PteState::Present,
            2 => PteState::Staged,
            _ => PteState::Swapped,
        }
    }

    /// The payload (the slot id of a swapped pte).
    pub const fn payload(self) -> u64 {
        self.0 & Self::PAYLOAD_MASK
    }

    /// Whether the lock bit is set.
    pub const fn locked(self) -> bool {
        self.0 & Self::LOCK != 0
    }

    /// Whether the active bit is set.
    pub const fn active(self) -> bool {
        self.0 & Self::ACTIVE != 0
    }

    /// This pte with the active bit set or cleared.
    pub const fn with_active(self, active: bool) -> Pte {
        if active {
            Pte(self.0 | Self::ACTIVE)
        } else {
            Pte(self.0 & !Self::ACTIVE)
        }
    }

    const fn with_lock(self) -> Pte {
        Pte(self.0 | Self::LOCK)
    }

    const fn without_lock(self) -> Pte {
        Pte(self.0 & !Self::LOCK)
    }

    /// The raw word.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// From a raw word (every bit pattern is a valid pte).
    pub const fn from_raw(raw: u64) -> Pte {
        Pte(raw)
    }
}

impl std::fmt::Debug for Pte {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pte({:?}", self.state())?;
        if self.state() == PteState::Swapped {
            write!(f, " slot {} stamp {}", self.slot(), self.evict_stamp())?;
        }
        if self.active() {
            write!(f, " A")?;
        }
        if self.locked() {
            write!(f, " L")?;
        }
        write!(f, ")")
    }
}

/// The ptes of one region.
pub struct PageTable {
    ptes: *const AtomicU64,
    /// Non-`None` ptes per chunk.
    used: *const AtomicU16,
    /// `Present` ptes per chunk.
    present: *const AtomicU16,
    n_pages: usize,
    ptes_len_bytes: usize,
    /// Bytes of each of the two per-chunk count arrays.
    used_len_bytes: usize,
}

// SAFETY: the table is a pair of arrays of atomics in memory this struct owns; all access
// goes through atomic operations.
unsafe impl Send for PageTable {}
// SAFETY: as above.
unsafe impl Sync for PageTable {}

impl PageTable {
    /// Reserves ptes for `n_pages` pages (virtual only; chunks commit on first write).
    pub fn new(n_pages: usize) -> std::io::Result<PageTable> {
        let n_chunks = n_pages.div_ceil(PTES_PER_CHUNK);
        let ptes_len_bytes = crate::page::round_up_pages(n_pages * 8);
        let used_len_bytes = crate::page::round_up_pages(n_chunks * 2);
        let ptes = sys::mmap_metadata(ptes_len_bytes)?;
        let used = match sys::mmap_metadata(used_len_bytes) {
            Ok(u) => u,
            Err(e) => {
                // SAFETY: just mapped by us, nothing refers to it.
                let _ = unsafe { sys::munmap(ptes, ptes_len_bytes) };
                return Err(e);
            }
        };
        let present = match sys::mmap_metadata(used_len_bytes) {
            Ok(u) => u,
            Err(e) => {
                // SAFETY: both just mapped by us, nothing refers to them.
                unsafe {
                    let _ = sys::munmap(ptes, ptes_len_bytes);
                    let _ = sys::munmap(used, used_len_bytes);
                }
                return Err(e);
            }
        };
        Ok(PageTable {
            ptes: ptes as *const AtomicU64,
            used: used as *const AtomicU16,
            present: present as *const AtomicU16,
            n_pages,
            ptes_len_bytes,
            used_len_bytes,
        })
    }

    /// Pages covered.
    pub fn n_pages(&self) -> usize {
        self.n_pages
    }

    #[inline]
    fn word(&self, idx_page: usize) -> &AtomicU64 {
        assert!(idx_page < self.n_pages, "pte index {idx_page} beyond {} pages", self.n_pages);
        // SAFETY: idx_page is in bounds of the reserved array, which lives as long as self;
        // zero bytes are a valid AtomicU64.
        unsafe { &*self.ptes.add(idx_page) }
    }

    #[inline]
    fn chunk_used(&self, idx_page: usize) -> &AtomicU16 {
        // SAFETY: idx_page / 512 < n_chunks, within the reserved array, which lives as long
        // as self.
        unsafe { &*self.used.add(idx_page / PTES_PER_CHUNK) }
    }

    /// Reads a pte (lock bit included).
    #[inline]
    pub fn load(&self, idx_page: usize) -> Pte {
        Pte(self.word(idx_page).load(Ordering::Acquire))
    }

    /// Locks a pte, waiting while another thread holds it; returns its value (unlocked form).
    pub fn lock(&self, idx_page: usize) -> Pte {
        let w = self.word(idx_page);
        let mut backoff = crate::sync::Backoff::new();
        loop {
            let cur = Pte(w.load(Ordering::Relaxed));
            if !cur.locked()
                && w.compare_exchange_weak(cur.0, cur.with_lock().0, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                return cur;
            }
            backoff.snooze();
        }
    }

    /// Locks a pte if nobody holds it; returns its value (unlocked form).
    pub fn try_lock(&self, idx_page: usize) -> Option<Pte> {
        let w = self.word(idx_page);
        let cur = Pte(w.load(Ordering::Relaxed));
        if cur.locked() {
            return None;
        }
        w.compare_exchange(cur.0, cur.with_lock().0, Ordering::Acquire, Ordering::Relaxed).ok().map(|_| cur)
    }

    /// Locks a pte only if it is unlocked and in `state`.
    pub fn try_lock_in(&self, idx_page: usize, state: PteState) -> Option<Pte> {
        let cur = self.load(idx_page);
        if cur.locked() || cur.state() != state {
            return None;
        }
        self.word(idx_page)
            .compare_exchange(cur.0, cur.with_lock().0, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| cur)
    }

    #[inline]
    fn chunk_present(&self, idx_page: usize) -> &AtomicU16 {
        // SAFETY: as in chunk_used: the present array has the same length.
        unsafe { &*self.present.add(idx_page / PTES_PER_CHUNK) }
    }

    /// Stores `new` into a pte this thread holds locked and unlocks it. `old` is the value
    /// returned when it was locked (for the chunk's use and present counts).
    pub fn unlock(&self, idx_page: usize, old: Pte, new: Pte) {
        let was_none = old.state() == PteState::None;
        let is_none = new.state() == PteState::None;
        if was_none && !is_none {
            self.chunk_used(idx_page).fetch_add(1, Ordering::Relaxed);
        } else if !was_none && is_none {
            self.chunk_used(idx_page).fetch_sub(1, Ordering::Relaxed);
        }
        let was_present = old.state() == PteState::Present;
        let is_present = new.state() == PteState::Present;
        if is_present && !was_present {
            self.chunk_present(idx_page).fetch_add(1, Ordering::Relaxed);
        } else if was_present && !is_present {
            self.chunk_present(idx_page).fetch_sub(1, Ordering::Relaxed);
        }
        let w = self.word(idx_page);
        debug_assert!(Pte(w.load(Ordering::Relaxed)).locked(), "unlock of an unlocked pte {idx_page}");
        w.store(new.without_lock().0, Ordering::Release);
    }

    /// Whether chunk `idx_chunk` (ptes `[idx_chunk * 512, +512)`) holds a non-`None` pte.
    pub fn chunk_in_use(&self, idx_chunk: usize) -> bool {
        assert!(idx_chunk < self.n_pages.div_ceil(PTES_PER_CHUNK));
        // SAFETY: idx_chunk < n_chunks, in bounds; see chunk_used.
        unsafe { &*self.used.add(idx_chunk) }.load(Ordering::Relaxed) != 0
    }

    /// Whether the chunk of page `idx_page` may hold a present pte. A hint for scans: a pte
    /// turning present meanwhile is counted only once its holder unlocks it.
    pub fn chunk_has_present(&self, idx_page: usize) -> bool {
        assert!(idx_page < self.n_pages, "pte index {idx_page} beyond {} pages", self.n_pages);
        self.chunk_present(idx_page).load(Ordering::Relaxed) != 0
    }

    /// Chunks holding at least one non-`None` pte (each costs one 4 KiB page).
    pub fn chunks_in_use(&self) -> usize {
        (0..self.n_pages.div_ceil(PTES_PER_CHUNK))
            // SAFETY: c < n_chunks, in bounds; see chunk_used.
            .filter(|&c| unsafe { &*self.used.add(c) }.load(Ordering::Relaxed) != 0)
            .count()
    }

    /// Releases the memory of chunks whose ptes are all `None`. Needs `&mut self`: no
    /// other thread may be locking ptes meanwhile (a pte locked in a chunk being released
    /// would lose its write).
    pub fn release_empty_chunks(&mut self) -> usize {
        let mut released = 0;
        for c in 0..self.n_pages.div_ceil(PTES_PER_CHUNK) {
            // SAFETY: c < n_chunks; see chunk_used.
            if unsafe { &*self.used.add(c) }.load(Ordering::Relaxed) == 0 {
                let addr = self.ptes as usize + c * PTES_PER_CHUNK * 8;
                // SAFETY: a chunk of our own array with no live pte; it reads back as None.
                if unsafe { sys::madvise(addr, crate::page::PAGE_SIZE, libc::MADV_DONTNEED) }.is_ok() {
                    released += 1;
                }
            }
        }
        released
    }
}

impl Drop for PageTable {
    fn drop(&mut self) {
        // SAFETY: both arrays are ours and nothing refers to them once the table drops.
        unsafe {
            let _ = sys::munmap(self.ptes as usize, self.ptes_len_bytes);
            let _ = sys::munmap(self.used as usize, self.used_len_bytes);
            let _ = sys::munmap(self.present as usize, self.used_len_bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn staged_markers_are_distinct() {
        assert!(Pte::staged_readahead().is_readahead() && !Pte::staged_readahead().was_active());
        let hot_present = Pte::present().aged_hot();
        assert!(hot_present.was_active() && hot_present.state() == PteState::Present);
        let hot = hot_present.staged_keeping_hotness();
        assert!(hot.was_active() && !hot.is_readahead() && hot.state() == PteState::Staged);
        assert!(!Pte::swapped(2).was_active(), "a slot id is not a marker");
        assert!(Pte::swapped(6).kept_slot().is_none(), "a slot id is not a kept slot");
        assert!(!Pte::staged().was_active() && !Pte::staged().is_readahead());
        assert_eq!(Pte::present().staged_keeping_hotness(), Pte::staged());
        // A kept slot survives aging and staging, and goes when the page may be dirty.
        let clean = Pte::present_clean(77);
        assert_eq!(clean.kept_slot(), Some(77));
        assert_eq!(clean.aged_hot().kept_slot(), Some(77));
        assert!(clean.aged_hot().was_active());
        let staged = clean.aged_hot().staged_keeping_hotness();
        assert_eq!((staged.kept_slot(), staged.was_active()), (Some(77), true));
        assert_eq!(staged.without_kept_slot().kept_slot(), None);
        assert!(staged.without_kept_slot().was_active());
        assert_eq!(Pte::present_clean(0).kept_slot(), Some(0));
        // A poison marker is none of the others, and no other present or staged pte is one.
        let poisoned = Pte::poisoned();
        assert!(poisoned.is_poisoned() && poisoned.state() == PteState::Present);
        assert!(!poisoned.was_active() && !poisoned.is_readahead() && poisoned.kept_slot().is_none());
        assert!(poisoned.with_active(true).is_poisoned());
        for p in [Pte::present(), Pte::present().aged_hot(), Pte::staged(), Pte::staged_readahead(), Pte::swapped(3)] {
            assert!(!p.is_poisoned(), "{p:?}");
        }
        assert_eq!(Pte::present_clean(Pte::MAX_KEPT_SLOT).kept_slot(), Some(Pte::MAX_KEPT_SLOT));
        assert_eq!(Pte::present_clean(9).evict_stamp(), 0, "only a swapped pte has a stamp");
    }

    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn pte_round_trip(state in 0u8..4, payload in 0u64..(1 << 60), active: bool) {
            let st = [PteState::None, PteState::Present, PteState::Staged, PteState::Swapped][state as usize];
            let p = Pte::new(st, payload).with_active(active);
            prop_assert_eq!(p.state(), st);
            prop_assert_eq!(p.payload(), payload);
            prop_assert_eq!(p.active(), active);
            prop_assert!(!p.locked());
            prop_assert_eq!(Pte::from_raw(p.raw()), p);
            prop_assert_eq!(p.with_lock().without_lock(), p);
        }

        #[test]
        fn swapped_pte_round_trip(slot in 0u64..(1 << 30), stamp in 0u32..(1 << 30), active: bool) {
            let p = Pte::swapped_at(slot, stamp).with_active(active);
            prop_assert_eq!(p.state(), PteState::Swapped);
            prop_assert_eq!((p.slot(), p.evict_stamp(), p.active()), (slot, stamp, active));
            prop_assert!(p.kept_slot().is_none() && !p.was_active() && !p.is_poisoned());
            prop_assert_eq!(Pte::from_raw(p.with_lock().raw()).without_lock(), p);
            prop_assert_eq!(Pte::swapped(slot).evict_stamp(), 0);
        }

        #[test]
        fn kept_slot_round_trip(slot in 0u64..=Pte::MAX_KEPT_SLOT, hot: bool, active: bool, staged: bool) {
            let mut p = Pte::present_clean(slot).with_active(active);
            if hot {
                p = p.aged_hot().with_active(active);
            }
            if staged {
                p = p.staged_keeping_hotness().with_active(active);
            }
            prop_assert_eq!(p.kept_slot(), Some(slot));
            prop_assert_eq!(p.was_active(), hot);
            prop_assert_eq!(p.active(), active);
            prop_assert!(!p.is_readahead());
            let dirty = p.without_kept_slot();
            prop_assert_eq!(dirty.kept_slot(), None);
            prop_assert_eq!((dirty.was_active(), dirty.active(), dirty.state()), (hot, active, p.state()));
        }
    }

    #[test]
    fn lock_unlock_and_chunk_counts() {
        let mut t = PageTable::new(3 * PTES_PER_CHUNK + 7).unwrap();
        assert_eq!(t.load(5), Pte::NONE);
        let old = t.lock(5);
        assert!(t.load(5).locked());
        assert!(t.try_lock(5).is_none());
        t.unlock(5, old, Pte::swapped(42));
        assert_eq!(t.load(5), Pte::swapped(42));
        let old = t.lock(PTES_PER_CHUNK * 3 + 6);
        t.unlock(PTES_PER_CHUNK * 3 + 6, old, Pte::present());
        assert_eq!(t.chunks_in_use(), 2);
        // Present counts: only the last chunk holds a present pte.
        assert!(!t.chunk_has_present(5) && t.chunk_has_present(PTES_PER_CHUNK * 3));
        let old = t.try_lock_in(5, PteState::Swapped).unwrap();
        t.unlock(5, old, Pte::present());
        assert!(t.chunk_has_present(0) && !t.chunk_has_present(PTES_PER_CHUNK));
        // Locking and unlocking unchanged, or present to present, keeps the count.
        let old = t.lock(5);
        t.unlock(5, old, old);
        let old = t.lock(5);
        t.unlock(5, old, Pte::present_clean(9));
        assert!(t.chunk_has_present(511));
        let old = t.lock(5);
        t.unlock(5, old, Pte::NONE);
        assert!(!t.chunk_has_present(0));
        assert_eq!(t.chunks_in_use(), 1);
        assert_eq!(t.release_empty_chunks(), 3);
        assert_eq!(t.load(PTES_PER_CHUNK * 3 + 6), Pte::present());
        assert!(t.try_lock_in(PTES_PER_CHUNK * 3 + 6, PteState::Staged).is_none());
    }

    #[test]
    fn lock_excludes_threads() {
        let t = std::sync::Arc::new(PageTable::new(64).unwrap());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        let old = t.lock(3);
                        t.unlock(3, old, Pte::swapped(old.slot() + 1));
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(t.load(3).slot(), 8000);
    }
}
