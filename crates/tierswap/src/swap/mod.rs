//! The virtual swap space: slot ids decoupled from where the bytes live.
//!
//! A slot is `cluster * 512 + offset`. Its [`SwapEntry`] (one u64 in the swap table) names
//! the backend and location, so a page can move between backends (pool writeback, drain)
//! without its pte changing. Clusters are handed out on demand and given back when empty:
//! the swap table is a virtual array reserved with MAP_NORESERVE whose 4 KiB pages (one
//! per cluster) are committed when a cluster is first used and released with
//! MADV_DONTNEED when it empties (a released page reads back as free entries). The static
//! cost of the space is its reservation, not memory.
//!
//! Allocation follows mm/swapfile.c: each lane (reclaim thread, …) allocates from its own
//! current cluster, so pages evicted together get consecutive slots; full clusters go on an
//! age-ordered list that writeback walks coldest first; clusters with holes go on the
//! nonfull list and are reused before fresh ones.
//!
//! Owns: swap table, cluster headers, the allocator lists. Calls: `crate::sys` only.

pub mod cluster;
pub mod entry;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub use cluster::{ClusterHeader, ClusterState, CLUSTER_HEADER_BYTES, SLOTS_PER_CLUSTER};
pub use entry::{SwapEntry, Tag};

use crate::page::PAGE_SIZE;
use crate::sync::Backoff;
use crate::sys;

/// Default size of the virtual swap space: 2^30 slots (4 TiB of pages). Costs 8 GiB of
/// address space for the table and 160 MiB for headers, no memory until used.
pub const DEFAULT_MAX_SLOTS: u64 = 1 << 30;

/// The swap space is full: every cluster of the reservation is in use.
#[derive(Debug, thiserror::Error)]
#[error("the virtual swap space is full ({max_slots} slots in use)")]
pub struct SpaceFull {
    /// Slots the space holds.
    pub max_slots: u64,
}

struct Allocator {
    /// Released clusters, reused before fresh ones.
    free: Vec<u32>,
    /// Clusters with free slots that are nobody's current; may hold stale ids.
    nonfull: VecDeque<u32>,
    /// Clusters in the order they stopped being current, with the `seq` they had then;
    /// an entry whose seq no longer matches the header is stale.
    lru: VecDeque<(u32, u32)>,
    /// Each lane's current cluster.
    current: Vec<Option<u32>>,
    /// Clusters never used yet start here.
    next_new: u32,
    seq: u32,
}

/// The virtual swap space.
pub struct SwapSpace {
    table: *const AtomicU64,
    headers: *const ClusterHeader,
    max_clusters: u32,
    table_len_bytes: usize,
    headers_len_bytes: usize,
    alloc: Mutex<Allocator>,
    /// Slots per tag (Free excluded).
    by_tag: [AtomicU64; 8],
    clusters_in_use: AtomicU64,
    /// Pages evicted so far (the nonresident age of workingset detection).
    evictions: AtomicU64,
}

/// The eviction clock ticks once per this many evictions in cluster stamps (32 bits then
/// last 2^36 evictions, 256 TiB of swap-out, before they wrap).
const EVICT_CLOCK_SHIFT: u32 = 4;
/// The bits of the eviction clock a swapped pte keeps.
const PAGE_STAMP_MASK: u32 = (1 << 30) - 1;

// SAFETY: the table and headers are arrays of atomics this struct owns; all access is atomic
// or under `alloc`.
unsafe impl Send for SwapSpace {}
// SAFETY: as above.
unsafe impl Sync for SwapSpace {}

impl SwapSpace {
    /// Reserves a swap space of `max_slots` (rounded up to whole clusters) and `lanes`
    /// allocation lanes.
    pub fn new(max_slots: u64, lanes: usize) -> std::io::Result<SwapSpace> {
        let max_clusters = max_slots.div_ceil(SLOTS_PER_CLUSTER as u64).clamp(1, u32::MAX as u64) as u32;
        let table_len_bytes = max_clusters as usize * SLOTS_PER_CLUSTER * 8;
        let headers_len_bytes = crate::page::round_up_pages(max_clusters as usize * CLUSTER_HEADER_BYTES);
        let table = sys::mmap_metadata(table_len_bytes)?;
        let headers = match sys::mmap_metadata(headers_len_bytes) {
            Ok(h) => h,
            Err(e) => {
                // SAFETY: just mapped by us, unused.
                let _ = unsafe { sys::munmap(table, table_len_bytes) };
                return Err(e);
            }
        };
        Ok(SwapSpace {
            table: table as *const AtomicU64,
            headers: headers as *const ClusterHeader,
            max_clusters,
            table_len_bytes,
            headers_len_bytes,
            alloc: Mutex::new(Allocator {
                free: Vec::new(),
                nonfull: VecDeque::new(),
                lru: VecDeque::new(),
                current: vec![None; lanes.max(1)],
                next_new: 0,
                seq: 0,
            }),
            by_tag: Default::default(),
            clusters_in_use: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        })
    }

    /// Slots the space can hold.
    pub fn max_slots(&self) -> u64 {
        self.max_clusters as u64 * SLOTS_PER_CLUSTER as u64
    }

    #[inline]
    fn word(&self, slot: u64) -> &AtomicU64 {
        assert!(slot < self.max_slots(), "slot {slot} beyond the swap space");
        // SAFETY: in bounds of the reserved table, which lives as long as self; zero bytes
        // are a valid AtomicU64.
        unsafe { &*self.table.add(slot as usize) }
    }

    /// The header of cluster `cid`.
    #[inline]
    pub fn header(&self, cid: u32) -> &ClusterHeader {
        assert!(cid < self.max_clusters);
        // SAFETY: in bounds of the reserved header array; all-zero is a valid header.
        unsafe { &*self.headers.add(cid as usize) }
    }

    /// Reads an entry.
    #[inline]
    pub fn load(&self, slot: u64) -> SwapEntry {
        SwapEntry::from_raw(self.word(slot).load(Ordering::Acquire))
    }

    /// Locks an entry, waiting while another thread holds it; returns it unlocked-form.
    pub fn lock(&self, slot: u64) -> SwapEntry {
        let w = self.word(slot);
        let mut backoff = Backoff::new();
        loop {
            let cur = SwapEntry::from_raw(w.load(Ordering::Relaxed));
            if !cur.locked()
                && w.compare_exchange_weak(cur.raw(), cur.with_lock().raw(), Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return cur;
            }
            backoff.snooze();
        }
    }

    /// Locks an entry if nobody holds it.
    pub fn try_lock(&self, slot: u64) -> Option<SwapEntry> {
        let w = self.word(slot);
        let cur = SwapEntry::from_raw(w.load(Ordering::Relaxed));
        if cur.locked() {
            return None;
        }
        w.compare_exchange(cur.raw(), cur.with_lock().raw(), Ordering::Acquire, Ordering::Relaxed).ok().map(|_| cur)
    }

    /// Stores `new` into an entry this thread locked (whose value was `old`) and unlocks it,
    /// keeping the per-tag counts and the in-memory bitmap in step. Storing a Free entry
    /// releases the slot.
    pub fn unlock(&self, slot: u64, old: SwapEntry, new: SwapEntry) {
        let (cid, off) = split(slot);
        if old.tag() != new.tag() {
            if old.tag() != Tag::Free {
                self.by_tag[old.tag().index()].fetch_sub(1, Ordering::Relaxed);
            }
            if new.tag() != Tag::Free {
                self.by_tag[new.tag().index()].fetch_add(1, Ordering::Relaxed);
            }
            if old.tag().in_memory() != new.tag().in_memory() {
                self.header(cid).set_in_memory(off, new.tag().in_memory());
            }
        }
        self.word(slot).store(new.without_lock().raw(), Ordering::Release);
        if new.tag() == Tag::Free && old.tag() != Tag::Free {
            self.release(cid);
        }
    }

    /// Allocates up to `n` slots for `lane`, consecutive where the current cluster allows,
    /// appending them to `out`; each comes back Reserved with count 1, unlocked. Returns how
    /// many it gave; fewer than `n` only when the space is full.
    pub fn alloc(&self, lane: usize, n: usize, out: &mut Vec<u64>) -> Result<usize, SpaceFull> {
        let mut a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        let lane = lane % a.current.len();
        let mut got = 0;
        while got < n {
            let cid = match a.current[lane] {
                Some(c) => c,
                None => match self.take_cluster(&mut a) {
                    Some(c) => {
                        a.current[lane] = Some(c);
                        c
                    }
                    None if got > 0 => break,
                    None => return Err(SpaceFull { max_slots: self.max_slots() }),
                },
            };
            let h = self.header(cid);
            // The stamp of a cluster's first fill stays until it empties: reused slots then
            // look older than they are, which errs toward not activating (the kernel's
            // behaviour without workingset detection) rather than toward protecting pages.
            if h.evict_stamp.load(Ordering::Relaxed) == 0 {
                h.evict_stamp.store(self.evict_clock(), Ordering::Relaxed);
            }
            let base = cid as u64 * SLOTS_PER_CLUSTER as u64;
            let got_before = got;
            for off in 0..SLOTS_PER_CLUSTER as u64 {
                if got == n {
                    break;
                }
                let w = self.word(base + off);
                if w.load(Ordering::Relaxed) == 0
                    && w.compare_exchange(
                        0,
                        SwapEntry::new(Tag::Reserved, 1, 0).raw(),
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
                {
                    h.used.fetch_add(1, Ordering::Relaxed);
                    self.by_tag[Tag::Reserved.index()].fetch_add(1, Ordering::Relaxed);
                    out.push(base + off);
                    got += 1;
                }
            }
            // A scan that found nothing means every word is taken (a slot being freed stores
            // its free word before dropping `used`), so the cluster is done either way.
            if got == got_before || h.used.load(Ordering::Relaxed) as usize >= SLOTS_PER_CLUSTER {
                a.current[lane] = None;
                a.seq = a.seq.wrapping_add(1);
                let seq = a.seq;
                h.seq.store(seq, Ordering::Relaxed);
                // A racing release may already have freed a slot: then it is nonfull.
                if (h.used.load(Ordering::Relaxed) as usize) < SLOTS_PER_CLUSTER {
                    h.set_state(ClusterState::Nonfull);
                    a.nonfull.push_back(cid);
                } else {
                    h.set_state(ClusterState::Full);
                }
                a.lru.push_back((cid, seq));
            }
        }
        Ok(got)
    }

    /// Counts `n` pages evicted (reclaim calls it; the clock of workingset detection).
    pub fn note_evictions(&self, n: u64) {
        self.evictions.fetch_add(n, Ordering::Relaxed);
    }

    /// A page evicted again onto the slot it kept (a clean page): it is its cluster's
    /// newest eviction now. Without this a page churning through its kept slot looked as
    /// old as its first eviction, and its refaults never counted as working set.
    pub fn restamp(&self, slot: u64) {
        let (cid, _) = split(slot);
        self.header(cid).evict_stamp.store(self.evict_clock(), Ordering::Relaxed);
    }

    /// The eviction clock as a swapped pte keeps it (`Pte::swapped_at`): 30 bits, never 0.
    /// It wraps after 2^34 evictions (64 TiB evicted).
    pub fn evict_stamp_now(&self) -> u32 {
        (self.evict_clock() & PAGE_STAMP_MASK).max(1)
    }

    /// Pages evicted since eviction stamp `stamp` ([`SwapSpace::evict_stamp_now`]); `None`
    /// for 0 (no stamp).
    pub fn distance_since(&self, stamp: u32) -> Option<u64> {
        if stamp == 0 {
            return None;
        }
        Some(((self.evict_stamp_now().wrapping_sub(stamp) & PAGE_STAMP_MASK) as u64) << EVICT_CLOCK_SHIFT)
    }

    fn evict_clock(&self) -> u32 {
        // Never 0, which means "no stamp".
        ((self.evictions.load(Ordering::Relaxed) >> EVICT_CLOCK_SHIFT) as u32).max(1)
    }

    /// Pages evicted since `slot`'s page was (about: since its cluster first took a page), or
    /// `None` when the cluster carries no stamp. An overestimate for slots reused later,
    /// which errs toward not activating.
    pub fn refault_distance(&self, slot: u64) -> Option<u64> {
        let (cid, _) = split(slot);
        let stamp = self.header(cid).evict_stamp.load(Ordering::Relaxed);
        if stamp == 0 {
            return None;
        }
        Some((self.evict_clock().wrapping_sub(stamp) as u64) << EVICT_CLOCK_SHIFT)
    }

    fn take_cluster(&self, a: &mut Allocator) -> Option<u32> {
        while let Some(cid) = a.nonfull.pop_front() {
            let h = self.header(cid);
            if h.state() == ClusterState::Nonfull && (h.used.load(Ordering::Relaxed) as usize) < SLOTS_PER_CLUSTER {
                h.set_state(ClusterState::Current);
                return Some(cid);
            }
        }
        let cid = if let Some(c) = a.free.pop() {
            c
        } else if a.next_new < self.max_clusters {
            a.next_new += 1;
            a.next_new - 1
        } else {
            return None;
        };
        let h = self.header(cid);
        h.reset();
        h.set_state(ClusterState::Current);
        self.clusters_in_use.fetch_add(1, Ordering::Relaxed);
        Some(cid)
    }

    fn release(&self, cid: u32) {
        let h = self.header(cid);
        let prev = h.used.fetch_sub(1, Ordering::AcqRel) as usize;
        if prev != SLOTS_PER_CLUSTER && prev != 1 {
            return;
        }
        let mut a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        let used = h.used.load(Ordering::Acquire) as usize;
        match h.state() {
            ClusterState::Full if used < SLOTS_PER_CLUSTER => {
                h.set_state(ClusterState::Nonfull);
                if used == 0 {
                    self.free_cluster(&mut a, cid);
                } else {
                    a.nonfull.push_back(cid);
                }
            }
            ClusterState::Nonfull if used == 0 => self.free_cluster(&mut a, cid),
            _ => {}
        }
    }

    fn free_cluster(&self, a: &mut Allocator, cid: u32) {
        let h = self.header(cid);
        h.reset();
        let addr = self.table as usize + cid as usize * SLOTS_PER_CLUSTER * 8;
        // SAFETY: the cluster's table page, all entries free (used == 0 under the allocator
        // lock, and only the allocator hands out slots of a non-current cluster); it reads
        // back as free entries.
        let _ = unsafe { sys::madvise(addr, PAGE_SIZE, libc::MADV_DONTNEED) };
        a.free.push(cid);
        self.clusters_in_use.fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether slots `slot .. slot + n` (not crossing a cluster) are all in memory.
    pub fn range_in_memory(&self, slot: u64, n: usize) -> bool {
        let (cid, off) = split(slot);
        off + n <= SLOTS_PER_CLUSTER && self.header(cid).all_in_memory(off, n)
    }

    /// Takes up to `max` of the coldest clusters off the age list (for writeback). A caller
    /// that leaves work in one puts it back with [`SwapSpace::requeue_cold`].
    pub fn take_coldest(&self, max: usize) -> Vec<u32> {
        let mut a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        while out.len() < max {
            let Some((cid, seq)) = a.lru.pop_front() else {
                break;
            };
            let h = self.header(cid);
            if h.seq.load(Ordering::Relaxed) == seq && h.state() != ClusterState::Free {
                out.push(cid);
            }
        }
        if out.len() < max {
            // Nothing cold left: the current clusters are all there is.
            for c in a.current.iter().flatten() {
                if out.len() < max && !out.contains(c) {
                    out.push(*c);
                }
            }
        }
        out
    }

    /// Puts a cluster back at the young end of the age list.
    pub fn requeue_cold(&self, cid: u32) {
        let mut a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        let h = self.header(cid);
        if matches!(h.state(), ClusterState::Full | ClusterState::Nonfull) {
            a.seq = a.seq.wrapping_add(1);
            let seq = a.seq;
            h.seq.store(seq, Ordering::Relaxed);
            a.lru.push_back((cid, seq));
        }
    }

    /// Slots with tag `t`.
    pub fn count(&self, t: Tag) -> u64 {
        self.by_tag[t.index()].load(Ordering::Relaxed)
    }

    /// Allocated slots, all tags.
    pub fn slots_in_use(&self) -> u64 {
        self.by_tag.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Clusters ever handed out: every cluster id in use is below this.
    pub fn clusters_ever_used(&self) -> u32 {
        self.alloc.lock().unwrap_or_else(|e| e.into_inner()).next_new
    }

    /// Clusters in use.
    pub fn clusters_in_use(&self) -> u64 {
        self.clusters_in_use.load(Ordering::Relaxed)
    }

    /// Bytes of swap table in use (one 4 KiB page per cluster in use).
    pub fn table_bytes(&self) -> u64 {
        self.clusters_in_use() * (SLOTS_PER_CLUSTER * 8) as u64
    }

    /// Bytes of cluster headers touched so far (headers of clusters ever used; the header
    /// array is committed a page at a time as clusters are first used).
    pub fn header_bytes(&self) -> u64 {
        let a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        crate::page::round_up_pages(a.next_new as usize * CLUSTER_HEADER_BYTES) as u64
    }

    /// Allocator bookkeeping on the heap (lists).
    pub fn allocator_bytes(&self) -> u64 {
        let a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        (a.free.capacity() * 4 + a.nonfull.capacity() * 4 + a.lru.capacity() * 8 + a.current.capacity() * 8) as u64
    }

    /// Iterates the slots of cluster `cid` (for writeback and drain).
    pub fn cluster_slots(cid: u32) -> std::ops::Range<u64> {
        let base = cid as u64 * SLOTS_PER_CLUSTER as u64;
        base..base + SLOTS_PER_CLUSTER as u64
    }
}

impl Drop for SwapSpace {
    fn drop(&mut self) {
        // SAFETY: both arrays are ours; nothing refers to them once the space drops.
        unsafe {
            let _ = sys::munmap(self.table as usize, self.table_len_bytes);
            let _ = sys::munmap(self.headers as usize, self.headers_len_bytes);
        }
    }
}

/// `(cluster, offset)` of a slot.
#[inline]
pub fn split(slot: u64) -> (u32, usize) {
    ((slot / SLOTS_PER_CLUSTER as u64) as u32, (slot % SLOTS_PER_CLUSTER as u64) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn place(s: &SwapSpace, slot: u64, e: SwapEntry) {
        let old = s.lock(slot);
        s.unlock(slot, old, e);
    }

    fn free(s: &SwapSpace, slot: u64) {
        let old = s.lock(slot);
        s.unlock(slot, old, SwapEntry::FREE);
    }

    #[test]
    fn consecutive_slots_and_cluster_lifecycle() {
        let s = SwapSpace::new(4 * SLOTS_PER_CLUSTER as u64, 2).unwrap();
        let mut out = Vec::new();
        assert_eq!(s.alloc(0, 16, &mut out).unwrap(), 16);
        assert_eq!(out, (0..16).collect::<Vec<_>>());
        let mut other = Vec::new();
        s.alloc(1, 4, &mut other).unwrap();
        assert_eq!(other[0], SLOTS_PER_CLUSTER as u64, "lane 1 has its own cluster");
        assert_eq!(s.clusters_in_use(), 2);
        for &slot in &out {
            place(&s, slot, SwapEntry::pool(slot, 100));
        }
        assert!(s.range_in_memory(0, 16));
        assert!(!s.range_in_memory(0, 17));
        place(&s, 3, SwapEntry::file(4096, 100));
        assert!(!s.range_in_memory(0, 16));
        assert_eq!(s.count(Tag::Pool), 15);
        assert_eq!(s.count(Tag::File), 1);
        assert_eq!(s.count(Tag::Reserved), 4);
        for &slot in out.iter().chain(&other) {
            free(&s, slot);
        }
        assert_eq!(s.slots_in_use(), 0);
        // Current clusters stay allocated until they fill.
        assert_eq!(s.clusters_in_use(), 2);
    }

    #[test]
    fn full_clusters_age_and_free_when_empty() {
        let s = SwapSpace::new(8 * SLOTS_PER_CLUSTER as u64, 1).unwrap();
        let mut out = Vec::new();
        s.alloc(0, 3 * SLOTS_PER_CLUSTER, &mut out).unwrap();
        assert_eq!(out.len(), 3 * SLOTS_PER_CLUSTER);
        assert_eq!(out.iter().collect::<HashSet<_>>().len(), out.len(), "no slot twice");
        assert_eq!(s.clusters_in_use(), 3);
        assert_eq!(s.header(0).state(), ClusterState::Full);
        // Empty cluster 1 entirely: it is released.
        for slot in SwapSpace::cluster_slots(1) {
            free(&s, slot);
        }
        assert_eq!(s.clusters_in_use(), 2);
        assert_eq!(s.header(1).state(), ClusterState::Free);
        // Coldest first: cluster 0, then 2 (1 is gone).
        assert_eq!(s.take_coldest(2), vec![0, 2]);
        // Half-empty cluster 0 is reused before a fresh one.
        free(&s, 5);
        let mut more = Vec::new();
        s.alloc(0, 1, &mut more).unwrap();
        assert_eq!(more, vec![5]);
        assert_eq!(s.load(5).tag(), Tag::Reserved);
    }

    #[test]
    fn refault_distance_counts_evictions_since_the_cluster_was_filled() {
        let s = SwapSpace::new(4 * SLOTS_PER_CLUSTER as u64, 1).unwrap();
        let mut out = Vec::new();
        s.note_evictions(1000);
        s.alloc(0, 1, &mut out).unwrap();
        assert_eq!(s.refault_distance(out[0]), Some(0));
        s.note_evictions(4096);
        let d = s.refault_distance(out[0]).unwrap();
        assert!((4080..=4112).contains(&d), "distance {d}");
        // Evicted again onto its kept slot: as young as that eviction.
        s.restamp(out[0]);
        assert_eq!(s.refault_distance(out[0]), Some(0));
        s.note_evictions(512);
        let d = s.refault_distance(out[0]).unwrap();
        assert!((496..=528).contains(&d), "distance {d}");
        free(&s, out[0]);
    }

    #[test]
    fn a_page_stamp_measures_evictions_since_and_wraps_with_the_clock() {
        let s = SwapSpace::new(SLOTS_PER_CLUSTER as u64, 1).unwrap();
        assert_eq!(s.distance_since(0), None, "no stamp");
        assert!(s.evict_stamp_now() != 0, "a stamp is never 0");
        // The clock counts 16 evictions a tick.
        s.note_evictions(160);
        let t = s.evict_stamp_now();
        assert_eq!(s.distance_since(t), Some(0));
        s.note_evictions(4096);
        assert_eq!(s.distance_since(t), Some(4096));
        let t2 = s.evict_stamp_now();
        s.note_evictions(64);
        assert_eq!((s.distance_since(t), s.distance_since(t2)), (Some(4160), Some(64)));
        // Across the 30-bit wrap the distance stays right.
        s.note_evictions(((PAGE_STAMP_MASK as u64) << EVICT_CLOCK_SHIFT) - 4096 - 64 - 160 - 160);
        let late = s.evict_stamp_now();
        s.note_evictions(320);
        assert!(s.evict_stamp_now() < late, "the clock wrapped");
        assert_eq!(s.distance_since(late), Some(320));
    }

    #[test]
    fn space_full_is_an_error() {
        let s = SwapSpace::new(SLOTS_PER_CLUSTER as u64, 1).unwrap();
        let mut out = Vec::new();
        assert_eq!(s.alloc(0, SLOTS_PER_CLUSTER + 10, &mut out).unwrap(), SLOTS_PER_CLUSTER);
        assert!(s.alloc(0, 1, &mut out).is_err());
    }

    #[test]
    fn concurrent_alloc_free_never_hands_out_a_slot_twice() {
        let s = std::sync::Arc::new(SwapSpace::new(64 * SLOTS_PER_CLUSTER as u64, 4).unwrap());
        let live = std::sync::Arc::new(Mutex::new(HashSet::new()));
        let threads: Vec<_> = (0..4)
            .map(|lane| {
                let (s, live) = (s.clone(), live.clone());
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    for round in 0..200 {
                        let mut out = Vec::new();
                        s.alloc(lane, 37, &mut out).unwrap();
                        {
                            let mut l = live.lock().unwrap();
                            for &slot in &out {
                                assert!(l.insert(slot), "slot {slot} handed out twice");
                            }
                        }
                        mine.extend(out);
                        if round % 2 == 1 {
                            let drop_n = mine.len() / 2;
                            for slot in mine.drain(..drop_n) {
                                live.lock().unwrap().remove(&slot);
                                free(&s, slot);
                            }
                        }
                    }
                    for slot in mine {
                        live.lock().unwrap().remove(&slot);
                        free(&s, slot);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(s.slots_in_use(), 0);
        assert!(s.clusters_in_use() <= 4, "only current clusters remain, got {}", s.clusters_in_use());
    }
}
