//! Small anonymous mappings, managed: a private read-write anonymous `mmap` below the
//! minimum size, asked for without an address, is carved out of a managed *zone* a page
//! at a time instead of becoming a kernel mapping the pager never sees.
//!
//! Why: some runtimes map their object heap a small page at a time. Ruby 3.1 maps each
//! 16 KiB heap page with an mmap of 32 KiB and unmaps the misaligned ends; below the
//! minimum size (which keeps the pager's mappings few) a Ruby program building 400,000
//! hashes under a 100 MiB budget kept 34 MiB of its 130 MiB of anonymous memory out of
//! the pager's reach and peaked at 144 MiB resident. A pager mapping per small mmap would
//! make thousands of regions; a zone is one, like the heap's arenas.
//!
//! A zone is one 1 GiB managed mapping; a bitmap (in the shim's .bss, one bit a page, 32
//! KiB a zone, touched only as far as it is used) says which of its pages are handed out.
//! - **mmap** takes the first run of free pages at or after a cursor (next fit: small
//!   mappings made one after another sit side by side, and the kernel merges them into
//!   one VMA), from the zone the cursor is in, then the other zones, then a new zone.
//! - **munmap** of zone pages gives them back: MADV_DONTNEED (the pager frees their slots
//!   through the REMOVE event, and the next mapping there reads zeros) and read-write
//!   again (a program may have changed their protection), then their bits are cleared. The
//!   kernel's munmap would leave a hole in the zone that the kernel could fill with
//!   anything.
//! - **mremap**: shrinking gives the tail back; growing takes the pages after the mapping
//!   when they are free, otherwise (MREMAP_MAYMOVE, or MREMAP_FIXED) makes a new mapping
//!   the way mmap would and copies; MREMAP_DONTUNMAP is refused with EINVAL (the kernel
//!   takes it for private anonymous mappings, but leaving the old range mapped and empty
//!   is the kernel's business, not a zone's).
//! - **mprotect** and **madvise** pass through; a fixed anonymous mapping over zone pages
//!   is done in place (as over any managed memory) and marks them handed out.
//!
//! What a program can tell: its unmapped zone pages read zeros (or a later mapping's
//! bytes) instead of raising SIGSEGV; /proc/self/maps shows the zone, not its mapping.
//! Only thread mode: in signal mode a system call on a swapped-out page fails with EFAULT,
//! and small mappings are often a program's system-call buffers.
//!
//! Fork: zones the parent had are its pager's (served to the child through the fork
//! event). A child hands out pages only from zones of its own pager ([`forked`]);
//! its munmap and mremap of inherited zone pages go to the kernel (a hole in its copy of a
//! zone it never hands out from is harmless), and the parent's server follows them.
//!
//! Locks: [`ZONES`] (a spin lock; fork's prepare handler takes it) guards the bitmaps and
//! the cursor. The zones' bases, their count and the first zone of this process's own are
//! atomics besides, so that every munmap of the program asks "is this a zone's?" without it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::raw::{self, SpinLock};

const PAGE: usize = 4096;
const RW: i32 = libc::PROT_READ | libc::PROT_WRITE;
/// Bytes of one zone (one managed mapping).
const ZONE_BYTES: usize = 1 << 30;
const ZONE_PAGES: usize = ZONE_BYTES / PAGE;
const WORDS: usize = ZONE_PAGES / 64;
/// Most zones: 8 GiB of small mappings; past them, small mappings go to the kernel.
const MAX_ZONES: usize = 8;

/// Whether small mappings are served from zones (thread mode, set at start).
static ENABLED: AtomicBool = AtomicBool::new(false);
static ZONE_BASE: [AtomicUsize; MAX_ZONES] = [const { AtomicUsize::new(0) }; MAX_ZONES];
static ZONE_COUNT: AtomicUsize = AtomicUsize::new(0);
/// Zones below this index are a parent's (this process is a fork child).
static FIRST_OWN: AtomicUsize = AtomicUsize::new(0);

struct Zones {
    /// One bit a page of each zone: handed out.
    used: [[u64; WORDS]; MAX_ZONES],
    /// Where the next search starts: zone index and page in it.
    zone: usize,
    page: usize,
}

static ZONES: SpinLock<Zones> = SpinLock::new(Zones { used: [[0; WORDS]; MAX_ZONES], zone: 0, page: 0 });

/// Serves small mappings from zones from now on (the shim's start, thread mode).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether a small mapping may come from a zone.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// This process's own zones, as (index, base).
fn own_zones() -> impl Iterator<Item = (usize, usize)> {
    let n = ZONE_COUNT.load(Ordering::Acquire);
    (FIRST_OWN.load(Ordering::Relaxed)..n).map(|z| (z, ZONE_BASE[z].load(Ordering::Acquire)))
}

/// The own zone holding `[addr, addr + len)` whole, as (zone index, first page), or None.
fn own_zone_of(addr: usize, len: usize) -> Option<(usize, usize)> {
    own_zones()
        .find(|&(_, base)| addr >= base && addr - base < ZONE_BYTES && len <= ZONE_BYTES - (addr - base))
        .map(|(z, base)| (z, (addr - base) / PAGE))
}

/// Whether `[addr, addr + len)` overlaps an own zone at all.
fn overlaps_own_zone(addr: usize, len: usize) -> bool {
    own_zones().any(|(_, base)| addr < base + ZONE_BYTES && base < addr.saturating_add(len))
}

fn is_set(used: &[u64; WORDS], p: usize) -> bool {
    used[p / 64] >> (p % 64) & 1 == 1
}

fn set_run(used: &mut [u64; WORDS], first: usize, n: usize, on: bool) {
    for p in first..first + n {
        if on {
            used[p / 64] |= 1 << (p % 64);
        } else {
            used[p / 64] &= !(1 << (p % 64));
        }
    }
}

/// The first run of `n` free pages at or after page `from`, whole words of handed-out
/// pages skipped at once.
fn find_run(used: &[u64; WORDS], from: usize, n: usize) -> Option<usize> {
    let (mut p, mut start, mut run) = (from, from, 0);
    while p < ZONE_PAGES {
        let w = used[p / 64];
        if w == u64::MAX {
            p = (p / 64 + 1) * 64;
            run = 0;
            continue;
        }
        let free = if w == 0 && p.is_multiple_of(64) { 64 } else { usize::from(w >> (p % 64) & 1 == 0) };
        if free == 0 {
            run = 0;
            p += 1;
            continue;
        }
        if run == 0 {
            start = p;
        }
        run += free;
        p += free;
        if run >= n {
            return Some(start);
        }
    }
    None
}

/// `n` pages of a zone of this process's pager, handed out, or None (no pager, every zone
/// full, or no more zones): the caller lets the kernel map it.
pub fn map(len: usize) -> Option<usize> {
    let n = len.div_ceil(PAGE);
    let mut z = ZONES.lock();
    let first_own = FIRST_OWN.load(Ordering::Relaxed);
    let count = ZONE_COUNT.load(Ordering::Acquire);
    let (cz, cp) = (z.zone, z.page);
    // The cursor's zone from the cursor, then every own zone from its start.
    let tries = std::iter::once((cz, cp)).chain((first_own..count).map(|k| (k, 0)));
    let mut found = None;
    for (k, from) in tries {
        if k < first_own || k >= count {
            continue;
        }
        if let Some(p) = find_run(&z.used[k], from, n) {
            found = Some((k, p));
            break;
        }
    }
    let (k, p) = match found {
        Some(f) => f,
        None => {
            if count == MAX_ZONES {
                return None;
            }
            let base = crate::map_managed(ZONE_BYTES, 0)?;
            ZONE_BASE[count].store(base, Ordering::Release);
            ZONE_COUNT.store(count + 1, Ordering::Release);
            (count, 0)
        }
    };
    set_run(&mut z.used[k], p, n, true);
    (z.zone, z.page) = (k, p + n);
    Some(ZONE_BASE[k].load(Ordering::Acquire) + p * PAGE)
}

/// Gives `n` pages at `addr` (inside own zone `k`, from its page `p`) back: emptied,
/// read-write, then free.
fn release(k: usize, p: usize, addr: usize, n: usize) {
    // Emptied before the bits clear, so no other thread's new mapping sees old bytes.
    crate::commit_in_place(addr, n * PAGE, RW);
    let mut z = ZONES.lock();
    set_run(&mut z.used[k], p, n, false);
}

/// munmap(2) for ranges overlapping an own zone: Some(result) when handled here, None
/// when the kernel is to do it (no zone in the range, or a range the kernel refuses).
pub fn munmap(addr: usize, len: usize) -> Option<i32> {
    if len == 0 || !addr.is_multiple_of(PAGE) || !overlaps_own_zone(addr, len) {
        return None;
    }
    let end = addr.checked_add(len.div_ceil(PAGE) * PAGE)?;
    // The range in pieces: zone pages are given back, the rest is the kernel's.
    let mut at = addr;
    let mut result = 0;
    while at < end {
        match own_zones().find(|&(_, b)| at >= b && at < b + ZONE_BYTES) {
            Some((k, base)) => {
                let piece = end.min(base + ZONE_BYTES) - at;
                release(k, (at - base) / PAGE, at, piece / PAGE);
                at += piece;
            }
            None => {
                let next = own_zones().map(|(_, b)| b).filter(|&b| b > at).min().unwrap_or(end).min(end);
                // SAFETY: the program unmaps its own range outside every zone.
                let r = unsafe { raw::munmap(at, next - at) };
                if r != 0 {
                    result = r;
                }
                at = next;
            }
        }
    }
    Some(result)
}

/// mremap(2) of a mapping inside an own zone: Some(result, as the raw syscall returns it:
/// the address or -errno), or None when `old` is not a zone's.
pub fn mremap(old: usize, old_len: usize, new_len: usize, flags: i32, new_addr: usize) -> Option<isize> {
    let (k, p) = own_zone_of(old, old_len.max(1))?;
    if !old.is_multiple_of(PAGE) || old_len == 0 || new_len == 0 || flags & libc::MREMAP_DONTUNMAP != 0 {
        return Some(-(libc::EINVAL as isize));
    }
    let (old_n, new_n) = (old_len.div_ceil(PAGE), new_len.div_ceil(PAGE));
    if flags & libc::MREMAP_FIXED == 0 {
        if new_n <= old_n {
            if new_n < old_n {
                release(k, p + new_n, old + new_n * PAGE, old_n - new_n);
            }
            return Some(old as isize);
        }
        let mut z = ZONES.lock();
        let tail = p + old_n..p + new_n;
        if tail.end <= ZONE_PAGES && tail.clone().all(|q| !is_set(&z.used[k], q)) {
            set_run(&mut z.used[k], p + old_n, new_n - old_n, true);
            return Some(old as isize);
        }
        drop(z);
        if flags & libc::MREMAP_MAYMOVE == 0 {
            return Some(-(libc::ENOMEM as isize));
        }
    }
    // Moved: a new mapping, made as the program's mmap would be, the bytes copied over.
    let fixed = flags & libc::MREMAP_FIXED != 0;
    if fixed && new_addr < old + old_n * PAGE && old < new_addr.saturating_add(new_n * PAGE) {
        return Some(-(libc::EINVAL as isize));
    }
    let to = new_mapping(new_addr, new_n * PAGE, fixed);
    if to < 0 {
        return Some(to);
    }
    // SAFETY: both ranges are the program's, read-write (zone pages are handed out
    // read-write; a program that made them otherwise and moves them gets SIGSEGV here, as
    // its own copy would), and do not overlap (the new one was free).
    unsafe { std::ptr::copy_nonoverlapping(old as *const u8, to as *mut u8, old_n.min(new_n) * PAGE) };
    release(k, p, old, old_n);
    Some(to)
}

/// A new read-write anonymous mapping of `len` bytes, made the way the program's mmap
/// would make it (a zone's pages, a managed mapping, or the kernel's; at `addr` when
/// `fixed`), as the raw syscall returns it.
fn new_mapping(addr: usize, len: usize, fixed: bool) -> isize {
    const ANON: i32 = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    if fixed {
        if addr.is_multiple_of(PAGE) && crate::inside_one_mapping(addr, len) && crate::commit_in_place(addr, len, RW) {
            note_fixed(addr, len);
            return addr as isize;
        }
        // SAFETY: the program asked for a mapping at `addr` (MREMAP_FIXED replaces what is there).
        return unsafe { raw::mmap(addr, len, RW, ANON | libc::MAP_FIXED, -1, 0) };
    }
    let managed = if len < crate::MIN_SIZE.load(Ordering::Relaxed) { map(len) } else { crate::map_managed(len, 0) };
    match managed {
        Some(p) => p as isize,
        // SAFETY: a fresh mapping where the kernel likes.
        None => unsafe { raw::mmap(0, len, RW, ANON, -1, 0) },
    }
}

/// A fixed mapping was made in place over `[addr, addr + len)`: zone pages there are the
/// program's now.
pub fn note_fixed(addr: usize, len: usize) {
    if let Some((k, p)) = own_zone_of(addr, len) {
        let mut z = ZONES.lock();
        set_run(&mut z.used[k], p, len.div_ceil(PAGE), true);
    }
}

/// Fork's prepare handler: the child gets the lock unlocked and the bitmaps consistent.
pub fn lock() {
    ZONES.lock_raw();
}

/// Fork's parent and child handlers: release what [`lock`] took.
pub fn unlock() {
    // SAFETY: `lock` took it in this thread (in the child, in the thread that forked).
    unsafe { ZONES.unlock_raw() };
}

/// Fork's child handler: the zones so far are the parent's pager's; the child's pages come
/// from new zones of its own pager, once it has one.
pub fn forked() {
    let mut z = ZONES.lock();
    let n = ZONE_COUNT.load(Ordering::Acquire);
    FIRST_OWN.store(n, Ordering::Relaxed);
    (z.zone, z.page) = (n, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `find_run` against a page-by-page search, over bitmaps with runs of every length
    /// across word boundaries.
    #[test]
    fn find_run_finds_the_first_free_run() {
        let mut used = Box::new([0u64; WORDS]);
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        // The first 4096 pages in random runs of handed-out and free pages.
        let mut p = 0;
        while p < 4096 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let len = (rng % 90) as usize + 1;
            if rng & 1 << 40 != 0 {
                set_run(&mut used, p, len.min(4096 - p), true);
            }
            p += len;
        }
        let slow = |from: usize, n: usize| (from..=ZONE_PAGES - n).find(|&s| (s..s + n).all(|q| !is_set(&used, q)));
        for from in [0, 1, 63, 64, 65, 1000, 4000] {
            for n in [1, 2, 7, 31, 64, 65, 100] {
                assert_eq!(find_run(&used, from, n), slow(from, n), "from {from}, {n} pages");
            }
        }
        set_run(&mut used, 0, ZONE_PAGES, true);
        assert_eq!(find_run(&used, 0, 1), None);
        set_run(&mut used, ZONE_PAGES - 3, 3, false);
        assert_eq!(find_run(&used, 5, 3), Some(ZONE_PAGES - 3));
        assert_eq!(find_run(&used, 5, 4), None);
    }
}
