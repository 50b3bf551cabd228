//! The shim's heap: where the program's malloc'd bytes live when they are managed.
//!
//! glibc's malloc makes its large allocations with an internal mmap the shim cannot see,
//! and its small ones on the brk heap, so a managed heap has to be the shim's own:
//! - **small** (below [`SMALL_MAX`], or below the mmap threshold when that is lower):
//!   size classes, each served from 2 MiB spans carved out of 1 GiB managed arenas (one
//!   pager mapping per arena, so the pager sees a handful of regions, not one per object).
//!   A span holds one class; free objects of a class are on one intrusive list (the link
//!   is the object's first word, in managed memory: popping may fault, which is fine,
//!   the pager's threads never take these locks).
//! - **large**: one managed mapping each, the user pointer page-aligned inside it; a side
//!   table (in the shim's .bss, never managed) maps the user pointer to its mapping.
//!
//! "Is this pointer ours?" is cheap: small pointers are inside an arena (a handful of
//! range checks), large pointers are page-aligned (glibc's never are, except memalign'd
//! ones) and then one hash probe.
//!
//! Nothing here allocates: metadata is static, objects are managed memory.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use crate::raw::{self, SpinLock};

/// Bytes of one span: one size class, objects never straddle spans.
const SPAN_BYTES: usize = 2 << 20;
/// Bytes of one arena (one managed mapping).
const ARENA_BYTES: usize = 1 << 30;
const SPANS_PER_ARENA: usize = ARENA_BYTES / SPAN_BYTES;
/// Most arenas: 256 GiB of small objects.
const MAX_ARENAS: usize = 256;
/// Largest small allocation; larger ones get their own mapping (at least 8 per span).
pub const SMALL_MAX: usize = 256 << 10;
const PAGE: usize = 4096;

/// Size classes: 16-byte steps to 128, then four per doubling (160, 192, 224, 256, 320, …)
/// up to [`SMALL_MAX`]. Index 0 is "no class" (a span not handed out yet).
const N_CLASSES: usize = 1 + 8 + 4 * 11;

const fn class_size(idx: usize) -> usize {
    if idx <= 8 {
        return idx * 16;
    }
    let k = idx - 9; // 0-based past 128
    let base = 128usize << (k / 4);
    base + (k % 4 + 1) * (base / 4)
}

/// The class serving `n` bytes (1..=SMALL_MAX).
fn class_of(n: usize) -> usize {
    let n = n.max(1);
    if n <= 128 {
        return n.div_ceil(16);
    }
    // base < n <= 2 * base, base a power of two >= 128.
    let base = 1usize << (usize::BITS - 1 - (n - 1).leading_zeros());
    let step = base / 4;
    let k = (n - base).div_ceil(step); // 1..=4
    9 + (base.trailing_zeros() as usize - 7) * 4 + (k - 1)
}

struct Class {
    /// Head of the free list (0: empty); each free object's first word links the next.
    free: usize,
    /// Next never-used object of the current span, and the span's end.
    bump: usize,
    end: usize,
}

static CLASSES: [SpinLock<Class>; N_CLASSES] = [const { SpinLock::new(Class { free: 0, bump: 0, end: 0 }) }; N_CLASSES];

struct ArenaCursor {
    /// Arena and span the next span comes from.
    arena: usize,
    span: usize,
}

static ARENA_LOCK: SpinLock<ArenaCursor> = SpinLock::new(ArenaCursor { arena: 0, span: SPANS_PER_ARENA });
static ARENA_BASE: [AtomicUsize; MAX_ARENAS] = [const { AtomicUsize::new(0) }; MAX_ARENAS];
static ARENA_COUNT: AtomicUsize = AtomicUsize::new(0);
static SPAN_CLASS: [[AtomicU8; SPANS_PER_ARENA]; MAX_ARENAS] =
    [const { [const { AtomicU8::new(0) }; SPANS_PER_ARENA] }; MAX_ARENAS];

/// A fresh span for class `idx`, as (first byte, end).
fn new_span(idx: usize) -> Option<(usize, usize)> {
    let mut cur = ARENA_LOCK.lock();
    if cur.span == SPANS_PER_ARENA {
        let n = ARENA_COUNT.load(Ordering::Acquire);
        if n == MAX_ARENAS {
            return None;
        }
        let base = crate::map_managed(ARENA_BYTES, 0)?;
        ARENA_BASE[n].store(base, Ordering::Release);
        ARENA_COUNT.store(n + 1, Ordering::Release);
        cur.arena = n;
        cur.span = 0;
    }
    let (a, s) = (cur.arena, cur.span);
    cur.span += 1;
    SPAN_CLASS[a][s].store(idx as u8, Ordering::Release);
    let start = ARENA_BASE[a].load(Ordering::Acquire) + s * SPAN_BYTES;
    let size = class_size(idx);
    Some((start, start + (SPAN_BYTES / size) * size))
}

/// A small object of at least `n` bytes aligned to `align` (a power of two, at most a page),
/// or `None` (no pager, or out of arenas): the caller falls back to glibc.
pub fn alloc_small(n: usize, align: usize) -> Option<*mut u8> {
    // Objects sit at multiples of their size from a page-aligned span start: a power-of-two
    // size at least `align` is aligned.
    let n = if align > 16 { n.max(align).next_power_of_two() } else { n };
    let idx = class_of(n);
    let size = class_size(idx);
    let mut c = CLASSES[idx].lock();
    if c.free != 0 {
        let p = c.free;
        // SAFETY: p is a free object of this class (ours, inside an arena, at least 16
        // bytes): its first word is the free list's link, written by free_small.
        c.free = unsafe { (p as *const usize).read() };
        return Some(p as *mut u8);
    }
    if c.bump + size > c.end {
        let (start, end) = new_span(idx)?;
        c.bump = start;
        c.end = end;
    }
    let p = c.bump;
    c.bump += size;
    Some(p as *mut u8)
}

/// The class of a small pointer of ours, or `None`.
fn small_class(p: usize) -> Option<usize> {
    let n = ARENA_COUNT.load(Ordering::Acquire);
    for a in 0..n {
        let base = ARENA_BASE[a].load(Ordering::Acquire);
        if p.wrapping_sub(base) < ARENA_BYTES {
            let idx = SPAN_CLASS[a][(p - base) / SPAN_BYTES].load(Ordering::Acquire) as usize;
            return (idx != 0).then_some(idx);
        }
    }
    None
}

/// What a pointer is, for free/realloc/malloc_usable_size.
#[derive(Clone, Copy, Debug)]
pub enum Owner {
    /// A small object of ours, of this many usable bytes.
    Small(usize),
    /// A large allocation of ours: usable bytes, and whether its mapping was made for it
    /// (so still the kernel's zeros until the program writes), not reused.
    Large(usize, bool),
    /// glibc's (allocated before the pager, by the pager's threads, or unmanaged).
    Libc,
}

/// Who owns `p` (not null).
pub fn owner(p: *mut u8) -> Owner {
    let p = p as usize;
    if let Some(idx) = small_class(p) {
        return Owner::Small(class_size(idx));
    }
    if p.is_multiple_of(PAGE) && LARGE_LIVE.load(Ordering::Acquire) > 0 {
        let t = LARGE.lock();
        if let Some(i) = t.find(p) {
            let e = t.slots[i];
            return Owner::Large(e.map + e.len - p, e.fresh);
        }
    }
    Owner::Libc
}

/// Returns a small object to its class.
///
/// # Safety
/// `p` is a live small object of ours (see [`owner`]) and is not used afterwards.
pub unsafe fn free_small(p: *mut u8) {
    let Some(idx) = small_class(p as usize) else { return };
    let mut c = CLASSES[idx].lock();
    // SAFETY: p is ours and dead: its first word becomes the free list's link.
    unsafe { (p as *mut usize).write(c.free) };
    c.free = p as usize;
}

/// One large allocation: the user pointer (key), its mapping, whether the mapping was made
/// for it (not reused from [`CACHE`]).
#[derive(Clone, Copy)]
struct LargeEntry {
    key: usize,
    map: usize,
    len: usize,
    fresh: bool,
}

const LARGE_SLOTS: usize = 1 << 16;
const EMPTY: usize = 0;

/// Open addressing with linear probing and backward-shift deletion (no tombstones, so a
/// probe always ends at the first empty slot); keys are page-aligned user pointers.
struct LargeTable {
    slots: [LargeEntry; LARGE_SLOTS],
    /// Live entries, kept at most 3/4 of the slots.
    live: usize,
}

static LARGE: SpinLock<LargeTable> =
    SpinLock::new(LargeTable { slots: [LargeEntry { key: EMPTY, map: 0, len: 0, fresh: true }; LARGE_SLOTS], live: 0 });
static LARGE_LIVE: AtomicUsize = AtomicUsize::new(0);

fn home(key: usize) -> usize {
    ((key >> 12).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) % LARGE_SLOTS
}

impl LargeTable {
    fn find(&self, key: usize) -> Option<usize> {
        let mut i = home(key);
        loop {
            match self.slots[i].key {
                EMPTY => return None,
                k if k == key => return Some(i),
                _ => i = (i + 1) % LARGE_SLOTS,
            }
        }
    }

    fn insert(&mut self, e: LargeEntry) -> bool {
        if self.live + 1 > LARGE_SLOTS * 3 / 4 {
            return false;
        }
        let mut i = home(e.key);
        while self.slots[i].key != EMPTY {
            i = (i + 1) % LARGE_SLOTS;
        }
        self.slots[i] = e;
        self.live += 1;
        true
    }

    /// Removes slot `i`, shifting later members of its probe run back so no probe that
    /// passed through `i` is cut short.
    fn remove(&mut self, mut i: usize) -> LargeEntry {
        let gone = self.slots[i];
        self.live -= 1;
        let mut j = i;
        loop {
            self.slots[i].key = EMPTY;
            loop {
                j = (j + 1) % LARGE_SLOTS;
                if self.slots[j].key == EMPTY {
                    return gone;
                }
                let h = home(self.slots[j].key);
                // The entry at j may fill the hole at i unless its home lies cyclically in (i, j].
                let home_in_between = if i <= j { i < h && h <= j } else { i < h || h <= j };
                if !home_in_between {
                    break;
                }
            }
            self.slots[i] = self.slots[j];
            i = j;
        }
    }
}

/// Large mappings freed lately, kept for the next large allocations that fit them: a
/// program that allocates and frees buffers of a few hundred KiB to a few MiB over and
/// over (Python's JSON encoder and list growth, an array library's temporaries) otherwise
/// paid, for each, an mmap, the pager's registration, a first-touch fault every 64 KiB,
/// an munmap and its unmap event, where glibc reuses its heap. A Python JSON round trip
/// under a budget it fits took 9.0–9.6 s against 7.1–7.3 s with the malloc family left
/// to glibc (6.8 s natively), its time in those calls. Kept: at most [`CACHE_SLOTS`]
/// mappings and [`CACHE_LIMIT`] bytes, a 32nd of the budget up to [`CACHE_BYTES`]: their
/// pages stay resident and count in the footprint, and under a budget they did not fit
/// reclaim wrote them out and the next allocation read the garbage back (a round of 300 KiB
/// to 6 MiB buffers under 6 MiB: 416 k pages read back against 158 k without keeping).
struct LargeCache {
    /// (start, length) of each kept mapping; the first `n` are in use, oldest first.
    maps: [(usize, usize); CACHE_SLOTS],
    n: usize,
    bytes: usize,
}

const CACHE_SLOTS: usize = 8;
const CACHE_BYTES: usize = 32 << 20;
/// Bytes of mappings kept at most (0 until a pager starts: nothing is kept).
static CACHE_LIMIT: AtomicUsize = AtomicUsize::new(0);

/// Keeps freed large mappings up to a 32nd of `budget` bytes, at most [`CACHE_BYTES`].
pub fn set_cache_limit(budget: u64) {
    CACHE_LIMIT.store((budget / 32).min(CACHE_BYTES as u64) as usize, Ordering::Relaxed);
}

/// Guards the kept mappings.
static CACHE: SpinLock<LargeCache> = SpinLock::new(LargeCache { maps: [(0, 0); CACHE_SLOTS], n: 0, bytes: 0 });

impl LargeCache {
    /// The kept mapping that fits `len` bytes best, wasting at most a quarter of it.
    fn take(&mut self, len: usize) -> Option<(usize, usize)> {
        let fits = |l: usize| l >= len && l - len <= l / 4;
        let best = (0..self.n).filter(|&i| fits(self.maps[i].1)).min_by_key(|&i| self.maps[i].1)?;
        let m = self.maps[best];
        self.maps.copy_within(best + 1..self.n, best);
        self.n -= 1;
        self.bytes -= m.1;
        Some(m)
    }

    /// Keeps `m`; returns what must be unmapped instead: `m` itself when it is too large to
    /// keep, else the oldest kept ones that no longer fit beside it. A `limit` of 0 (no room
    /// to keep anything now) hands back every kept mapping with `m`.
    fn put(&mut self, m: (usize, usize), limit: usize, out: &mut [(usize, usize); CACHE_SLOTS + 1]) -> usize {
        if m.1 > limit / 4 {
            let mut k = 0;
            if limit == 0 {
                out[..self.n].copy_from_slice(&self.maps[..self.n]);
                k = self.n;
                (self.n, self.bytes) = (0, 0);
            }
            out[k] = m;
            return k + 1;
        }
        let mut k = 0;
        while self.n == CACHE_SLOTS || self.bytes + m.1 > limit {
            out[k] = self.maps[0];
            k += 1;
            self.bytes -= self.maps[0].1;
            self.maps.copy_within(1..self.n, 0);
            self.n -= 1;
        }
        self.maps[self.n] = m;
        self.n += 1;
        self.bytes += m.1;
        k
    }
}

/// A large allocation of ours: `n` bytes aligned to `align` (a power of two), in a managed
/// mapping of its own, a kept one ([`LargeCache`]) when one fits. `None`: the caller falls
/// back to glibc.
pub fn alloc_large(n: usize, align: usize) -> Option<*mut u8> {
    let align = align.max(PAGE);
    let len = n.checked_add(align - PAGE)?.checked_next_multiple_of(PAGE)?;
    let kept = CACHE.lock().take(len);
    let (map, len, fresh) = match kept {
        Some((map, len)) => (map, len, false),
        None => (crate::map_managed(len, 0)?, len, true),
    };
    let p = (map + align - 1) & !(align - 1);
    let ok = LARGE.lock().insert(LargeEntry { key: p, map, len, fresh });
    if !ok {
        // SAFETY: just mapped or taken from the cache, not handed out.
        unsafe { raw::munmap(map, len) };
        return None;
    }
    LARGE_LIVE.fetch_add(1, Ordering::Release);
    Some(p as *mut u8)
}

/// Forgets a large allocation of ours and keeps its mapping for reuse, or unmaps it (the
/// pager follows the unmap).
///
/// # Safety
/// `p` is a live large allocation of ours and is not used afterwards.
pub unsafe fn free_large(p: *mut u8) {
    let e = {
        let mut t = LARGE.lock();
        let Some(i) = t.find(p as usize) else { return };
        t.remove(i)
    };
    LARGE_LIVE.fetch_sub(1, Ordering::Release);
    let mut out = [(0, 0); CACHE_SLOTS + 1];
    // Kept pages are resident and count in the footprint: they are kept only while the
    // process is well under its budget, and all given back once it is not (under pressure
    // they were the working set's room: python-dict served 0.76–0.88 of its lookups).
    let limit = match CACHE_LIMIT.load(Ordering::Relaxed) {
        0 => 0,
        l if crate::well_under_budget() => l,
        _ => 0,
    };
    let k = CACHE.lock().put((e.map, e.len), limit, &mut out);
    for &(map, len) in &out[..k] {
        // SAFETY: the caller gave the allocation up (or it was kept and nobody took it);
        // the mapping was ours alone.
        unsafe { raw::munmap(map, len) };
    }
}

/// Unmaps every kept mapping (a fork child before its own pager: they are its parent's
/// pager's memory).
fn drop_cache() {
    let mut c = CACHE.lock();
    for &(map, len) in &c.maps[..c.n] {
        // SAFETY: kept mappings are nobody's allocation.
        unsafe { raw::munmap(map, len) };
    }
    (c.n, c.bytes) = (0, 0);
}

/// Grows a large allocation in place or by moving its mapping (mremap): the user pointer
/// must be the mapping's start. Returns the new pointer, or `None` (caller copies).
///
/// # Safety
/// `p` is a live large allocation of ours.
pub unsafe fn remap_large(p: *mut u8, new_n: usize) -> Option<*mut u8> {
    let new_len = new_n.checked_next_multiple_of(PAGE)?;
    let mut t = LARGE.lock();
    let i = t.find(p as usize)?;
    let e = t.slots[i];
    if e.map != p as usize {
        return None;
    }
    // SAFETY: the mapping is this allocation's alone; MAYMOVE lets the kernel move it and
    // the pager follows (userfaultfd REMAP event).
    let r = unsafe { raw::mremap(e.map, e.len, new_len, libc::MREMAP_MAYMOVE, 0) };
    if r < 0 {
        return None;
    }
    let new = r as usize;
    t.remove(i);
    // A slot was just freed (tombstone), so there is room.
    t.insert(LargeEntry { key: new, map: new, len: new_len, fresh: e.fresh });
    Some(new as *mut u8)
}

/// Fork's prepare handler: take every lock so the child gets them all unlocked and
/// consistent (a lock held by another thread at fork would never be released in the child).
pub fn lock_all() {
    ARENA_LOCK.lock_raw();
    for c in CLASSES.iter() {
        c.lock_raw();
    }
    LARGE.lock_raw();
    CACHE.lock_raw();
}

/// A fork child's heap before its own pager starts: every class takes its next object from
/// a fresh span, and the next span from a fresh arena, of the child's own pager. The
/// parent's arenas stay known (freeing an inherited object works), but their free objects
/// and unused spans are left alone: they are the parent's pager's memory, which the
/// child's cannot swap. No thread allocates from the heap meanwhile (nothing is managed
/// until the pager is up); a free may, under its class's lock.
pub fn start_afresh() {
    for c in CLASSES.iter() {
        let mut c = c.lock();
        (c.free, c.bump, c.end) = (0, 0, 0);
    }
    ARENA_LOCK.lock().span = SPANS_PER_ARENA;
    drop_cache();
}

/// Fork's parent and child handlers: release what [`lock_all`] took.
pub fn unlock_all() {
    // SAFETY: lock_all took them in this thread (or, in the child, in the thread that forked,
    // which is this one).
    unsafe {
        CACHE.unlock_raw();
        LARGE.unlock_raw();
        for c in CLASSES.iter().rev() {
            c.unlock_raw();
        }
        ARENA_LOCK.unlock_raw();
    }
}

/// Bytes of managed arenas mapped and of large allocations live, for the exit report.
pub fn usage() -> (usize, usize) {
    (ARENA_COUNT.load(Ordering::Relaxed) * ARENA_BYTES, LARGE_LIVE.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_every_size_once() {
        let mut prev = 0;
        for idx in 1..N_CLASSES {
            let s = class_size(idx);
            assert!(s > prev && s.is_multiple_of(16), "class {idx} size {s}");
            assert_eq!(class_of(s), idx);
            assert_eq!(class_of(prev + 1), idx);
            prev = s;
        }
        assert_eq!(prev, SMALL_MAX);
    }

    /// The side table against a model: random inserts and removes, every live key found
    /// with its mapping, every removed key gone (backward shift keeps probe runs whole).
    #[test]
    fn large_table_matches_a_model() {
        static T: SpinLock<LargeTable> = SpinLock::new(LargeTable {
            slots: [LargeEntry { key: EMPTY, map: 0, len: 0, fresh: true }; LARGE_SLOTS],
            live: 0,
        });
        let mut t = T.lock();
        let mut model: Vec<usize> = Vec::new();
        let mut x: u64 = 0x1234_5678;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if model.len() < 40_000 && (!x.is_multiple_of(3) || model.is_empty()) {
                // Keys crowd a few homes now and then, to make long probe runs.
                let key = if step % 5 == 0 {
                    ((x as usize & 0xff) << 28) | (PAGE * (step as usize % 64 + 1))
                } else {
                    (x as usize & !(PAGE - 1)) | PAGE
                };
                if t.find(key).is_none() {
                    assert!(t.insert(LargeEntry { key, map: key ^ 1, len: step as usize, fresh: true }));
                    model.push(key);
                }
            } else {
                let k = model.swap_remove((x >> 20) as usize % model.len());
                let i = t.find(k).expect("live key found");
                assert_eq!(t.remove(i).key, k);
                assert!(t.find(k).is_none());
            }
        }
        assert_eq!(t.live, model.len());
        for &k in &model {
            let i = t.find(k).expect("live key found at the end");
            assert_eq!(t.slots[i].map, k ^ 1);
        }
    }

    /// The kept mappings against a model: whatever goes in comes out once, either taken by
    /// an allocation it fits (at most a quarter wasted, the best fit) or handed back to be
    /// unmapped; never more than the slots and bytes allowed.
    #[test]
    fn kept_mappings_match_a_model() {
        let mut c = LargeCache { maps: [(0, 0); CACHE_SLOTS], n: 0, bytes: 0 };
        let mut kept: Vec<(usize, usize)> = Vec::new();
        let mut out = [(0, 0); CACHE_SLOTS + 1];
        let mut x: u64 = 0x9E37_79B9;
        for step in 1..50_000usize {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = PAGE * (64 + (x as usize >> 8) % 4096);
            if x.is_multiple_of(2) {
                let m = (step << 32, len);
                // Now and then no room at all: everything kept is handed back.
                let limit = if x.is_multiple_of(97) { 0 } else { CACHE_BYTES };
                let k = c.put(m, limit, &mut out);
                if limit == 0 {
                    assert_eq!(k, kept.len() + 1, "no room: every kept mapping and the new one");
                }
                kept.push(m);
                for gone in &out[..k] {
                    let i = kept.iter().position(|e| e == gone).expect("handed back once");
                    kept.remove(i);
                }
            } else {
                let want = c.take(len);
                let fit = kept.iter().filter(|e| e.1 >= len && e.1 - len <= e.1 / 4).map(|e| e.1).min();
                assert_eq!(want.map(|m| m.1), fit, "best fit for {len}");
                if let Some(m) = want {
                    let i = kept.iter().position(|e| *e == m).expect("taken once");
                    kept.remove(i);
                }
            }
            assert!(c.n <= CACHE_SLOTS && c.bytes <= CACHE_BYTES);
            assert_eq!(c.n, kept.len());
            assert_eq!(c.bytes, kept.iter().map(|e| e.1).sum::<usize>());
        }
    }
}
