//! An address the program gives up (munmap, mremap) is free in the kernel before the pager
//! has read the event that says so: the kernel queues UNMAP / REMAP only after it let go of
//! the range, and the program's call returns once a fault thread reads the event. Another
//! thread's mmap can get the same address meanwhile. A managed mapping made there must not
//! be taken for the old one: the old event would cut it from the map (and an mremap's pages
//! would follow the new, empty region instead of the moved one).
//!
//! To hold the event unread, the only fault thread is stalled (fault injection) on another
//! fault while the program moves or unmaps, then maps again. Own test binary: the injection
//! plan is process-wide.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tierswap::inject::{self, Kind, Spec};
use tierswap::{Hint, Pager, PagerConfig};

const PAGE: usize = 4096;
const PAGES: usize = 64;
const STALL: Duration = Duration::from_millis(400);

/// One test at a time: they share the injection plan.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn pager() -> Pager {
    let config = PagerConfig { budget_bytes: 64 << 20, fault_threads: 1, keep_clean: false, ..Default::default() };
    Pager::new(config)
        .unwrap_or_else(|e| panic!("cannot start a pager (this test needs userfaultfd: run as root): {e}"))
}

fn word(base: usize, p: usize, i: usize) -> u64 {
    // SAFETY: word i of page p of a live mapping of this test.
    unsafe { std::ptr::read_volatile((base + p * PAGE + i * 8) as *const u64) }
}

fn fill(base: usize, salt: u64) {
    for p in 0..PAGES {
        for i in 0..PAGE / 8 {
            // SAFETY: as in `word`.
            unsafe { std::ptr::write_volatile((base + p * PAGE + i * 8) as *mut u64, salt + (p * 512 + i) as u64) };
        }
    }
}

/// Every word of every page is what `fill(_, salt)` wrote.
fn check(base: usize, salt: u64, what: &str) {
    for p in 0..PAGES {
        for i in 0..PAGE / 8 {
            let (got, want) = (word(base, p, i), salt + (p * 512 + i) as u64);
            assert_eq!(got, want, "{what}: page {p} word {i} is {got:#x}, want {want:#x}");
        }
    }
}

/// An unmanaged, inaccessible mapping of `len` bytes where the kernel puts it.
fn reserve(len: usize) -> usize {
    // SAFETY: a fresh anonymous mapping at an address the kernel picks.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(at, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
    at as usize
}

fn is_mapped(addr: usize) -> bool {
    let mut v = 0u8;
    // SAFETY: mincore only reads page tables and writes one byte.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, PAGE, &mut v) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOMEM)
}

fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(10), "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Returns once the events read so far are handled: a new mapping enters the map under the
/// event lock, which a fault thread holds from reading events to having handled them. (A
/// munmap or mremap returns once its events are read, not handled.)
fn sync_events(p: &Pager) {
    let page = p.map_detached(PAGE, Hint::Normal).unwrap();
    // SAFETY: the page just mapped, unused.
    assert_eq!(unsafe { libc::munmap(page as *mut libc::c_void, PAGE) }, 0);
}

/// Swaps out `busy` (one page), then touches it from another thread with the only fault
/// thread stalled for [`STALL`] on that fault: until the stall ends, nothing reads the
/// userfaultfd. Returns the toucher, which checks the page it read. The stall rule stays
/// in force (every fault stalls) until [`inject::clear`].
fn stall_the_fault_thread(p: &Pager, busy: usize) -> std::thread::JoinHandle<()> {
    // SAFETY: the first word of the test's own one-page mapping.
    unsafe { std::ptr::write_volatile(busy as *mut u64, 0x5eed) };
    assert!(p.evict_all() > 0);
    inject::install(&Spec::new().delay(Kind::FaultStall, STALL, 1, 1)).expect("tests build with fault injection");
    let toucher = std::thread::spawn(move || {
        // SAFETY: as above; the read faults and waits for the stalled fault thread.
        let v = unsafe { std::ptr::read_volatile(busy as *const u64) };
        assert_eq!(v, 0x5eed, "the stalled fault's page");
    });
    wait_until("the fault thread stalls", || inject::report().kinds.iter().any(|k| k.injected == 1));
    toucher
}

/// A pager, a one-page mapping for [`stall_the_fault_thread`], and a mapping of [`PAGES`]
/// pages filled with `salt` and swapped out: only the pager's page table knows its bytes
/// (the kernel moves present pages itself).
fn swapped_out_mapping(salt: u64) -> (Pager, usize, usize) {
    let p = pager();
    let busy = p.map_detached(PAGE, Hint::Normal).unwrap() as usize;
    let old = p.map_detached(PAGES * PAGE, Hint::Normal).unwrap() as usize;
    fill(old, salt);
    assert!(p.evict_all() >= PAGES);
    (p, busy, old)
}

/// Once the kernel has let go of `old` (its event still unread: the fault thread stalls),
/// stops stalling and maps memory again, where the kernel puts it: at `old`.
fn map_again_where(p: &Pager, old: usize) -> usize {
    wait_until("the old range is gone", || !is_mapped(old));
    inject::clear();
    let again = p.map_detached(PAGES * PAGE, Hint::Normal).unwrap() as usize;
    assert_eq!(again, old, "the kernel hands the freed address out again (the case under test)");
    again
}

#[test]
fn a_mapping_made_where_an_mremap_left_does_not_take_the_moved_pages() {
    let _g = serial();
    let (p, busy, old) = swapped_out_mapping(7);
    // The move's destination, replaced by mremap.
    let to = reserve(PAGES * PAGE);

    let toucher = stall_the_fault_thread(&p, busy);
    let moved = Arc::new(AtomicUsize::new(0));
    let mover = {
        let moved = moved.clone();
        std::thread::spawn(move || {
            // SAFETY: the test's own managed mapping, moved whole onto the reservation.
            let r = unsafe {
                libc::mremap(
                    old as *mut libc::c_void,
                    PAGES * PAGE,
                    PAGES * PAGE,
                    libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                    to as *mut libc::c_void,
                )
            };
            assert_eq!(r as usize, to, "mremap: {}", std::io::Error::last_os_error());
            moved.store(1, Ordering::SeqCst);
        })
    };
    wait_until("the old range is gone", || !is_mapped(old));
    assert_eq!(moved.load(Ordering::SeqCst), 0, "mremap returned before its REMAP was read");
    let again = map_again_where(&p, old);
    mover.join().unwrap();
    toucher.join().unwrap();
    sync_events(&p);

    check(to, 7, "the moved mapping");
    assert_eq!(p.mapping_of(again), Some((again, PAGES * PAGE)), "the new mapping is in the map");
    assert_eq!(p.mapping_of(to), Some((to, PAGES * PAGE)));
    for p in 0..PAGES {
        for i in 0..PAGE / 8 {
            assert_eq!(word(again, p, i), 0, "the new mapping starts empty (page {p} word {i})");
        }
    }
    // The new mapping is managed: its pages go out and come back.
    fill(again, 99);
    assert!(p.evict_all() >= PAGES);
    check(again, 99, "the new mapping after eviction");
    check(to, 7, "the moved mapping after a second eviction");
    let s = p.stats();
    // The kernel follows the REMAP with an UNMAP of the old range, which must leave the new
    // mapping there alone (`RemappedFrom`); the other UNMAP is `sync_events`'.
    assert_eq!((s.counters.event_remap, s.counters.event_unmap), (1, 2));
    assert!(s.counters.stale_extent_waits > 0, "the new mapping waited for the REMAP: {s:?}");
}

#[test]
fn a_mapping_made_where_a_munmap_left_stays_managed_and_the_old_slots_are_freed() {
    let _g = serial();
    let (p, busy, old) = swapped_out_mapping(3);
    assert_eq!(p.stats().swap_slots, PAGES as u64);

    let toucher = stall_the_fault_thread(&p, busy);
    let unmapper = std::thread::spawn(move || {
        // SAFETY: the test's own managed mapping, given up whole.
        let r = unsafe { libc::munmap(old as *mut libc::c_void, PAGES * PAGE) };
        assert_eq!(r, 0, "munmap: {}", std::io::Error::last_os_error());
    });
    let again = map_again_where(&p, old);
    unmapper.join().unwrap();
    toucher.join().unwrap();
    sync_events(&p);

    assert_eq!(p.mapping_of(again), Some((again, PAGES * PAGE)), "the new mapping is in the map");
    fill(again, 11);
    assert!(p.evict_all() >= PAGES, "and it is managed: its pages go out");
    let s = p.stats();
    assert_eq!(s.counters.event_unmap, 2, "the test's munmap and sync_events'");
    assert!(s.counters.stale_extent_waits > 0, "the new mapping waited for the UNMAP: {s:?}");
    // The old mapping's slots went with its UNMAP: what is left is the new mapping's and
    // the stalled page's (evicted again).
    assert_eq!(s.swap_slots, PAGES as u64 + 1, "{s:?}");
    check(again, 11, "the new mapping after eviction");
}
