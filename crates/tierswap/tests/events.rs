//! The program's own madvise / munmap / mremap on managed memory (userfaultfd REMOVE,
//! UNMAP, REMAP events), through raw libc calls on `map_detached` and `Region` memory.
//! Every byte read back is checked; counters are checked against what the test did.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{config, fill_page, noise_matches, noise_page, page_matches, serial, start, PAGE};
use tierswap::{FaultMode, Hint, Pager, PagerConfig};

// Every test takes `serial()`: the tests share the machine's two CPUs; one at a time keeps
// each test's timing sane. Their pagers keep no slot for a page read back (clean tracking
// off) unless a test says otherwise, so slot counts are exact: one per swapped page.

/// Page `p`'s content for `salt`: counters ([`fill_page`]), or (every 8th + 3) noise that
/// goes to the file tier, or (every 8th + 1) zeros.
fn fill_mixed_page(page: &mut [u8], p: usize, salt: u64) {
    match p % 8 {
        1 => page.fill(0),
        3 => noise_page(page, p as u64 ^ salt),
        _ => fill_page(page, p, salt),
    }
}

/// Whether `page` holds [`fill_mixed_page`]'s content, without allocating (safe in a forked
/// child of a threaded process).
fn mixed_page_ok(page: &[u8], p: usize, salt: u64) -> bool {
    match p % 8 {
        1 => page.iter().all(|&b| b == 0),
        3 => noise_matches(page, p as u64 ^ salt),
        _ => page_matches(page, p, salt),
    }
}

fn expect_mixed_page(page: &[u8], p: usize, salt: u64) {
    let mut want = vec![0u8; PAGE];
    fill_mixed_page(&mut want, p, salt);
    if page != &want[..] {
        let word = |b: &[u8], i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        let bad = (0..PAGE / 8).filter(|&i| word(page, i) != word(&want, i)).count();
        panic!(
            "page {p} (salt {salt}) came back wrong: {bad} words differ; first word {:#x}, want {:#x}",
            word(page, 0),
            word(&want, 0)
        );
    }
}

/// The bytes at `base + p * PAGE`.
fn page_at<'a>(base: usize, p: usize) -> &'a mut [u8] {
    // SAFETY: callers pass pages of a live mapping of theirs, one slice at a time.
    unsafe { std::slice::from_raw_parts_mut((base + p * PAGE) as *mut u8, PAGE) }
}

fn fill(base: usize, pages: std::ops::Range<usize>, salt: u64) {
    for p in pages {
        fill_mixed_page(page_at(base, p), p, salt);
    }
}

fn check(base: usize, pages: std::ops::Range<usize>, salt: u64) {
    for p in pages {
        expect_mixed_page(page_at(base, p), p, salt);
    }
}

fn check_zero(base: usize, pages: std::ops::Range<usize>) {
    for p in pages {
        assert!(page_at(base, p).iter().all(|&b| b == 0), "page {p} should read zeros after the discard");
    }
}

fn madvise(base: usize, pages: std::ops::Range<usize>, advice: i32) {
    // SAFETY: a range of the test's own mapping; its contents are given up on purpose.
    let r = unsafe { libc::madvise((base + pages.start * PAGE) as *mut libc::c_void, pages.len() * PAGE, advice) };
    assert_eq!(r, 0, "madvise: {}", std::io::Error::last_os_error());
}

fn munmap(base: usize, pages: std::ops::Range<usize>) {
    // SAFETY: a range of the test's own mapping, no longer used.
    let r = unsafe { libc::munmap((base + pages.start * PAGE) as *mut libc::c_void, pages.len() * PAGE) };
    assert_eq!(r, 0, "munmap: {}", std::io::Error::last_os_error());
}

/// Swapped pages of every tier, then `[0, 16)` present and `[16, 32)` staged (Random hint:
/// order-0 swap-in; fault-around brings a staged 64 KiB block back whole).
fn three_states(p: &Pager, base: usize, n: usize, salt: u64) {
    fill(base, 0..n, salt);
    assert!(p.evict_all() >= n);
    check(base, 0..32, salt);
    p.stage_all();
    check(base, 0..1, salt);
}

#[test]
fn dontneed_on_region_memory_reads_zeros_in_every_state_and_frees_slots() {
    let _g = serial();
    let p = start(PagerConfig { keep_clean: false, ..config(1 << 30, "zero,pool,file", FaultMode::Thread, 2) });
    let n = 256;
    let r = p.region(n * PAGE, Hint::Random).unwrap();
    let base = r.as_ptr() as usize;
    three_states(&p, base, n, 5);
    assert_eq!(r.page_states(), (16, 16, n - 32));
    let before = p.stats();
    assert_eq!(before.swap_slots, (n - 32) as u64);
    assert!(before.pool_stored_pages > 0 && before.file_pages > 0 && before.swap_zero_pages > 0);
    // Pages 8..16 present, 16..32 staged, 32..40 swapped.
    madvise(base, 8..40, libc::MADV_DONTNEED);
    assert_eq!(r.page_states(), (8, 0, n - 40));
    let after = p.stats();
    assert_eq!(after.swap_slots, before.swap_slots - 8);
    assert_eq!(after.present_pages, 8);
    assert_eq!(after.staged_pages, 0);
    assert_eq!(after.counters.event_remove, 1);
    check_zero(base, 8..40);
    check(base, 0..8, 5);
    check(base, 40..n, 5);
    // Everything at once, every tier emptied.
    madvise(base, 0..n, libc::MADV_DONTNEED);
    let st = p.stats();
    assert_eq!((st.swap_slots, st.present_pages, st.staged_pages), (0, 0, 0));
    assert_eq!((st.pool_stored_pages, st.file_pages, st.swap_zero_pages, st.swap_samefill_pages), (0, 0, 0, 0));
    check_zero(base, 0..n);
    // And the memory works as before.
    fill(base, 0..n, 9);
    p.evict_all();
    check(base, 0..n, 9);
}

#[test]
fn dontneed_on_detached_memory_frees_kept_slots_of_clean_pages_too() {
    let _g = serial();
    let p = start(PagerConfig { keep_clean: true, ..config(1 << 30, "zero,pool", FaultMode::Thread, 2) });
    let n = 512;
    let base = p.map_detached(n * PAGE, Hint::Random).unwrap() as usize;
    assert_eq!(p.mapping_of(base + 5 * PAGE), Some((base, n * PAGE)));
    three_states(&p, base, n, 11);
    let before = p.stats();
    madvise(base, 100..300, libc::MADV_DONTNEED);
    assert_eq!(p.stats().swap_slots, before.swap_slots - 200);
    check_zero(base, 100..300);
    check(base, 0..100, 11);
    check(base, 300..n, 11);
    // Pages refilled after the discard are managed like any other.
    fill(base, 100..300, 12);
    p.evict_all();
    check(base, 100..300, 12);
    munmap(base, 0..n);
    let st = p.stats();
    assert_eq!((st.swap_slots, st.present_pages, st.staged_pages), (0, 0, 0));
    assert_eq!(st.counters.event_unmap, 1);
    assert_eq!(p.mapping_of(base), None);
}

#[test]
fn munmap_head_tail_middle_and_whole_frees_everything() {
    let _g = serial();
    let p = start(PagerConfig { keep_clean: false, ..config(1 << 30, "zero,pool,file", FaultMode::Thread, 2) });
    let n = 256;
    let base = p.map_detached(n * PAGE, Hint::Random).unwrap() as usize;
    three_states(&p, base, n, 3);
    let s0 = p.stats();
    // Middle: swapped pages only.
    munmap(base, 100..120);
    assert_eq!(p.stats().swap_slots, s0.swap_slots - 20);
    assert_eq!(p.mapping_of(base + 110 * PAGE), None);
    assert_eq!(p.mapping_of(base + 99 * PAGE), Some((base, n * PAGE)));
    // The hang report's view of the hole: the event, the cut, the region still on both sides.
    let trail = p.trail_near(base + 110 * PAGE);
    let (hole, end) = (base + 100 * PAGE, base + 120 * PAGE);
    for want in [
        format!("entered at {base:#x}..{:#x}", base + n * PAGE),
        format!("UNMAP read {hole:#x}..{end:#x}"),
        format!("cut at {hole:#x}..{end:#x}"),
        format!("holds {base:#x}..{hole:#x}"),
        format!("holds {end:#x}..{:#x}", base + n * PAGE),
        "no mapping holds it".to_string(),
    ] {
        assert!(trail.contains(&want), "'{want}' not in:\n{trail}");
    }
    // Head: 10 present pages. Tail: swapped.
    munmap(base, 0..10);
    assert_eq!(p.stats().present_pages, s0.present_pages - 10);
    munmap(base, 246..n);
    assert_eq!(p.stats().swap_slots, s0.swap_slots - 30);
    check(base, 10..100, 3);
    check(base, 120..246, 3);
    // Pages of what is left still swap out and back.
    p.evict_all();
    check(base, 10..100, 3);
    check(base, 120..246, 3);
    let before_meta = p.metadata().pte_bytes;
    assert!(before_meta > 0);
    munmap(base, 10..100);
    munmap(base, 120..246);
    let st = p.stats();
    assert_eq!((st.swap_slots, st.present_pages, st.staged_pages), (0, 0, 0));
    assert_eq!((st.pool_stored_pages, st.file_pages), (0, 0));
    assert_eq!(p.metadata().pte_bytes, 0, "the torn-down mapping's page table is gone");
    assert_eq!(st.counters.event_unmap, 5);
}

fn mremap(old: usize, old_pages: usize, new_pages: usize, flags: i32, to: usize) -> usize {
    // SAFETY: the test's own mapping, moved or resized as mremap allows.
    let r = unsafe {
        libc::mremap(old as *mut libc::c_void, old_pages * PAGE, new_pages * PAGE, flags, to as *mut libc::c_void)
    };
    assert_ne!(r, libc::MAP_FAILED, "mremap: {}", std::io::Error::last_os_error());
    r as usize
}

#[test]
fn mremap_move_grow_and_shrink_carry_every_page() {
    let _g = serial();
    let p = start(PagerConfig { keep_clean: false, ..config(1 << 30, "zero,pool,file", FaultMode::Thread, 2) });
    let n = 256;
    let base = p.map_detached(n * PAGE, Hint::Random).unwrap() as usize;
    three_states(&p, base, n, 21);
    let s0 = p.stats();
    // Move to a fixed place (an unmanaged reservation it replaces).
    // SAFETY: a fresh reservation of our own.
    let dst = unsafe {
        libc::mmap(std::ptr::null_mut(), n * PAGE, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    } as usize;
    let moved = mremap(base, n, n, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, dst);
    assert_eq!(moved, dst);
    assert_eq!(p.mapping_of(base), None);
    assert_eq!(p.mapping_of(dst), Some((dst, n * PAGE)));
    let s1 = p.stats();
    assert_eq!((s1.swap_slots, s1.present_pages, s1.staged_pages), (s0.swap_slots, s0.present_pages, s0.staged_pages));
    assert!(s1.counters.event_remap >= 1);
    check(dst, 0..n, 21);
    // Evict at the new place and read back again.
    p.evict_all();
    check(dst, 0..n, 21);
    // Grow (moves if it must): the old part follows, the new part reads zeros.
    p.evict_all();
    let grown = mremap(dst, n, 2 * n, libc::MREMAP_MAYMOVE, 0);
    check(grown, 0..n, 21);
    check_zero(grown, n..2 * n);
    fill(grown, n..2 * n, 22);
    check(grown, n..2 * n, 22);
    // The tail is unmanaged (zero pages) until the shim hands it over. A fault thread counts
    // its fault after waking the program, so the last one may still be on its way.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while p.stats().counters.faults_unmanaged < n as u64 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(p.stats().counters.faults_unmanaged, n as u64);
    assert!(p.adopt_grown(grown + n * PAGE, n * PAGE).is_ok());
    assert!(p.adopt_grown(grown + n * PAGE, n * PAGE).is_err(), "adopted twice");
    // Pages faulted in before the handover are present but unknown to the pager: discard
    // them so that the tail is managed page by page from here.
    madvise(grown, n..2 * n, libc::MADV_DONTNEED);
    fill(grown, n..2 * n, 23);
    p.evict_all();
    assert_eq!(p.stats().swap_slots, 2 * n as u64, "the tail swaps out too");
    check(grown, n..2 * n, 23);
    // Shrink in place: the tail's slots go.
    p.evict_all();
    let before = p.stats().swap_slots;
    let shrunk = mremap(grown, 2 * n, n / 2, 0, 0);
    assert_eq!(shrunk, grown);
    let after = p.stats().swap_slots;
    assert!(after < before && after <= (n / 2) as u64, "slots {before} -> {after}");
    check(shrunk, 0..n / 2, 21);
    munmap(shrunk, 0..n / 2);
    let st = p.stats();
    assert_eq!((st.swap_slots, st.present_pages, st.staged_pages), (0, 0, 0));
}

#[test]
fn discards_and_unmaps_race_reclaim_and_faults_without_losing_a_byte() {
    let _g = serial();
    // A 4 MiB budget over 4 threads x 2 MiB: reclaim runs all the time.
    let p = Arc::new(start(PagerConfig { keep_clean: false, ..config(4 << 20, "zero,pool", FaultMode::Thread, 2) }));
    let n = 512;
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for t in 0..4u64 {
        let p = p.clone();
        let stop = stop.clone();
        handles.push(std::thread::spawn(move || {
            let mut x = 0x1234_5678u64 + t;
            let mut rnd = move |m: usize| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % m as u64) as usize
            };
            let mut base = p.map_detached(n * PAGE, Hint::Normal).unwrap() as usize;
            let mut salt = t * 1000;
            fill(base, 0..n, salt);
            for round in 0..40u64 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                // Discard a random range, check it reads zeros, refill it with a new salt
                // (pages outside keep the old one: track per page).
                let a = rnd(n);
                let b = (a + 1 + rnd(n - a)).min(n);
                madvise(base, a..b, libc::MADV_DONTNEED);
                check_zero(base, a..b);
                check(base, 0..a, salt);
                check(base, b..n, salt);
                fill(base, a..b, salt);
                match round % 4 {
                    1 => {
                        // Unmap a piece and map a fresh mapping in its place.
                        munmap(base, 0..n);
                        base = p.map_detached(n * PAGE, Hint::Normal).unwrap() as usize;
                        salt += 1;
                        fill(base, 0..n, salt);
                    }
                    3 => {
                        let moved = mremap(base, n, n, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, {
                            // SAFETY: a fresh reservation of our own, replaced by the move.
                            unsafe {
                                libc::mmap(
                                    std::ptr::null_mut(),
                                    n * PAGE,
                                    libc::PROT_NONE,
                                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                                    -1,
                                    0,
                                ) as usize
                            }
                        });
                        base = moved;
                        check(base, 0..n, salt);
                    }
                    _ => check(base, 0..n, salt),
                }
            }
            munmap(base, 0..n);
        }));
    }
    for h in handles {
        if let Err(e) = h.join() {
            stop.store(true, Ordering::Relaxed);
            std::panic::resume_unwind(e);
        }
    }
    let st = p.stats();
    assert_eq!((st.swap_slots, st.present_pages, st.staged_pages), (0, 0, 0), "{st:?}");
    assert!(st.counters.pgsteal > 0, "reclaim ran");
}

fn pipe() -> (i32, i32) {
    let mut fds = [0i32; 2];
    // SAFETY: pipe(2) writes two fds into our array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    (fds[0], fds[1])
}

fn read_byte(fd: i32) -> u8 {
    let mut b = 0u8;
    // SAFETY: reading one byte into a local.
    let n = unsafe { libc::read(fd, &mut b as *mut u8 as *mut libc::c_void, 1) };
    assert_eq!(n, 1, "the child died without answering");
    b
}

fn write_byte(fd: i32, b: u8) {
    // SAFETY: writing one byte from a local.
    unsafe { libc::write(fd, &b as *const u8 as *const libc::c_void, 1) };
}

/// Forks; the child checks every page of the mappings in `maps` (base, pages, salt)
/// against its fork-time content while the parent runs `parent`, and answers 1 if all
/// matched. Returns the child's answer.
fn fork_and_check(maps: &[(usize, usize, u64)], parent: impl FnOnce()) -> u8 {
    let (go_r, go_w) = pipe();
    let (ans_r, ans_w) = pipe();
    // SAFETY: the child only reads memory, and writes to a pipe and _exits: no locks, no
    // allocation.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        write_byte(go_w, 1);
        let mut ok = 1u8;
        for &(base, n, salt) in maps {
            for p in 0..n {
                if !mixed_page_ok(page_at(base, p), p, salt) {
                    ok = 0;
                }
            }
        }
        write_byte(ans_w, ok);
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    assert_eq!(read_byte(go_r), 1);
    parent();
    let ans = read_byte(ans_r);
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
    for fd in [go_r, go_w, ans_r, ans_w] {
        // SAFETY: our own fds.
        unsafe { libc::close(fd) };
    }
    ans
}

/// Waits (on the pager's own counters, up to 10 s) until `cond` holds.
fn await_stats(p: &Pager, what: &str, cond: impl Fn(&tierswap::Stats) -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let st = p.stats();
        if cond(&st) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {st:?}");
        std::thread::yield_now();
    }
}

#[test]
fn forked_child_sees_fork_time_memory_while_the_parent_rewrites_and_frees_it() {
    let _g = serial();
    let p = start(PagerConfig { keep_clean: false, ..config(1 << 30, "zero,pool,file", FaultMode::Thread, 2) });
    let n = 512;
    let base = p.map_detached(n * PAGE, Hint::Random).unwrap() as usize;
    three_states(&p, base, n, 31);
    let r = p.region(n * PAGE, Hint::Normal).unwrap();
    let rbase = r.as_ptr() as usize;
    fill(rbase, 0..n, 32);
    p.evict_all();
    check(base, 0..16, 31);
    let slots_before = p.stats().swap_slots;
    for round in 0..3u64 {
        let ans = fork_and_check(&[(base, n, 31 + 10 * round), (rbase, n, 32 + 10 * round)], || {
            // The parent rewrites everything, discards some, evicts, while the child reads.
            fill(base, 0..n, 41 + 10 * round);
            madvise(rbase, 100..200, libc::MADV_DONTNEED);
            p.evict_all();
            check(base, 0..n, 41 + 10 * round);
            check_zero(rbase, 100..200);
            fill(rbase, 0..n, 42 + 10 * round);
            p.evict_all();
        });
        assert_eq!(ans, 1, "round {round}: the child saw memory that was not the parent's at fork");
        check(base, 0..n, 41 + 10 * round);
        check(rbase, 0..n, 42 + 10 * round);
        p.evict_all();
        // The child is gone: only the parent's own pages hold slots, one per swapped page
        // (clean tracking is off: no kept slots).
        await_stats(&p, "the child's slots are released", |st| {
            st.swap_slots == 2 * n as u64 - st.present_pages - st.staged_pages
        });
    }
    let st = p.stats();
    assert_eq!(st.counters.event_fork, 3);
    assert!(st.counters.child_faults > 0);
    assert!(slots_before > 0);
    drop(r);
    munmap(base, 0..n);
    await_stats(&p, "everything freed", |st| st.swap_slots == 0 && st.present_pages == 0 && st.staged_pages == 0);
}

#[test]
fn fork_exec_stays_cheap_with_much_swapped() {
    let _g = serial();
    let p = start(PagerConfig { keep_clean: false, ..config(1 << 30, "zero,pool", FaultMode::Thread, 2) });
    let n = 32768; // 128 MiB swapped
    let base = p.map_detached(n * PAGE, Hint::Sequential).unwrap() as usize;
    fill(base, 0..n, 51);
    p.evict_all();
    let swapped = p.stats().swap_slots;
    assert_eq!(swapped, n as u64);
    let prog = c"/bin/true";
    let argv = [prog.as_ptr(), std::ptr::null()];
    let t0 = std::time::Instant::now();
    // SAFETY: the child only calls execv and _exit (async-signal-safe).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: a valid NUL-terminated path and argv.
        unsafe {
            libc::execv(prog.as_ptr(), argv.as_ptr());
            libc::_exit(127);
        }
    }
    assert!(pid > 0);
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    let took = t0.elapsed();
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status:#x}");
    assert_eq!(p.stats().counters.event_fork, 1, "a real fork, not a vfork");
    eprintln!("fork+exec+wait of /bin/true with {n} swapped pages: {took:?}");
    await_stats(&p, "the exec'd child's references are dropped", |st| st.swap_slots == n as u64);
    assert_eq!(p.stats().counters.child_faults, 0, "an exec'd child touches none of our pages");
    assert!(took < std::time::Duration::from_secs(2), "fork+exec took {took:?}");
    munmap(base, 0..n);
}
