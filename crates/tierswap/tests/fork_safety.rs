//! A program's fork never hangs on the pager (forkgate.rs). glibc's fork() holds malloc's
//! locks while the kernel waits for a fault thread to read the fork message; a fault thread
//! in malloc then would hang the process. Each scenario runs in a process of its own with a
//! deadline: a hang fails the test (the child is killed) instead of hanging the suite.
//! Every forked child checks bytes of managed memory against the fork-time content.

mod common;

use std::io::Read;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{pager, rerun_command, PAGE};
use tierswap::{FaultMode, Hint};

/// Allocations (and frees) made by pager threads in sections that must not allocate
/// (`tierswap::inject::in_no_alloc_section`): while a fork holds malloc's locks, one of
/// them hangs the program.
static FORBIDDEN_ALLOCS: AtomicU64 = AtomicU64::new(0);

/// The system allocator, counting what no-alloc sections do.
struct Counting;

fn count_forbidden() {
    if tierswap::inject::in_no_alloc_section() {
        FORBIDDEN_ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call goes to the system allocator with the caller's arguments.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count_forbidden();
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        count_forbidden();
        // SAFETY: ptr came from System.alloc with this layout.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        count_forbidden();
        // SAFETY: ptr came from System.alloc with this layout.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Word 0 of page `p` for `salt` (the rest of the page is zero).
fn word(p: usize, salt: u64) -> u64 {
    (p as u64) << 20 | salt
}

/// Writes word 0 of each of the first `n` pages of `mem` for `salt`.
fn write_words(mem: &mut [u8], n: usize, salt: u64) {
    for pg in 0..n {
        mem[pg * PAGE..pg * PAGE + 8].copy_from_slice(&word(pg, salt).to_le_bytes());
    }
}

/// Signal mode does not serve a forked child: a swapped page ends it with SIGBUS, never
/// with wrong bytes (tests/signal_mode.rs). Whether `e` is that outcome.
fn signal_mode_child_sigbus(mode: FaultMode, e: &str) -> bool {
    mode == FaultMode::Signal && e == format!("the child was killed by signal {}", libc::SIGBUS)
}

/// Forks; the child reads word 0 of page `page` at `base` and exits 0 if it is `want` (1 if
/// not). Without allocating: safe in the child of a threaded process. Returns the child's
/// exit status, or a message if it ended otherwise.
fn fork_and_read(base: usize, page: usize, want: u64) -> Result<(), String> {
    // SAFETY: the child only reads memory and calls _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: reading a mapped page of the region (served through the fork event).
        let w = unsafe { std::ptr::read_volatile((base + page * PAGE) as *const u64) };
        // SAFETY: _exit ends the child at once.
        unsafe { libc::_exit(if w == want { 0 } else { 1 }) }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    if libc::WIFSIGNALED(status) {
        return Err(format!("the child was killed by signal {}", libc::WTERMSIG(status)));
    }
    match libc::WEXITSTATUS(status) {
        0 => Ok(()),
        1 => Err(format!("the child read a wrong word at page {page}")),
        other => Err(format!("the child exited with {other}")),
    }
}

/// Runs `scenario` (by name, in this test binary) in a process of its own; fails if it
/// does not end within `deadline` or does not report success.
fn run_isolated(scenario: &str, deadline: Duration) {
    let mut child = rerun_command(scenario, &[("TIERSWAP_FORK_SCENARIO", scenario)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{scenario}: no end after {deadline:?}: a fork hung on the pager");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (mut out, mut err) = (String::new(), String::new());
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "{scenario}: {status:?}\n{out}\n{err}");
    assert!(out.contains("scenario done"), "{scenario}: {out}\n{err}");
}

fn in_scenario(name: &str) -> bool {
    std::env::var("TIERSWAP_FORK_SCENARIO").is_ok_and(|v| v == name)
}

/// The hang CI met: a pager created and the process forked before its fault thread had
/// run at all (still in its first malloc). Both fault modes, many times.
#[test]
fn a_fork_right_after_a_pager_starts_does_not_hang() {
    const NAME: &str = "a_fork_right_after_a_pager_starts_does_not_hang";
    if !in_scenario(NAME) {
        return run_isolated(NAME, Duration::from_secs(60));
    }
    // A thread that allocates all the time, so malloc's locks are contended at each fork.
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut keep = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                keep.push(vec![0u8; 1000]);
                if keep.len() > 1000 {
                    keep.clear();
                }
            }
        })
    };
    for round in 0..60u64 {
        let mode = if round % 2 == 0 { FaultMode::Signal } else { FaultMode::Thread };
        let p = pager(4 << 20, "zero,pool", mode, 1);
        let n = 16;
        let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
        let base = r.as_ptr() as usize;
        write_words(r.as_mut_slice(), n, round);
        fork_and_read(base, 3, word(3, round)).unwrap_or_else(|e| panic!("round {round} ({mode:?}): {e}"));
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    println!("scenario done");
}

/// Forks while other threads create and drop regions (allocating under the event lock),
/// munmap and madvise managed memory (events the fault thread reads and handles), and
/// reclaim evicts: every fork ends, and each child reads its fork-time bytes. Thread mode
/// with one fault thread (the one reader the fork waits for) and signal mode.
#[test]
fn forks_while_threads_map_free_and_fault_do_not_hang_and_see_fork_time_memory() {
    const NAME: &str = "forks_while_threads_map_free_and_fault_do_not_hang_and_see_fork_time_memory";
    if !in_scenario(NAME) {
        return run_isolated(NAME, Duration::from_secs(120));
    }
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let p = Arc::new(pager(4 << 20, "zero,pool", mode, 1));
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(AtomicU64::new(0));
        let workers: Vec<_> = (0..2u64)
            .map(|t| {
                let (p, stop, ops) = (p.clone(), stop.clone(), ops.clone());
                std::thread::spawn(move || {
                    let mut k = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        k += 1;
                        let n = 64;
                        let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
                        let salt = t << 40 | k;
                        write_words(r.as_mut_slice(), n, salt);
                        if k.is_multiple_of(3) {
                            p.evict_all();
                        }
                        // A detached mapping freed by the program: an UNMAP event.
                        let d = p.map_detached(16 * PAGE, Hint::Normal).unwrap();
                        // SAFETY: the mapping is ours; we write its first page, drop its
                        // second half (a REMOVE event) and unmap it (an UNMAP event).
                        unsafe {
                            std::ptr::write_volatile(d as *mut u64, salt);
                            libc::madvise(d.add(8 * PAGE).cast(), 8 * PAGE, libc::MADV_DONTNEED);
                            libc::munmap(d.cast(), 16 * PAGE);
                        }
                        let bad = (0..n)
                            .filter(|&pg| {
                                let w = &r.as_slice()[pg * PAGE..pg * PAGE + 8];
                                w != word(pg, salt).to_le_bytes()
                            })
                            .count();
                        assert_eq!(bad, 0, "worker {t} round {k}: pages came back wrong");
                        ops.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let n = 256;
        let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
        let base = r.as_ptr() as usize;
        for round in 0..80u64 {
            write_words(r.as_mut_slice(), n, round);
            if round % 2 == 1 {
                p.evict_all();
            }
            let pg = (round as usize * 37) % n;
            match fork_and_read(base, pg, word(pg, round)) {
                Ok(()) => {}
                Err(e) if signal_mode_child_sigbus(mode, &e) => {}
                Err(e) => panic!("{mode:?} round {round}: {e}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
        assert!(ops.load(Ordering::Relaxed) > 0, "the workers ran");
        let st = p.stats();
        if mode == FaultMode::Thread {
            assert_eq!(st.counters.event_fork, 80, "every fork was seen");
        }
        println!("{mode:?}: {} worker rounds, {} faults", ops.load(Ordering::Relaxed), st.counters.faults);
    }
    println!("scenario done");
}

/// Where the fork handlers below read, and what they should find (0: not armed).
static HANDLER_ADDR: AtomicU64 = AtomicU64::new(0);
static HANDLER_WANT: AtomicU64 = AtomicU64::new(0);
/// Reads done by the handlers, and reads that found the wrong word.
static HANDLER_READS: AtomicU64 = AtomicU64::new(0);
static HANDLER_BAD: AtomicU64 = AtomicU64::new(0);

/// Reads the armed word (page `off` pages past the armed address), as a program's fork
/// handler touching its own (swapped-out) memory would.
fn handler_read(off: usize) {
    let addr = HANDLER_ADDR.load(Ordering::Acquire) as usize;
    if addr == 0 {
        return;
    }
    // SAFETY: the armed address is a mapped page of a live region (the scenario keeps it).
    let w = unsafe { std::ptr::read_volatile((addr + off * PAGE) as *const u64) };
    HANDLER_READS.fetch_add(1, Ordering::Relaxed);
    if w != HANDLER_WANT.load(Ordering::Acquire) + off as u64 * (1 << 20) {
        HANDLER_BAD.fetch_add(1, Ordering::Relaxed);
    }
}

extern "C" fn handler_prepare() {
    handler_read(0);
}

extern "C" fn handler_parent() {
    // The next 64 KiB block: a large swap-in for the prepare handler's read (a stream the
    // round before may have left pointing there) never brings this page in.
    handler_read(16);
}

/// A program's fork handlers registered before the pager (as an allocator's are) run while
/// the gate is closed: after its prepare handler and before its parent handler. They touch
/// swapped-out managed memory there, and the fork must neither hang nor give them wrong
/// bytes, in either fault mode.
#[test]
fn fork_handlers_that_touch_swapped_out_memory_are_served() {
    const NAME: &str = "fork_handlers_that_touch_swapped_out_memory_are_served";
    if !in_scenario(NAME) {
        return run_isolated(NAME, Duration::from_secs(60));
    }
    // SAFETY: plain extern "C" handlers that read memory and count.
    assert_eq!(unsafe { libc::pthread_atfork(Some(handler_prepare), Some(handler_parent), None) }, 0);
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let p = pager(4 << 20, "zero,pool", mode, 1);
        let n = 64;
        let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
        let base = r.as_ptr() as usize;
        for round in 0..20u64 {
            write_words(r.as_mut_slice(), n, round);
            let at = 8 + (round as usize % 8) * 4;
            HANDLER_WANT.store(word(at, round), Ordering::Release);
            HANDLER_ADDR.store((base + at * PAGE) as u64, Ordering::Release);
            p.evict_all();
            let before = p.stats().counters.faults;
            match fork_and_read(base, 2, word(2, round)) {
                Ok(()) => {}
                Err(e) if signal_mode_child_sigbus(mode, &e) => {}
                Err(e) => panic!("{mode:?} round {round}: {e}"),
            }
            HANDLER_ADDR.store(0, Ordering::Release);
            assert!(p.stats().counters.faults >= before + 2, "{mode:?} round {round}: the handlers' reads faulted");
        }
        println!("{mode:?}: handler reads {}", HANDLER_READS.load(Ordering::Relaxed));
    }
    assert_eq!(HANDLER_READS.load(Ordering::Relaxed), 2 * 2 * 20, "both handlers ran at every fork");
    assert_eq!(HANDLER_BAD.load(Ordering::Relaxed), 0, "the handlers read their bytes");
    println!("scenario done");
}

/// A detached mapping the next fork's prepare handler frees (0: not armed).
static FREE_IN_PREPARE: AtomicU64 = AtomicU64::new(0);

extern "C" fn prepare_frees() {
    let addr = FREE_IN_PREPARE.swap(0, Ordering::AcqRel) as usize;
    if addr == 0 {
        return;
    }
    // SAFETY: the armed address is a 16-page detached mapping nothing else uses; its second
    // half is dropped (a REMOVE event), then the whole is unmapped (an UNMAP event).
    unsafe {
        libc::madvise((addr + 8 * PAGE) as *mut libc::c_void, 8 * PAGE, libc::MADV_DONTNEED);
        libc::munmap(addr as *mut libc::c_void, 16 * PAGE);
    }
}

/// A fork handler registered before the pager frees managed memory while the gate is
/// closed: the fault thread reads the REMOVE and UNMAP it waits on in the window where
/// glibc may hold malloc's locks, and must do so without allocating (a list of the regions
/// those events concern once grew there, and a fork hung). Deterministic: every fork's
/// window gets both events, and the test's allocator counts any allocation in a no-alloc
/// section. Both fault modes.
#[test]
fn events_read_while_a_fork_holds_the_gate_allocate_nothing() {
    const NAME: &str = "events_read_while_a_fork_holds_the_gate_allocate_nothing";
    if !in_scenario(NAME) {
        return run_isolated(NAME, Duration::from_secs(60));
    }
    // SAFETY: a plain extern "C" handler that frees an armed mapping.
    assert_eq!(unsafe { libc::pthread_atfork(Some(prepare_frees), None, None) }, 0);
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let p = pager(4 << 20, "zero,pool", mode, 1);
        let n = 64;
        let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
        let base = r.as_ptr() as usize;
        let before = p.stats().counters;
        for round in 0..20u64 {
            write_words(r.as_mut_slice(), n, round);
            p.evict_all();
            let d = p.map_detached(16 * PAGE, Hint::Normal).unwrap();
            // SAFETY: our own fresh mapping: its first and last pages are written.
            unsafe {
                std::ptr::write_volatile(d as *mut u64, round);
                std::ptr::write_volatile(d.add(15 * PAGE) as *mut u64, round);
            }
            FREE_IN_PREPARE.store(d as u64, Ordering::Release);
            match fork_and_read(base, 3, word(3, round)) {
                Ok(()) => {}
                Err(e) if signal_mode_child_sigbus(mode, &e) => {}
                Err(e) => panic!("{mode:?} round {round}: {e}"),
            }
            assert_eq!(FREE_IN_PREPARE.load(Ordering::Acquire), 0, "{mode:?} round {round}: the handler ran");
        }
        let after = p.stats().counters;
        assert_eq!(after.event_unmap - before.event_unmap, 20, "{mode:?}: every munmap was seen");
        assert_eq!(after.event_remove - before.event_remove, 20, "{mode:?}: every madvise was seen");
        let bad = (0..n).filter(|&pg| r.as_slice()[pg * PAGE..pg * PAGE + 8] != word(pg, 19).to_le_bytes()).count();
        assert_eq!(bad, 0, "{mode:?}: the region's pages came back");
        println!("{mode:?}: {} allocations in no-alloc sections", FORBIDDEN_ALLOCS.load(Ordering::Relaxed));
    }
    assert_eq!(
        FORBIDDEN_ALLOCS.load(Ordering::Relaxed),
        0,
        "pager threads allocated while a fork could hold malloc's locks"
    );
    println!("scenario done");
}
