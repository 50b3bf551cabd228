//! Forked children whose parent goes first: the parent's pager serves a child's missing
//! pages through the child's userfaultfd, which dies with the parent. Before the parent's
//! pager goes (its `Pager` dropped, or the process calling `exit` with the pager still
//! alive), it hands each child every page the child still needs; the child, reading long
//! after its parent is gone, gets every fork-time byte. Both fault modes, both ways out.
//!
//! Each case runs in a process of its own (a fork shares every page of the process with
//! the child for a moment, and the parent must really exit): the test re-runs this binary
//! with one case named in the environment, and reads the grandchild's verdict from a file.

mod common;

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use common::{counter_word, pager, run_alone, PAGE};
use tierswap::{FaultMode, Hint};

const CASE_ENV: &str = "TIERSWAP_CHILDREN_CASE";
const VERDICT_ENV: &str = "TIERSWAP_CHILDREN_VERDICT";

/// Word i of page p (a page of noise for every fourth page, so the pool and the file both
/// hold some: noise does not compress).
fn word(p: usize, i: usize) -> u64 {
    if p % 4 == 3 {
        let mut x = ((p * 512 + i) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        x ^= x >> 29;
        x.wrapping_mul(0xBF58_476D_1CE4_E5B9)
    } else {
        counter_word(p, i, 77)
    }
}

/// How the parent leaves.
#[derive(Clone, Copy)]
enum Exit {
    /// Drops its pager and region, then returns (the process exits).
    Drop,
    /// Keeps them (as the LD_PRELOAD shim does) and calls `exit`.
    Exit,
}

/// Runs `case` in a process of its own and returns what its child wrote at the end.
fn run_case(case: &str) -> String {
    let verdict = std::env::temp_dir().join(format!("tierswap-children-{}-{case}", std::process::id()));
    let _ = std::fs::remove_file(&verdict);
    let (out, stdout, stderr) = run_alone(case, &[(CASE_ENV, OsStr::new(case)), (VERDICT_ENV, verdict.as_os_str())]);
    assert!(out.status.success(), "the parent process failed: {:?}\n{stdout}\n{stderr}", out.status);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(v) = std::fs::read_to_string(&verdict) {
            if v.ends_with('\n') {
                let _ = std::fs::remove_file(&verdict);
                return v;
            }
        }
        assert!(Instant::now() < deadline, "the child never reported (a hang?)\n{stdout}\n{stderr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The parent: fills 1024 pages (4 MiB) under an 8 MiB budget, sends them all out, reads
/// 64 back clean, forks, and leaves at once. The child waits until its parent is gone,
/// then reads every page, writes each, and reports how many pages were wrong.
fn parent(mode: FaultMode, tiers: &str, exit: Exit) {
    let n = 1024;
    let p = pager(8 << 20, tiers, mode, 1);
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    for pg in 0..n {
        for (i, w) in r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE].chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&word(pg, i).to_le_bytes());
        }
    }
    p.evict_all();
    let mut sum = 0u64;
    for pg in 0..64 {
        sum = sum.wrapping_add(r.as_slice()[pg * PAGE] as u64);
    }
    std::hint::black_box(sum);
    let verdict = std::env::var(VERDICT_ENV).unwrap();
    let parent_pid = std::process::id() as i32;
    let base = r.as_ptr() as usize;
    // SAFETY: the child waits for its parent to go, then reads and writes memory, writes one
    // file and calls _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: getppid has no preconditions.
        while unsafe { libc::getppid() } == parent_pid {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut bad = 0;
        for pg in 0..n {
            // SAFETY: the child's copy of the region, mapped for its whole length.
            let page = unsafe { std::slice::from_raw_parts((base + pg * PAGE) as *const u8, PAGE) };
            if page.chunks_exact(8).enumerate().any(|(i, w)| w != word(pg, i).to_le_bytes()) {
                bad += 1;
            }
            // SAFETY: as above; the child's own page.
            unsafe { std::ptr::write_volatile((base + pg * PAGE) as *mut u64, !word(pg, 0)) };
        }
        let _ = std::fs::write(&verdict, format!("bad pages {bad} of {n}\n"));
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(0) };
    }
    match exit {
        Exit::Drop => {
            drop(r);
            drop(p);
        }
        Exit::Exit => {
            std::mem::forget(r);
            std::mem::forget(p);
            std::process::exit(0);
        }
    }
}

fn case(name: &str, mode: FaultMode, tiers: &str, exit: Exit) {
    if std::env::var(CASE_ENV).as_deref() == Ok(name) {
        return parent(mode, tiers, exit);
    }
    let v = run_case(name);
    assert_eq!(v, "bad pages 0 of 1024\n", "every page the child read after its parent had gone was as at the fork");
}

#[test]
fn a_child_reads_its_pages_after_the_parent_dropped_its_pager() {
    case("a_child_reads_its_pages_after_the_parent_dropped_its_pager", FaultMode::Thread, "zero,pool,file", Exit::Drop);
}

#[test]
fn a_child_reads_its_pages_after_the_parent_called_exit() {
    case("a_child_reads_its_pages_after_the_parent_called_exit", FaultMode::Thread, "zero,pool,file", Exit::Exit);
}

#[test]
fn a_signal_mode_child_reads_its_pages_after_the_parent_dropped_its_pager() {
    case(
        "a_signal_mode_child_reads_its_pages_after_the_parent_dropped_its_pager",
        FaultMode::Signal,
        "zero,pool,file",
        Exit::Drop,
    );
}

#[test]
fn a_signal_mode_child_reads_its_pages_after_the_parent_called_exit() {
    case(
        "a_signal_mode_child_reads_its_pages_after_the_parent_called_exit",
        FaultMode::Signal,
        "zero,pool",
        Exit::Exit,
    );
}

/// The parent of `a_parent_evicts_what_its_living_child_copied`: fills 4096 pages (16 MiB)
/// under an 8 MiB budget and forks a child that writes every page (its own copy of each:
/// the pages the parent had resident at the fork are then mapped by the parent alone, but
/// the kernel keeps them marked shared, and UFFDIO_MOVE refuses them) and then waits. With
/// the child alive, the parent reads all of its memory twice: reclaim must take back the
/// fork-time pages to make room. Writes what it saw, then lets the child check its copy.
fn parent_beside_a_copier() {
    let n = 4096;
    let p = pager(8 << 20, "zero,pool,file", FaultMode::Thread, 1);
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    for pg in 0..n {
        for (i, w) in r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE].chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&word(pg, i).to_le_bytes());
        }
    }
    let verdict = std::env::var(VERDICT_ENV).unwrap();
    let base = r.as_ptr() as usize;
    let (mut wrote, mut done) = ([0i32; 2], [0i32; 2]);
    // SAFETY: arrays of two fds each, as pipe wants.
    assert!(unsafe { libc::pipe(wrote.as_mut_ptr()) == 0 && libc::pipe(done.as_mut_ptr()) == 0 });
    // SAFETY: the child writes its copy of the region, checks it, uses two pipes and calls
    // _exit: no allocation, no lock.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: the ends this process does not use (the read below sees EOF only when
        // every copy of the write end is closed).
        unsafe {
            libc::close(wrote[0]);
            libc::close(done[1]);
        }
        for pg in 0..n {
            // SAFETY: the child's copy of the region, mapped for its whole length.
            unsafe { std::ptr::write_volatile((base + pg * PAGE) as *mut u64, !word(pg, 0)) };
        }
        let mut c = 1u8;
        // SAFETY: one byte to and from the pipes' open ends; c is ours.
        unsafe {
            libc::write(wrote[1], (&raw const c).cast(), 1);
            libc::read(done[0], (&raw mut c).cast(), 1);
        }
        let mut bad = 0;
        for pg in 0..n {
            // SAFETY: as above.
            let page = unsafe { std::slice::from_raw_parts((base + pg * PAGE) as *const u8, PAGE) };
            let want = |i: usize| if i == 0 { !word(pg, 0) } else { word(pg, i) };
            if page.chunks_exact(8).enumerate().any(|(i, w)| w != want(i).to_le_bytes()) {
                bad += 1;
            }
        }
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(if bad == 0 { 0 } else { 1 }) };
    }
    // SAFETY: the child's ends, unused here.
    unsafe {
        libc::close(wrote[1]);
        libc::close(done[0]);
    }
    let mut c = 0u8;
    // SAFETY: one byte from the pipe's read end into c.
    assert_eq!(unsafe { libc::read(wrote[0], (&raw mut c).cast(), 1) }, 1, "the child wrote its copy");
    let before = p.stats().counters.stage_unshared;
    let mut bad = 0;
    for _ in 0..2 {
        for pg in 0..n {
            let page = &r.as_slice()[pg * PAGE..(pg + 1) * PAGE];
            if page.chunks_exact(8).enumerate().any(|(i, w)| w != word(pg, i).to_le_bytes()) {
                bad += 1;
            }
        }
    }
    let unshared = p.stats().counters.stage_unshared - before;
    let footprint_mib = p.footprint_bytes() >> 20;
    // SAFETY: closing our end of the pipe lets the child go on; waitpid on our child.
    let mut st = 0;
    unsafe {
        libc::close(done[1]);
        libc::waitpid(pid, &mut st, 0);
    }
    let child_ok = libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0;
    let _ = std::fs::write(
        &verdict,
        format!(
            "bad pages {bad}, child ok {child_ok}, unshared beside it {}, footprint {footprint_mib} MiB\n",
            unshared > 0
        ),
    );
}

/// A parent whose living child has written its own copy of every page takes back the pages
/// it had resident at the fork: they are this process's alone (the kernel's exclusive mark
/// is gone since the fork, so the move refuses them until a pinned read brings it back).
/// Before, they stayed until the child was gone, and the parent sat over its budget by them.
#[test]
fn a_parent_evicts_what_its_living_child_copied() {
    const NAME: &str = "a_parent_evicts_what_its_living_child_copied";
    if std::env::var(CASE_ENV).as_deref() == Ok(NAME) {
        return parent_beside_a_copier();
    }
    let v = run_case(NAME);
    let mib: u64 = v.trim().rsplit(' ').nth(1).and_then(|m| m.parse().ok()).unwrap_or(u64::MAX);
    assert!(v.starts_with("bad pages 0, child ok true, unshared beside it true,"), "{v}");
    assert!(mib <= 9, "the parent's footprint after its reads, its child alive: {v}");
}
