//! The userfaultfd wrappers against the real kernel: each call does what its name says, and
//! each errno comes back as the variant that names the situation.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{serial, PAGE};
use tierswap::uffd::{features, Error, Event, RegisterMode, Uffd};

// The forking test and the moving test take `serial()` in turns: a fork shares every page of
// the process with the child until it exits, and the kernel refuses to move a shared page
// (EBUSY).

fn map(len: usize) -> usize {
    // SAFETY: a fresh private anonymous mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: our mapping.
    unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
    p as usize
}

fn uffd() -> Uffd {
    Uffd::new(features::MOVE | features::POISON, true).expect("userfaultfd with MOVE and POISON (root, Linux ≥ 6.8)")
}

/// Serves faults on `u` by copying `pattern(page index)` until stopped.
fn server(u: Arc<Uffd>, base: usize, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut served = 0;
        let mut evs = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            if !u.poll_readable(20, None).unwrap().uffd {
                continue;
            }
            evs.clear();
            u.read_events(&mut evs, 16).unwrap();
            for e in evs.drain(..) {
                if let Event::PageFault { addr, .. } = e {
                    let idx = (addr - base) / PAGE;
                    let page = vec![idx as u8 ^ 0x5a; PAGE];
                    match u.copy(addr & !(PAGE - 1), &page, false, false) {
                        Ok(n) => assert_eq!(n, PAGE),
                        Err(Error::PageExist { .. }) => u.wake(addr & !(PAGE - 1), PAGE).unwrap(),
                        Err(e) => panic!("{e}"),
                    }
                    served += 1;
                }
            }
        }
        served
    })
}

#[test]
fn copy_serves_a_fault_byte_for_byte() {
    let u = Arc::new(uffd());
    let base = map(8 * PAGE);
    u.register(base, 8 * PAGE, RegisterMode { missing: true, ..Default::default() }).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let h = server(u.clone(), base, stop.clone());
    for i in 0..8 {
        // SAFETY: reading our registered mapping; the server fills it.
        let s = unsafe { std::slice::from_raw_parts((base + i * PAGE) as *const u8, PAGE) };
        assert!(s.iter().all(|&b| b == i as u8 ^ 0x5a), "page {i}");
    }
    stop.store(true, Ordering::Relaxed);
    assert_eq!(h.join().unwrap(), 8);
    // A copy onto a present page names the situation.
    assert!(matches!(u.copy(base, &[0u8; PAGE], false, false), Err(Error::PageExist { done_bytes: 0, .. })));
    u.unregister(base, 8 * PAGE).unwrap();
}

#[test]
fn zeropage_move_and_holes() {
    let _turn = serial();
    let u = uffd();
    let n = 16;
    let src = map(n * PAGE);
    let dst = map(n * PAGE);
    for a in [src, dst] {
        u.register(a, n * PAGE, RegisterMode { missing: true, ..Default::default() }).unwrap();
    }
    // Fill src through the uffd itself (no faults needed).
    for i in 0..n {
        if i == 9 {
            continue; // a hole
        }
        u.copy(src + i * PAGE, &vec![i as u8 + 1; PAGE], true, false).unwrap();
    }
    // Move: stops at the hole, reporting the bytes moved before it. Linux 6.18 says EAGAIN
    // for a hole in a populated page table (ENOENT when the table itself is missing), so
    // callers treat both as "no page here".
    // SAFETY: both ranges are ours and only this test looks at them.
    let r = unsafe { u.move_pages(dst, src, n * PAGE, true, false) };
    assert!(
        matches!(r, Err(Error::NoPage { done_bytes, .. }) | Err(Error::Again { done_bytes, .. }) if done_bytes == 9 * PAGE),
        "{r:?}"
    );
    // With holes allowed the rest moves too.
    // SAFETY: as above.
    let r = unsafe { u.move_pages(dst + 10 * PAGE, src + 10 * PAGE, 6 * PAGE, true, true) }.unwrap();
    assert_eq!(r, 6 * PAGE);
    u.zeropage(dst + 9 * PAGE, PAGE, true).unwrap();
    for i in 0..n {
        // SAFETY: every dst page is now present.
        let s = unsafe { std::slice::from_raw_parts((dst + i * PAGE) as *const u8, PAGE) };
        let want = if i == 9 { 0 } else { i as u8 + 1 };
        assert!(s.iter().all(|&b| b == want), "page {i}");
    }
    // Moving onto present pages is refused.
    u.copy(src, &[7u8; PAGE], true, false).unwrap();
    // SAFETY: as above.
    let r = unsafe { u.move_pages(dst, src, PAGE, true, false) };
    assert!(matches!(r, Err(Error::PageExist { .. })), "{r:?}");
}

#[test]
fn poison_gives_sigbus_to_the_toucher_only() {
    let _turn = serial();
    let u = uffd();
    let base = map(2 * PAGE);
    u.register(base, 2 * PAGE, RegisterMode { missing: true, ..Default::default() }).unwrap();
    assert_eq!(u.poison(base, PAGE, true).unwrap(), PAGE);
    u.copy(base + PAGE, &[3u8; PAGE], true, false).unwrap();
    // SAFETY: fork in a test; the child only touches memory and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: reading the poisoned page: the kernel raises SIGBUS.
        let v = unsafe { std::ptr::read_volatile(base as *const u8) };
        // SAFETY: _exit in the forked child.
        unsafe { libc::_exit(v as i32) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFSIGNALED(status), "child exited normally with {status:#x}");
    assert_eq!(libc::WTERMSIG(status), libc::SIGBUS);
    // SAFETY: the other page is present and ours.
    assert_eq!(unsafe { std::ptr::read_volatile((base + PAGE) as *const u8) }, 3);
}

#[test]
fn unavailable_error_says_what_to_enable() {
    let e = Error::Unavailable {
        dev: std::io::Error::from_raw_os_error(libc::EACCES),
        syscall: std::io::Error::from_raw_os_error(libc::EPERM),
    };
    let m = e.to_string();
    assert!(m.contains("root") && m.contains("CAP_SYS_PTRACE") && m.contains("/dev/userfaultfd"), "{m}");
}

#[test]
fn a_refused_fork_event_names_the_capability() {
    for (errno, wanted, says) in [
        (libc::EPERM, features::EVENT_FORK | features::MOVE, "CAP_SYS_PTRACE"),
        (libc::EPERM, features::MOVE, "handshake failed"),
        (libc::EINVAL, features::EVENT_FORK, "handshake failed"),
    ] {
        let m = tierswap::uffd::api_error(std::io::Error::from_raw_os_error(errno), wanted).to_string();
        assert!(m.contains(says), "errno {errno}, features {wanted:#x}: {m}");
    }
}
