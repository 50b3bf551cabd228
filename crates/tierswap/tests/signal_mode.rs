//! Signal mode (`FaultMode::Signal`): faults served in the faulting thread's SIGBUS handler.
//! Every byte that comes back is compared with what went in; the counters say the faults
//! were served in the faulting threads; the documented limit (a system call touching a
//! swapped-out page fails with EFAULT, and works after `Region::prefault`) is tested as
//! such; SIGBUS that is not a pager's reaches the program's own handler.

mod common;

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{config, fill_page, noise_page, page_matches, pager, run_alone, start, PAGE};
use tierswap::{FaultMode, Hint, PagerConfig};

/// Page `pg` of the round trip: zeros, same-filled, noise, or counters.
fn expected(pg: usize, buf: &mut [u8]) {
    match pg % 8 {
        0 => buf.fill(0),
        1 => buf.fill(0x5a),
        2 => noise_page(buf, pg as u64),
        _ => fill_page(buf, pg, 11),
    }
}

#[test]
fn every_tier_round_trips_with_faults_served_in_the_faulting_thread() {
    let p = pager(8 << 20, "zero,pool,file", FaultMode::Signal, 1);
    let n = 8192; // 32 MiB through an 8 MiB budget
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    let mem = r.as_mut_slice();
    for pg in 0..n {
        expected(pg, &mut mem[pg * PAGE..(pg + 1) * PAGE]);
    }
    let c = p.stats().counters;
    // In order: each first touch maps the next pages too (fault-around).
    assert!(
        c.faults_in_thread >= c.faults_first_touch && c.faults_first_touch + c.fault_around_pages >= n as u64 / 2,
        "first touches were served in this thread: {c:?}"
    );
    p.evict_all();
    let st = p.stats();
    assert_eq!(st.present_pages + st.staged_pages, 0, "everything evicted");
    assert_eq!(st.counters.swpout_zero + st.counters.swpout_samefill, (n / 4) as u64);
    let mut want = vec![0u8; PAGE];
    let mut bad = 0;
    for pg in 0..n {
        expected(pg, &mut want);
        if mem[pg * PAGE..(pg + 1) * PAGE] != want[..] {
            bad += 1;
        }
    }
    assert_eq!(bad, 0, "every byte came back");
    let st = p.stats();
    let served = st.counters.faults_in_thread - c.faults_in_thread;
    assert!(served > 0, "refaults were served in this thread: {st:?}");
    assert_eq!(st.counters.faults_unmanaged, 0);
    assert!(st.counters.faults >= st.counters.faults_in_thread, "every in-thread fault is a fault");
    assert!(st.file_pages > 0 || st.counters.pswpin > 0, "the file tier was used: {st:?}");
}

/// A fault that waits for room in its signal handler cannot evict there: the reclaim
/// helpers (one per CPU, `PagerConfig::direct_reclaim`) evict for it, counted as direct
/// reclaim; with direct reclaim off, only the reclaim thread does.
#[test]
fn reclaim_helpers_evict_for_faults_waiting_in_the_handler() {
    for direct in [true, false] {
        let p =
            start(PagerConfig { direct_reclaim: direct, ..config(4 << 20, "zero,pool,file", FaultMode::Signal, 2) });
        let n = 8192; // 32 MiB through a 4 MiB budget
        let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
        let mem = r.as_mut_slice();
        for pg in 0..n {
            fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg, 3);
        }
        let c = p.stats().counters;
        assert!(c.throttled_faults > 0, "faults waited for room: {c:?}");
        if direct {
            assert!(c.pgsteal_direct > 0, "helpers evicted for them: {c:?}");
        } else {
            assert_eq!(c.pgsteal_direct, 0, "no helpers without direct reclaim: {c:?}");
        }
        assert!(c.pgsteal >= c.pgsteal_direct);
        let bad = (0..n).filter(|&pg| !page_matches(&mem[pg * PAGE..(pg + 1) * PAGE], pg, 3)).count();
        assert_eq!(bad, 0, "every byte came back (direct reclaim {direct})");
        let st = p.stats();
        assert!(st.footprint <= (4 << 20) + (4 << 20) / 20, "footprint {} over the budget", st.footprint);
    }
}

#[test]
fn threads_write_and_read_while_reclaim_evicts() {
    let p = pager(4 << 20, "zero,pool,file", FaultMode::Signal, 1);
    let n = 4096; // 16 MiB through a 4 MiB budget
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    for pg in 0..n {
        fill_page(&mut r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE], pg, 0);
    }
    let base = r.as_ptr() as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    // Thread t owns the pages with pg % 4 == t: it rewrites them with its round as salt
    // and checks each against what it last wrote.
    for t in 0..4usize {
        let stop = stop.clone();
        handles.push(std::thread::spawn(move || {
            let mut salt = vec![0u64; n];
            let mut x = 0x2545_F491_4F6C_DD1Du64 ^ t as u64;
            let mut checked = 0u64;
            let mut round = 1u64;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let pg = (x as usize % (n / 4)) * 4 + t;
                // SAFETY: page pg is inside the region, which outlives the threads; only
                // this thread touches it.
                let page = unsafe { std::slice::from_raw_parts_mut((base + pg * PAGE) as *mut u8, PAGE) };
                assert!(page_matches(page, pg, salt[pg]), "thread {t} page {pg} salt {}", salt[pg]);
                checked += 1;
                if x & 3 == 0 {
                    round += 1;
                    salt[pg] = round;
                    fill_page(page, pg, round);
                }
            }
            checked
        }));
    }
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let checked: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let st = p.stats();
    assert!(checked > 1000, "the threads did work: {checked}");
    assert!(st.counters.faults_in_thread > 100, "faults were served in the threads: {st:?}");
    assert!(st.counters.pswpout + st.counters.zswpout > 0, "reclaim evicted meanwhile: {st:?}");
}

/// The limit of signal mode, as documented: the kernel's own access to a swapped-out page
/// fails with EFAULT and loses nothing; after `prefault` the same call works.
#[test]
fn system_calls_on_swapped_out_pages_fail_with_efault_until_prefaulted() {
    let p = pager(8 << 20, "zero,pool", FaultMode::Signal, 1);
    let n = 64;
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    for pg in 0..n {
        fill_page(&mut r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE], pg, 3);
    }
    p.evict_all();
    assert_eq!(p.stats().present_pages, 0);
    let mut fds = [0i32; 2];
    // SAFETY: pipe(2) fills two fds we then own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);

    // write(2) from a swapped-out page.
    let src = unsafe { r.as_ptr().add(5 * PAGE) };
    // SAFETY: a page of our region, PAGE bytes.
    let w = unsafe { libc::write(fds[1], src.cast(), PAGE) };
    assert_eq!(w, -1, "the kernel cannot fault a swapped-out page in, in signal mode");
    assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EFAULT));
    r.prefault(5 * PAGE, PAGE, false);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::write(fds[1], src.cast(), PAGE) }, PAGE as isize);
    let mut got = vec![0u8; PAGE];
    // SAFETY: reading PAGE bytes into our own buffer.
    assert_eq!(unsafe { libc::read(fds[0], got.as_mut_ptr().cast(), PAGE) }, PAGE as isize);
    assert!(page_matches(&got, 5, 3), "write(2) sent the page's bytes");

    // read(2) into a swapped-out page: EFAULT, and the data stays in the pipe.
    let mut msg = vec![0u8; PAGE];
    fill_page(&mut msg, 999, 0);
    // SAFETY: writing our own buffer.
    assert_eq!(unsafe { libc::write(fds[1], msg.as_ptr().cast(), PAGE) }, PAGE as isize);
    let dst = unsafe { r.as_ptr().add(9 * PAGE) };
    // SAFETY: a page of our region.
    let rd = unsafe { libc::read(fds[0], dst.cast(), PAGE) };
    assert_eq!(rd, -1);
    assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EFAULT));
    assert!(page_matches(&r.as_slice()[9 * PAGE..10 * PAGE], 9, 3), "the failed read changed nothing");
    r.prefault(9 * PAGE, PAGE, true);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::read(fds[0], dst.cast(), PAGE) }, PAGE as isize, "the data waited in the pipe");
    assert!(page_matches(&r.as_slice()[9 * PAGE..10 * PAGE], 999, 0));
    // Every other page is intact.
    for pg in (0..n).filter(|&pg| pg != 9) {
        assert!(page_matches(&r.as_slice()[pg * PAGE..(pg + 1) * PAGE], pg, 3), "page {pg}");
    }
    // SAFETY: closing the fds we own.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}

extern "C" fn program_handler(_sig: i32, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel's siginfo for this SIGBUS.
    let code = unsafe { (*info).si_code };
    let line = format!("program handler: si_code {code}\n");
    // SAFETY: writing our own buffer, then leaving at once.
    unsafe {
        libc::write(1, line.as_ptr().cast(), line.len());
        libc::_exit(42);
    }
}

/// Installs [`program_handler`] for SIGBUS, as a program would before its pager.
fn install_program_handler() {
    // SAFETY: a zeroed sigaction with a SA_SIGINFO handler of the right type.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = program_handler as extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()), 0);
    }
}

/// The child of the test below: its own SIGBUS handler first, then a signal-mode pager
/// whose memory works, then a SIGBUS of its own (a file mapping past the file's end).
fn chaining_child() {
    install_program_handler();
    let p = pager(8 << 20, "zero,pool", FaultMode::Signal, 1);
    let n = 256;
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    for pg in 0..n {
        fill_page(&mut r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE], pg, 5);
    }
    p.evict_all();
    let good = (0..n).filter(|&pg| page_matches(&r.as_slice()[pg * PAGE..(pg + 1) * PAGE], pg, 5)).count();
    println!("good pages {good} in_thread {}", p.stats().counters.faults_in_thread);
    std::io::stdout().flush().unwrap();
    let path = std::env::temp_dir().join(format!("tierswap-sigbus-{}", std::process::id()));
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    f.set_len(1).unwrap();
    // SAFETY: mapping two pages of a one-byte file: the second page is past its end, and
    // touching it raises SIGBUS (BUS_ADRERR), which is the program's, not the pager's.
    let m = unsafe {
        use std::os::fd::AsRawFd;
        libc::mmap(std::ptr::null_mut(), 2 * PAGE, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0)
    };
    assert_ne!(m, libc::MAP_FAILED);
    let _ = std::fs::remove_file(&path);
    // SAFETY: reading the mapping's second page (see above).
    let v = unsafe { std::ptr::read_volatile((m as *const u8).add(PAGE)) };
    println!("read past the end: {v}");
    std::process::exit(0);
}

#[test]
fn a_sigbus_that_is_not_a_pagers_reaches_the_programs_handler() {
    if std::env::var("TIERSWAP_CHAIN_CHILD").is_ok() {
        return chaining_child();
    }
    let (out, stdout, stderr) =
        run_alone("a_sigbus_that_is_not_a_pagers_reaches_the_programs_handler", &[("TIERSWAP_CHAIN_CHILD", "1")]);
    assert_eq!(out.status.code(), Some(42), "the program's handler ran: {:?}\n{stdout}\n{stderr}", out.status.signal());
    let good = stdout
        .lines()
        .find_map(|l| l.find("good pages ").map(|at| &l[at..]))
        .unwrap_or_else(|| panic!("{stdout}\n{stderr}"));
    assert!(good.starts_with("good pages 256 "), "the pager's memory worked under the program's handler: {good}");
    let in_thread: u64 = good.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(in_thread >= 256 / 16, "served in the thread: {good}");
    assert!(stdout.contains(&format!("program handler: si_code {}", libc::BUS_ADRERR)), "{stdout}");
    assert!(!stdout.contains("read past the end"), "{stdout}");
}

/// The child of the test below: its own SIGBUS handler first, then a signal-mode pager
/// with its pages on the file, one record corrupted behind its back; every other page
/// reads back, then the corrupted one is touched. An alarm ends it if that never returns.
fn poisoned_child() {
    // SAFETY: alarm has no preconditions; SIGALRM's default action ends the process.
    unsafe { libc::alarm(20) };
    install_program_handler();
    let p = pager(8 << 20, "zero,file", FaultMode::Signal, 1);
    let n = 64;
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    for pg in 0..n {
        fill_page(&mut r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE], pg, 9);
    }
    p.evict_all();
    let (_, off, len) = r.file_record(3).expect("page 3 is on the file");
    let fd = std::os::fd::AsRawFd::as_raw_fd(p.swap_file().expect("a file tier"));
    let f = std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/self/fd/{fd}")).unwrap();
    let pos = off + 16 + len as u64 / 2;
    let mut b = [0u8; 1];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, pos).unwrap();
    b[0] ^= 0x10;
    std::os::unix::fs::FileExt::write_all_at(&f, &b, pos).unwrap();
    let mem = r.as_slice();
    let good = (0..n).filter(|&pg| pg != 3 && page_matches(&mem[pg * PAGE..(pg + 1) * PAGE], pg, 9)).count();
    println!("good pages {good}");
    std::io::stdout().flush().unwrap();
    // SAFETY: reading a word of our own region.
    let v = unsafe { std::ptr::read_volatile(mem.as_ptr().add(3 * PAGE + 8)) };
    println!("read corrupted page: {v}");
    std::process::exit(0);
}

/// A page that cannot be read back is poisoned, and the SIGBUS its touch raises is the
/// program's. Where the kernel reports a poison marker with BUS_ADRERR, as it does a
/// userfaultfd fault (no CONFIG_MEMORY_FAILURE, this VM's kernel), the handler took it
/// for a fault and retried the access forever.
#[test]
fn a_page_that_cannot_be_read_back_gives_the_program_its_sigbus() {
    if std::env::var("TIERSWAP_POISON_CHILD").is_ok() {
        return poisoned_child();
    }
    let (out, stdout, stderr) =
        run_alone("a_page_that_cannot_be_read_back_gives_the_program_its_sigbus", &[("TIERSWAP_POISON_CHILD", "1")]);
    assert_eq!(
        out.status.code(),
        Some(42),
        "the program's handler ran (signal {:?}: SIGALRM means the touch never returned)\n{stdout}\n{stderr}",
        out.status.signal()
    );
    assert!(stdout.contains("good pages 63"), "every other page read back: {stdout}\n{stderr}");
    assert!(stdout.contains("program handler: si_code"), "{stdout}");
    assert!(!stdout.contains("read corrupted page"), "no data came back: {stdout}");
    assert!(stderr.contains("cannot be read back") && stderr.contains("SIGBUS"), "the log names it: {stderr}");
}

/// Signal mode serves a forked child through its parent's pager: the child's faults raise
/// SIGBUS in the child, whose handler asks the parent's pager over the child link, and the
/// pager installs the page through the child's userfaultfd. The child reads every page as
/// it was at the fork (swapped, clean and present pages), writes them all (a write to a
/// clean page lifts the protection the fork copied), and reads its own writes back; the
/// parent's memory is untouched by the child's writes. A grandchild is served the same
/// way: it reads a page swapped out at the first fork and still missing in its parent, and
/// the child's writes before its fork. In a process of its own: a fork shares every page of the process with the child
/// for a moment, which would make the other tests' evictions find their pages busy.
#[test]
fn a_forked_child_is_served_by_the_parents_pager_and_the_parent_is_untouched() {
    if std::env::var("TIERSWAP_FORK_TEST").is_ok() {
        return forking_test();
    }
    let (out, stdout, stderr) = run_alone(
        "a_forked_child_is_served_by_the_parents_pager_and_the_parent_is_untouched",
        &[("TIERSWAP_FORK_TEST", "1")],
    );
    assert!(out.status.success(), "{:?}\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("forking test done"), "{stdout}\n{stderr}");
}

fn forking_test() {
    let p = pager(8 << 20, "zero,pool", FaultMode::Signal, 1);
    let n = 1024;
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    for pg in 0..n {
        fill_page(&mut r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE], pg, 9);
    }
    p.evict_all();
    // Pages 0..64 come back clean (read only: present, their slots kept); the rest stay out.
    for pg in 0..64 {
        assert!(page_matches(&r.as_slice()[pg * PAGE..(pg + 1) * PAGE], pg, 9), "page {pg} is back in the parent");
    }
    let before = p.stats().counters;
    let base = r.as_ptr() as usize;
    // SAFETY: the child only reads and writes memory and calls _exit (async-signal-safe).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: reads and writes of the region (its fork-time copy), then _exit.
        unsafe {
            let page = |pg: usize| std::slice::from_raw_parts((base + pg * PAGE) as *const u8, PAGE);
            // The last page stays untouched here, for the grandchild.
            for pg in 0..n - 1 {
                if !page_matches(page(pg), pg, 9) {
                    libc::_exit(3);
                }
            }
            for pg in 0..n - 1 {
                let w = (base + pg * PAGE + 8) as *mut u64;
                std::ptr::write_volatile(w, 0xc0ffee + pg as u64);
            }
            for pg in 0..n - 1 {
                if std::ptr::read_volatile((base + pg * PAGE + 8) as *const u64) != 0xc0ffee + pg as u64 {
                    libc::_exit(4);
                }
            }
            // A grandchild reads a page swapped out in the parent and missing here, and one
            // of the child's writes.
            let g = libc::fork();
            if g == 0 {
                let ok = page_matches(page(n - 1), n - 1, 9)
                    && std::ptr::read_volatile((base + 8) as *const u64) == 0xc0ffee;
                libc::_exit(if ok { 0 } else { 5 });
            }
            let mut st = 0;
            if g < 0 || libc::waitpid(g, &mut st, 0) != g || !libc::WIFEXITED(st) || libc::WEXITSTATUS(st) != 0 {
                libc::_exit(6);
            }
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child read every page as at the fork, wrote each and read its writes back, and its own child read \
         its pages: status {status:#x} (exit 3: a wrong fork-time byte, 4: a lost write, 6: the grandchild)"
    );
    let bad = (0..n).filter(|&pg| !page_matches(&r.as_slice()[pg * PAGE..(pg + 1) * PAGE], pg, 9)).count();
    assert_eq!(bad, 0, "the parent's memory is whole");
    let after = p.stats().counters;
    assert!(after.fork_shared_slots - before.fork_shared_slots >= (n - 64) as u64 / 2, "{after:?}");
    assert!(after.child_faults > before.child_faults, "the parent's pager served the child: {after:?}");
    assert!(after.child_wp_faults > before.child_wp_faults, "the child wrote clean pages: {after:?}");
    println!("forking test done");
}
