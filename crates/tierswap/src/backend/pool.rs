//! The compressed pool: objects packed by size class into spans (zsmalloc's idea).
//!
//! Objects are 1..=4096 bytes (4096: a raw page kept when no file tier exists). A size class
//! holds objects of one rounded size (multiples of 16 bytes); a span is 1 to 8 contiguous
//! pages holding objects of one class back to back, objects may straddle the span's page
//! boundaries. Each class picks the span length that wastes least at its tail, so the
//! rounding and tail waste stay near 1 % for compressed pages.
//!
//! The pool stores no length per object: the caller keeps it (in the swap entry) and passes
//! it back. Free objects hold the index of the next free object in their first two bytes;
//! spans keep a 16-byte header in a side array. Spans and headers live in address space
//! reserved at creation: a span is committed when first written and released with
//! MADV_DONTNEED when its last object is freed, so a stale read never faults on unmapped
//! memory. The pool itself takes no memory from the program's allocator after creation.
//!
//! Owns: spans, size classes, handles. Calls: `crate::sys` only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::page::PAGE_SIZE;
use crate::sys;

/// Bits of a [`PoolHandle`] (it shares the swap entry's location with a 12-bit length and
/// the codec bit).
pub const POOL_HANDLE_BITS: u32 = 38;
const OBJ_BITS: u32 = 10;
const SPAN_BITS: u32 = POOL_HANDLE_BITS - OBJ_BITS;
/// Size class granularity.
const CLASS_STEP: usize = 16;
const N_CLASSES: usize = PAGE_SIZE / CLASS_STEP;
/// Partial spans of a class `Pool::relocate` looks at for one fuller than the source.
const RELOCATE_LOOK: usize = 16;
/// Longest span, in pages.
const MAX_SPAN_PAGES: usize = 8;
const SPAN_STRIDE: usize = MAX_SPAN_PAGES * PAGE_SIZE;
const NONE: u32 = u32::MAX;
const NO_OBJ: u16 = u16::MAX;

/// Where a pool object is.
///
/// ```text
///  37                              10 9            0
/// +----------------------------------+--------------+
/// |           span id (28)           | object (10)  |
/// +----------------------------------+--------------+
/// ```
/// A span is at `arena + span_id * 32 KiB`; the object at `object * class size` in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolHandle(u64);

impl PoolHandle {
    /// A handle for object `obj` of span `span`.
    pub const fn new(span: u32, obj: u16) -> PoolHandle {
        PoolHandle(((span as u64) << OBJ_BITS) | (obj as u64 & ((1 << OBJ_BITS) - 1)))
    }

    /// The span id.
    pub const fn span(self) -> u32 {
        (self.0 >> OBJ_BITS) as u32
    }

    /// The object index in the span.
    pub const fn obj(self) -> u16 {
        (self.0 & ((1 << OBJ_BITS) - 1)) as u16
    }

    /// The raw word (< 2^38).
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// From a raw word, if it fits 38 bits.
    pub const fn from_raw(raw: u64) -> Option<PoolHandle> {
        if raw >> POOL_HANDLE_BITS == 0 {
            Some(PoolHandle(raw))
        } else {
            None
        }
    }
}

/// The pool cannot take an object.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// Every span of the reserved arena is in use.
    #[error("the compressed pool's arena is full ({arena_bytes} bytes)")]
    Full {
        /// The arena's size.
        arena_bytes: usize,
    },
    /// Length outside 1..=4096.
    #[error("pool objects are 1 to 4096 bytes, not {0}")]
    BadLength(usize),
}

/// Per-class figures, for reports.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ClassStat {
    /// Object size of the class.
    pub class_bytes: usize,
    /// Pages per span.
    pub span_pages: usize,
    /// Spans in use.
    pub spans: u64,
    /// Objects stored.
    pub objects: u64,
    /// Bytes of spans not holding a live object (free slots and tails).
    pub unused_bytes: u64,
}

/// A span's header.
#[repr(C)]
#[derive(Clone, Copy)]
struct SpanHeader {
    class: u16,
    inuse: u16,
    free_head: u16,
    /// Objects never handed out start here.
    bump: u16,
    prev: u32,
    next: u32,
}

const SPAN_HEADER_BYTES: usize = std::mem::size_of::<SpanHeader>();

#[derive(Clone, Copy)]
struct ClassShape {
    size: usize,
    span_pages: usize,
    per_span: usize,
}

struct Class {
    /// Spans with a free object: a list through the headers.
    partial: u32,
    spans: u64,
    objects: u64,
}

struct Spans {
    free: Vec<u32>,
    next_new: u32,
}

/// The compressed pool.
pub struct Pool {
    arena: usize,
    arena_bytes: usize,
    headers: *mut SpanHeader,
    headers_bytes: usize,
    max_spans: u32,
    shapes: [ClassShape; N_CLASSES],
    classes: Vec<Mutex<Class>>,
    spans: Mutex<Spans>,
    total_bytes: AtomicU64,
    stored_bytes: AtomicU64,
    stored_objects: AtomicU64,
}

// SAFETY: the arena and headers are memory the pool owns; headers are touched only under
// the owning class's lock (or the span lock while a span is free), object bytes only by the
// holder of the object's handle.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

fn shape_of(class: usize) -> ClassShape {
    let size = (class + 1) * CLASS_STEP;
    // The span length whose tail wastes the smallest fraction; ties go to the shorter span.
    let mut best = (usize::MAX, 1usize);
    for pages in 1..=MAX_SPAN_PAGES {
        let bytes = pages * PAGE_SIZE;
        let per = (bytes / size).min(1 << OBJ_BITS);
        let waste = bytes - per * size;
        // waste / bytes compared exactly: waste * best_bytes < best_waste * bytes
        if best.0 == usize::MAX || waste * (best.1 * PAGE_SIZE) < best.0 * bytes {
            best = (waste, pages);
        }
    }
    let span_pages = best.1;
    ClassShape { size, span_pages, per_span: (span_pages * PAGE_SIZE / size).min(1 << OBJ_BITS) }
}

impl Pool {
    /// Reserves a pool able to hold `max_bytes` of spans.
    pub fn new(max_bytes: usize) -> std::io::Result<Pool> {
        let max_spans = (max_bytes.div_ceil(SPAN_STRIDE)).clamp(1, 1 << SPAN_BITS) as u32;
        let arena_bytes = max_spans as usize * SPAN_STRIDE;
        let arena = sys::mmap_metadata(arena_bytes)?;
        let headers_bytes = crate::page::round_up_pages(max_spans as usize * SPAN_HEADER_BYTES);
        let headers = match sys::mmap_metadata(headers_bytes) {
            Ok(h) => h,
            Err(e) => {
                // SAFETY: just mapped, unused.
                let _ = unsafe { sys::munmap(arena, arena_bytes) };
                return Err(e);
            }
        };
        let mut shapes = [ClassShape { size: 0, span_pages: 0, per_span: 0 }; N_CLASSES];
        for (c, s) in shapes.iter_mut().enumerate() {
            *s = shape_of(c);
        }
        Ok(Pool {
            arena,
            arena_bytes,
            headers: headers as *mut SpanHeader,
            headers_bytes,
            max_spans,
            shapes,
            classes: (0..N_CLASSES).map(|_| Mutex::new(Class { partial: NONE, spans: 0, objects: 0 })).collect(),
            spans: Mutex::new(Spans { free: Vec::new(), next_new: 0 }),
            total_bytes: AtomicU64::new(0),
            stored_bytes: AtomicU64::new(0),
            stored_objects: AtomicU64::new(0),
        })
    }

    #[inline]
    fn class_of(len: usize) -> usize {
        (len.max(1) - 1) / CLASS_STEP
    }

    /// # Safety
    /// The caller holds the lock of the class owning span `id` (or owns a free span).
    #[allow(clippy::mut_from_ref)]
    unsafe fn header(&self, id: u32) -> &mut SpanHeader {
        debug_assert!(id < self.max_spans);
        // SAFETY: id < max_spans, within the reserved header array; exclusive access is the
        // caller's promise.
        unsafe { &mut *self.headers.add(id as usize) }
    }

    #[inline]
    fn obj_addr(&self, h: PoolHandle, size: usize) -> usize {
        self.arena + h.span() as usize * SPAN_STRIDE + h.obj() as usize * size
    }

    /// Stores `data` (1..=4096 bytes); returns its handle.
    pub fn store(&self, data: &[u8]) -> Result<PoolHandle, PoolError> {
        let len = data.len();
        if len == 0 || len > PAGE_SIZE {
            return Err(PoolError::BadLength(len));
        }
        if crate::inject::hit(crate::inject::Kind::PoolAlloc) {
            return Err(PoolError::Full { arena_bytes: self.arena_bytes });
        }
        let c = Self::class_of(len);
        let shape = self.shapes[c];
        let mut class = self.classes[c].lock().unwrap_or_else(|e| e.into_inner());
        if class.partial == NONE {
            let id = self.new_span()?;
            // SAFETY: a fresh span nobody else knows yet; we hold the class lock it joins.
            let hd = unsafe { self.header(id) };
            *hd = SpanHeader { class: c as u16, inuse: 0, free_head: NO_OBJ, bump: 0, prev: NONE, next: NONE };
            class.partial = id;
            class.spans += 1;
            self.total_bytes.fetch_add((shape.span_pages * PAGE_SIZE) as u64, Ordering::Relaxed);
        }
        let id = class.partial;
        let h = self.take_object(&mut class, id, shape);
        drop(class);
        // SAFETY: the object is ours alone (just allocated), `len` ≤ its class size, inside
        // the reserved arena.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.obj_addr(h, shape.size) as *mut u8, len) };
        self.stored_bytes.fetch_add(len as u64, Ordering::Relaxed);
        self.stored_objects.fetch_add(1, Ordering::Relaxed);
        Ok(h)
    }

    /// Takes a free object of span `id`, on the partial list of `class` (whose lock the
    /// caller holds); a span it fills leaves the list.
    fn take_object(&self, class: &mut Class, id: u32, shape: ClassShape) -> PoolHandle {
        // SAFETY: span `id` is on this class's partial list and the caller holds the lock.
        let hd = unsafe { self.header(id) };
        let obj = if hd.free_head != NO_OBJ {
            let o = hd.free_head;
            let addr = self.obj_addr(PoolHandle::new(id, o), shape.size);
            // SAFETY: a free object of this span: its first two bytes hold the next free index.
            hd.free_head = unsafe { std::ptr::read_unaligned(addr as *const u16) };
            o
        } else {
            let o = hd.bump;
            hd.bump += 1;
            o
        };
        hd.inuse += 1;
        if hd.inuse as usize == shape.per_span {
            self.unlink(class, id);
            // SAFETY: as above; off every list now.
            let hd = unsafe { self.header(id) };
            hd.next = NONE;
            hd.prev = NONE;
        }
        class.objects += 1;
        PoolHandle::new(id, obj)
    }

    /// Compaction: copies object `h` of `len` bytes into a span of its class that holds
    /// more objects than its own (among the first [`RELOCATE_LOOK`] of the class's partial
    /// spans), so that sparse spans empty and go back to the kernel. Returns the new
    /// handle, or None when `h`'s span is no longer at most half in use or no fuller span
    /// has room. The caller holds what keeps `h` alive (its swap entry's lock), points the
    /// entry at the new handle, then frees `h`.
    pub fn relocate(&self, h: PoolHandle, len: usize) -> Option<PoolHandle> {
        if len == 0 || len > PAGE_SIZE {
            return None;
        }
        let c = Self::class_of(len);
        let shape = self.shapes[c];
        let mut class = self.classes[c].lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `h` is a live object of class `c` (the caller holds its entry), so its span
        // belongs to this class, whose lock we hold.
        let src = unsafe { self.header(h.span()) }.inuse;
        if (src as usize) * 2 > shape.per_span {
            return None;
        }
        let mut id = class.partial;
        let mut target = None;
        for _ in 0..RELOCATE_LOOK {
            if id == NONE {
                break;
            }
            // SAFETY: on this class's list; lock held.
            let hd = unsafe { self.header(id) };
            if id != h.span() && hd.inuse > src {
                target = Some(id);
                break;
            }
            id = hd.next;
        }
        let new = self.take_object(&mut class, target?, shape);
        drop(class);
        // SAFETY: `new` is ours alone (just taken); `h` stays allocated while the caller
        // holds its entry; both are `len` ≤ the class size, inside the arena, and distinct.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.obj_addr(h, shape.size) as *const u8,
                self.obj_addr(new, shape.size) as *mut u8,
                len,
            )
        };
        self.stored_bytes.fetch_add(len as u64, Ordering::Relaxed);
        self.stored_objects.fetch_add(1, Ordering::Relaxed);
        Some(new)
    }

    fn new_span(&self) -> Result<u32, PoolError> {
        let mut s = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(id) = s.free.pop() {
            return Ok(id);
        }
        if s.next_new < self.max_spans {
            s.next_new += 1;
            return Ok(s.next_new - 1);
        }
        Err(PoolError::Full { arena_bytes: self.arena_bytes })
    }

    /// Copies an object's `len` bytes into `out[..len]`.
    pub fn read(&self, h: PoolHandle, len: usize, out: &mut [u8]) {
        // SAFETY: the caller holds the handle of a live object, so it stays allocated for
        // this call.
        out[..len].copy_from_slice(unsafe { self.object(h, len) });
    }

    /// The object's bytes.
    ///
    /// # Safety
    /// `h` must be a live object of `len` bytes, and stay allocated while the slice is used.
    pub unsafe fn object(&self, h: PoolHandle, len: usize) -> &[u8] {
        let size = self.shapes[Self::class_of(len)].size;
        // SAFETY: a live object of this class lies within its span in the arena.
        unsafe { std::slice::from_raw_parts(self.obj_addr(h, size) as *const u8, len) }
    }

    /// Frees an object of `len` bytes.
    pub fn free(&self, h: PoolHandle, len: usize) {
        let c = Self::class_of(len);
        let shape = self.shapes[c];
        let id = h.span();
        let mut class = self.classes[c].lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: span `id` holds a live object of class `c`, so it belongs to this class,
        // whose lock we hold.
        let hd = unsafe { self.header(id) };
        debug_assert_eq!(hd.class as usize, c, "object freed with the wrong length");
        let was_full = hd.inuse as usize == shape.per_span;
        // SAFETY: the object is being freed by its only holder; it becomes a free-list link.
        unsafe { std::ptr::write_unaligned(self.obj_addr(h, shape.size) as *mut u16, hd.free_head) };
        hd.free_head = h.obj();
        hd.inuse -= 1;
        class.objects -= 1;
        self.stored_bytes.fetch_sub(len as u64, Ordering::Relaxed);
        self.stored_objects.fetch_sub(1, Ordering::Relaxed);
        if hd.inuse == 0 {
            if !was_full {
                self.unlink(&mut class, id);
            }
            class.spans -= 1;
            drop(class);
            self.release_span(id, shape.span_pages);
        } else if was_full {
            // Back on the partial list, at the head so it fills before emptier spans.
            hd.prev = NONE;
            hd.next = class.partial;
            if class.partial != NONE {
                // SAFETY: on this class's list; lock held.
                unsafe { self.header(class.partial) }.prev = id;
            }
            class.partial = id;
        }
    }

    fn unlink(&self, class: &mut Class, id: u32) {
        // SAFETY: span `id` and its neighbours are on this class's list; the lock is held.
        let (prev, next) = unsafe {
            let hd = self.header(id);
            (hd.prev, hd.next)
        };
        if prev != NONE {
            // SAFETY: as above.
            unsafe { self.header(prev) }.next = next;
        } else {
            class.partial = next;
        }
        if next != NONE {
            // SAFETY: as above.
            unsafe { self.header(next) }.prev = prev;
        }
    }

    fn release_span(&self, id: u32, span_pages: usize) {
        let addr = self.arena + id as usize * SPAN_STRIDE;
        // SAFETY: the span holds no live object; its memory goes back to the kernel and reads
        // as zeros if anyone looks.
        let _ = unsafe { sys::madvise(addr, span_pages * PAGE_SIZE, libc::MADV_DONTNEED) };
        self.total_bytes.fetch_sub((span_pages * PAGE_SIZE) as u64, Ordering::Relaxed);
        self.spans.lock().unwrap_or_else(|e| e.into_inner()).free.push(id);
    }

    /// Bytes of spans in use (what counts against the budget).
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes.load(Ordering::Relaxed)
    }

    /// Sum of live object lengths.
    pub fn stored_bytes(&self) -> u64 {
        self.stored_bytes.load(Ordering::Relaxed)
    }

    /// Live objects.
    pub fn stored_objects(&self) -> u64 {
        self.stored_objects.load(Ordering::Relaxed)
    }

    /// Bookkeeping bytes: span headers of spans ever used, class table, free span list.
    pub fn metadata_bytes(&self) -> u64 {
        let s = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        (crate::page::round_up_pages(s.next_new as usize * SPAN_HEADER_BYTES)
            + N_CLASSES * (std::mem::size_of::<Mutex<Class>>() + std::mem::size_of::<ClassShape>())
            + s.free.capacity() * 4) as u64
    }

    /// Per-class figures for classes in use.
    pub fn class_stats(&self) -> Vec<ClassStat> {
        (0..N_CLASSES)
            .filter_map(|c| {
                let class = self.classes[c].lock().unwrap_or_else(|e| e.into_inner());
                (class.spans > 0).then(|| {
                    let sh = self.shapes[c];
                    let span_bytes = class.spans * (sh.span_pages * PAGE_SIZE) as u64;
                    ClassStat {
                        class_bytes: sh.size,
                        span_pages: sh.span_pages,
                        spans: class.spans,
                        objects: class.objects,
                        unused_bytes: span_bytes - class.objects * sh.size as u64,
                    }
                })
            })
            .collect()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: our reservations; no handle outlives the pool.
        unsafe {
            let _ = sys::munmap(self.arena, self.arena_bytes);
            let _ = sys::munmap(self.headers as usize, self.headers_bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        #[test]
        fn handle_round_trip(span in 0u32..(1 << SPAN_BITS), obj in 0u16..(1 << OBJ_BITS)) {
            let h = PoolHandle::new(span, obj);
            prop_assert_eq!((h.span(), h.obj()), (span, obj));
            prop_assert!(h.raw() < (1 << POOL_HANDLE_BITS));
            prop_assert_eq!(PoolHandle::from_raw(h.raw()), Some(h));
        }

        #[test]
        fn model(ops in proptest::collection::vec((any::<bool>(), 1usize..=4096, any::<u8>()), 1..400)) {
            let pool = Pool::new(64 << 20).unwrap();
            let mut live: Vec<(PoolHandle, Vec<u8>)> = Vec::new();
            for (i, (store, len, byte)) in ops.into_iter().enumerate() {
                if store || live.is_empty() {
                    let data: Vec<u8> = (0..len).map(|k| byte.wrapping_add(k as u8)).collect();
                    let h = pool.store(&data).unwrap();
                    prop_assert!(live.iter().all(|(x, _)| *x != h), "handle handed out twice");
                    live.push((h, data));
                } else {
                    let (h, data) = live.swap_remove(i % live.len());
                    let mut out = vec![0u8; data.len()];
                    pool.read(h, data.len(), &mut out);
                    prop_assert_eq!(&out, &data);
                    pool.free(h, data.len());
                }
                prop_assert_eq!(pool.stored_objects(), live.len() as u64);
            }
            for (h, data) in live.drain(..) {
                // SAFETY: live handle.
                prop_assert_eq!(unsafe { pool.object(h, data.len()) }, &data[..]);
                pool.free(h, data.len());
            }
            prop_assert_eq!(pool.total_bytes(), 0);
            prop_assert_eq!(pool.stored_bytes(), 0);
        }
    }

    #[test]
    fn threads_store_read_free() {
        let pool = std::sync::Arc::new(Pool::new(256 << 20).unwrap());
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    let mut mine: HashMap<u64, (PoolHandle, Vec<u8>)> = HashMap::new();
                    let mut x = 0x1234_5678u64 + t as u64;
                    for i in 0..20_000u64 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        if !x.is_multiple_of(3) || mine.is_empty() {
                            let len = 1 + (x as usize >> 8) % 3000;
                            let data: Vec<u8> = (0..len).map(|k| (k as u8) ^ t ^ (i as u8)).collect();
                            let h = pool.store(&data).unwrap();
                            mine.insert(i, (h, data));
                        } else {
                            let key = *mine.keys().next().unwrap();
                            let (h, data) = mine.remove(&key).unwrap();
                            let mut out = vec![0u8; data.len()];
                            pool.read(h, data.len(), &mut out);
                            assert_eq!(out, data);
                            pool.free(h, data.len());
                        }
                    }
                    for (_, (h, data)) in mine {
                        let mut out = vec![0u8; data.len()];
                        pool.read(h, data.len(), &mut out);
                        assert_eq!(out, data);
                        pool.free(h, data.len());
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(pool.total_bytes(), 0);
        assert_eq!(pool.stored_objects(), 0);
    }

    #[test]
    fn packing_is_tight() {
        let pool = Pool::new(512 << 20).unwrap();
        let mut hs = Vec::new();
        let mut x = 7u64;
        for _ in 0..100_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let len = 1000 + (x >> 33) as usize % 1600;
            hs.push((pool.store(&vec![1u8; len]).unwrap(), len));
        }
        let ratio = pool.total_bytes() as f64 / pool.stored_bytes() as f64;
        assert!(ratio < 1.03, "spans / stored = {ratio}");
        let stats = pool.class_stats();
        assert_eq!(stats.iter().map(|c| c.objects).sum::<u64>(), 100_000);
        for (h, len) in hs.drain(..) {
            pool.free(h, len);
        }
        assert_eq!(pool.total_bytes(), 0);
    }

    #[test]
    fn arena_full_is_an_error_not_a_crash() {
        let pool = Pool::new(SPAN_STRIDE).unwrap();
        let page = vec![9u8; PAGE_SIZE];
        let mut n = 0;
        while pool.store(&page).is_ok() {
            n += 1;
            assert!(n < 100);
        }
        assert!(n >= 1);
        assert!(matches!(pool.store(&[]), Err(PoolError::BadLength(0))));
    }

    #[test]
    fn relocation_empties_sparse_spans_and_keeps_every_byte() {
        let pool = Pool::new(512 << 20).unwrap();
        let mut x = 11u64;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            x >> 33
        };
        // 20,000 objects of several classes, each with bytes of its own; then two in three
        // freed at random, which leaves most spans partly empty.
        let mut live: Vec<(PoolHandle, Vec<u8>)> = (0..20_000)
            .map(|i| {
                let len = 700 + (next() as usize % 1400);
                let data: Vec<u8> = (0..len).map(|k| (i * 31 + k * 7) as u8).collect();
                (pool.store(&data).unwrap(), data)
            })
            .collect();
        live.retain(|(h, d)| {
            let keep = next() % 3 == 0;
            if !keep {
                pool.free(*h, d.len());
            }
            keep
        });
        let (total_before, stored) = (pool.total_bytes(), pool.stored_bytes());
        assert!(total_before as f64 > stored as f64 * 1.5, "fragmented: {total_before} for {stored}");
        let mut moved = 0;
        for _ in 0..4 {
            for (h, d) in live.iter_mut() {
                if let Some(new) = pool.relocate(*h, d.len()) {
                    assert_ne!(new.span(), h.span());
                    pool.free(*h, d.len());
                    *h = new;
                    moved += 1;
                }
            }
        }
        assert!(moved > 0);
        assert_eq!(pool.stored_bytes(), stored, "a move stores as much as it frees");
        assert_eq!(pool.stored_objects(), live.len() as u64);
        for (h, d) in &live {
            // SAFETY: a live object of this length.
            assert_eq!(unsafe { pool.object(*h, d.len()) }, &d[..], "bytes kept through moves");
        }
        let total_after = pool.total_bytes();
        assert!(
            (total_after as f64) < stored as f64 * 1.4 && total_after < total_before / 2,
            "spans {total_before} -> {total_after} for {stored} stored"
        );
        for (h, d) in live.drain(..) {
            pool.free(h, d.len());
        }
        assert_eq!(pool.total_bytes(), 0, "every span went back");
    }
}
