//! The pager's own file descriptors, kept open whatever the program closes.
//!
//! Daemons, launchers and `os.closerange` close every descriptor they did not open. Closing
//! the pager's userfaultfd ends its registrations: the kernel then maps a zero page wherever
//! a page was swapped out, and the program reads zeros where its data was (seen: 60 % of a
//! 24 MiB buffer came back as zeros). Closing the swap file loses what was written back.
//! So the shim notes which descriptors the pager and its control socket opened (the ones
//! that appear in `/proc/self/fd` while they start) and `close`, `close_range`, `closefrom`,
//! `dup2` and `dup3` leave those alone: a close of one reports success and changes nothing
//! (the program believes it closed something it never opened), a dup onto one fails with
//! EBUSY (the kernel's own answer when a descriptor cannot be replaced).
//!
//! Only in the process that started the pager, and only for the program's threads: a fork
//! child's copies are its own to close, and the pager's threads close what they like.
//! A program that makes the raw close system call gets past this; the pager then aborts the
//! process when it notices (see the engine), it never serves wrong bytes knowingly.
//!
//! The pager's descriptors are opened above the low numbers ([`hold_low`]): programs and
//! launchers dup onto fixed low numbers (the JDK's jspawnhelper puts its error pipe on fd
//! 3, then execs), and a refused dup there broke every `ProcessBuilder.start()` of a JVM
//! under `tierswap run` (EBUSY).

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// At most this many protected descriptors: the pager opens a handful, and each fault
/// thread (one per CPU) an io_uring for its reads.
const MAX_PROTECTED: usize = 256;

static PROTECTED: [AtomicI32; MAX_PROTECTED] = [const { AtomicI32::new(-1) }; MAX_PROTECTED];
static N_PROTECTED: AtomicUsize = AtomicUsize::new(0);
/// The process whose descriptors these are (0: none yet).
static OWNER_PID: AtomicI32 = AtomicI32::new(0);
/// Closes and dups refused, for the exit report.
pub(crate) static REFUSED: AtomicUsize = AtomicUsize::new(0);

/// The descriptors open now, sorted (not counting the one the listing itself used).
pub(crate) fn open_fds() -> Vec<i32> {
    let mut fds: Vec<i32> = match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect(),
        Err(_) => Vec::new(),
    };
    // The directory's own descriptor is in the listing and closed by now.
    fds.retain(|&fd| is_open(fd));
    fds.sort_unstable();
    fds
}

/// Descriptors below this stay the program's: the pager's open above them.
const LOW_FDS: i32 = 64;

/// Placeholders on every free descriptor below [`LOW_FDS`] (fewer when the descriptor limit
/// is low: a quarter of it at most), so that what the pager opens while this is held lands
/// above them; closed on drop.
pub(crate) struct LowHeld(Vec<i32>);

/// Holds the free low descriptors (see [`LowHeld`]).
pub(crate) fn hold_low() -> LowHeld {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 { lim.rlim_cur } else { 0 };
    let below = (LOW_FDS as u64).min(soft / 4) as i32;
    let mut held = Vec::new();
    // SAFETY: a plain open of /dev/null; the descriptor is ours.
    let src = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if src < 0 {
        return LowHeld(held);
    }
    held.push(src);
    loop {
        // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor (the lowest free one) for ours.
        let fd = unsafe { libc::fcntl(src, libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            break;
        }
        held.push(fd);
        if fd >= below {
            break;
        }
    }
    LowHeld(held)
}

impl Drop for LowHeld {
    fn drop(&mut self) {
        for &fd in &self.0 {
            // SAFETY: our placeholders, used by nothing (the raw call: not the interposer).
            unsafe { libc::syscall(libc::SYS_close, fd) };
        }
    }
}

/// Protects every descriptor open now that was in neither `before` nor `held`, but for
/// files under /proc and descriptors closed since the listing: the pager keeps no /proc
/// file open, it reads them (a thread's stat, pagemap, maps) and closes them. Listed while
/// the low numbers are still held, so a file a pager thread has open for a moment is on a
/// high number: listed after they were let go, one such on fd 3, then on fd 4, was refused
/// (EBUSY) to the program's dup2 for the rest of the run. (A link that cannot be read is a
/// descriptor closed meanwhile: an open one always has a target, "anon_inode:…" or
/// "socket:[…]".)
pub(crate) fn protect_new_since(before: &[i32], held: &LowHeld) {
    let mut n = 0;
    for fd in open_fds() {
        if held.0.contains(&fd) {
            continue;
        }
        let transient = std::fs::read_link(format!("/proc/self/fd/{fd}")).map_or(true, |t| t.starts_with("/proc/"));
        if before.binary_search(&fd).is_err() && !transient && n < MAX_PROTECTED {
            PROTECTED[n].store(fd, Ordering::Relaxed);
            n += 1;
        }
    }
    N_PROTECTED.store(n, Ordering::Release);
    // SAFETY: getpid has no preconditions.
    OWNER_PID.store(unsafe { libc::getpid() }, Ordering::Release);
}

fn is_open(fd: i32) -> bool {
    // SAFETY: F_GETFD only reads the descriptor's flags.
    unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
}

/// The protected descriptors, for the log.
pub(crate) fn protected() -> Vec<i32> {
    (0..N_PROTECTED.load(Ordering::Acquire)).map(|i| PROTECTED[i].load(Ordering::Relaxed)).collect()
}

/// Whether this call, from this thread, must leave `fd` open.
pub(crate) fn guards(fd: i32) -> bool {
    let n = N_PROTECTED.load(Ordering::Acquire);
    if n == 0 || fd < 0 {
        return false;
    }
    if !(0..n).any(|i| PROTECTED[i].load(Ordering::Relaxed) == fd) {
        return false;
    }
    // A fork or vfork child (vfork shares our memory, so the pid tells) owns its copies.
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } != OWNER_PID.load(Ordering::Acquire) {
        return false;
    }
    crate::raw::thread_may_manage()
}

/// The protected descriptors inside `first..=last` that this call must keep, sorted.
pub(crate) fn guarded_in(first: u32, last: u32) -> ([i32; MAX_PROTECTED], usize) {
    let mut out = [0i32; MAX_PROTECTED];
    let mut k = 0;
    for slot in PROTECTED.iter().take(N_PROTECTED.load(Ordering::Acquire)) {
        let fd = slot.load(Ordering::Relaxed);
        if fd >= 0 && (first..=last).contains(&(fd as u32)) && guards(fd) {
            out[k] = fd;
            k += 1;
        }
    }
    out[..k].sort_unstable();
    (out, k)
}
