//! Raw memory calls for the engine's own memory, made as system calls so that an
//! LD_PRELOAD shim interposing libc's `mmap` family never sees (or manages) them.
//!
//! Nothing here decides anything; callers own the mappings they make.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Maps `len_bytes` of private anonymous memory, reserved but not committed
/// (MAP_NORESERVE): pages cost memory only once touched. `len_bytes` is rounded up to pages.
pub fn mmap_reserve(len_bytes: usize) -> io::Result<usize> {
    mmap_anon(len_bytes, libc::MAP_NORESERVE)
}

/// As [`mmap_reserve`], for the pager's own metadata (page tables, the swap table, the
/// pool): not inherited by a forked child (MADV_DONTFORK). The child never reads it (its
/// pages come from the parent's pager; its own pager has its own), and a copy-on-write copy
/// would keep in the child, for as long as it lives, the old version of every page the
/// parent's pager changes after the fork: a BGSAVE child of a pager with a 16 MiB budget
/// held 12 MiB of them.
pub fn mmap_metadata(len_bytes: usize) -> io::Result<usize> {
    let addr = mmap_reserve(len_bytes)?;
    // SAFETY: our fresh mapping; DONTFORK changes only what a fork copies.
    let _ = unsafe { madvise(addr, len_bytes, libc::MADV_DONTFORK) };
    Ok(addr)
}

/// As [`mmap_reserve`], at `near` when that range is free (a hint, as mmap(2) takes it:
/// the kernel picks another address when it is not; 0: no wish).
pub fn mmap_reserve_near(near: usize, len_bytes: usize) -> io::Result<usize> {
    mmap_anon_near(near, len_bytes, libc::MAP_NORESERVE)
}

/// Maps `len_bytes` of private anonymous memory with extra `flags`.
pub fn mmap_anon(len_bytes: usize, flags: i32) -> io::Result<usize> {
    mmap_anon_near(0, len_bytes, flags)
}

fn mmap_anon_near(near: usize, len_bytes: usize, flags: i32) -> io::Result<usize> {
    let len = crate::page::round_up_pages(len_bytes.max(1));
    // SAFETY: a fresh anonymous mapping at an address the kernel picks; it aliases nothing.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            near,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1i32,
            0usize,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ret as usize)
}

/// Unmaps `[addr, addr + len_bytes)`.
///
/// # Safety
/// The range must be a mapping the caller owns, with no references into it left.
pub unsafe fn munmap(addr: usize, len_bytes: usize) -> io::Result<()> {
    // SAFETY: the caller owns the range and holds no references into it.
    let ret = unsafe { libc::syscall(libc::SYS_munmap, addr, crate::page::round_up_pages(len_bytes)) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `madvise(addr, len_bytes, advice)`.
///
/// # Safety
/// For destructive advice (MADV_DONTNEED, MADV_FREE, MADV_REMOVE) the caller must own the
/// range and accept that its contents read back as zeros.
pub unsafe fn madvise(addr: usize, len_bytes: usize, advice: i32) -> io::Result<()> {
    // SAFETY: the caller owns the range and accepts what the advice does to it.
    let ret = unsafe { libc::syscall(libc::SYS_madvise, addr, len_bytes, advice) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A pidfd for the calling process, for [`process_madvise`]. A pidfd names the process,
/// not the pid: a forked child must open its own.
pub fn pidfd_self() -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just returned to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `process_madvise(pidfd, ranges, advice)`: one advice over several ranges in one call
/// (one TLB flush for all of them where the kernel batches it). Returns the bytes advised,
/// which is less than the ranges' total when a range failed after the ones before it were
/// advised. Advice other than the reclaim hints needs the caller's own process and Linux
/// 6.13; older kernels answer EINVAL, and callers fall back to [`madvise`].
///
/// # Safety
/// As for [`madvise`], for every range.
pub unsafe fn process_madvise(pidfd: BorrowedFd<'_>, ranges: &[libc::iovec], advice: i32) -> io::Result<usize> {
    // SAFETY: `ranges` is a live slice of iovecs of its length; the caller owns the ranges
    // and accepts what the advice does to them.
    let ret = unsafe {
        libc::syscall(libc::SYS_process_madvise, pidfd.as_raw_fd(), ranges.as_ptr(), ranges.len(), advice, 0)
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ret as usize)
}

/// Sets the calling thread's nice value (Linux: per thread).
pub fn set_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority on our own thread id, no pointers.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Moves the calling thread to SCHED_IDLE: it runs only when no ordinary thread wants the
/// CPU, and an ordinary thread woken on its CPU preempts it at once.
pub fn set_thread_sched_idle() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param; pid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPUs the calling thread may run on, in ascending order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain bits; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads bit `cpu` of `set`, and every `cpu` is below the set's size.
    Ok((0..max).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) }).collect())
}

/// A new non-blocking eventfd, closed on exec.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd returns a new fd (or -1) that nothing else owns.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if efd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `efd` is a fresh fd nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(efd) })
}

/// Adds one to eventfd `fd`, waking whoever polls it. Cannot fail short of a count near
/// 2^64, which a ring per wake-up never reaches.
pub fn eventfd_ring(fd: BorrowedFd<'_>) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd the caller owns.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Resets non-blocking eventfd `fd` to zero (nothing happens when it already is).
pub fn eventfd_drain(fd: BorrowedFd<'_>) {
    let mut count: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd the caller owns.
    unsafe { libc::read(fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
}

/// A pair of connected Unix `SOCK_SEQPACKET` sockets (message boundaries kept), blocking,
/// closed on exec. Async-signal-safe (one system call).
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1i32; 2];
    // SAFETY: socketpair writes two new descriptors into our array of two.
    let rc = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sends one message `msg` on socket `fd`, with descriptor `pass` attached (SCM_RIGHTS)
/// when given. Retried on EINTR. Async-signal-safe: no allocation, system calls only.
pub fn send_msg(fd: i32, msg: &[u8], pass: Option<i32>) -> io::Result<usize> {
    send_msg_flags(fd, msg, pass, libc::MSG_NOSIGNAL)
}

/// [`send_msg`] without waiting: EAGAIN when the socket's buffer is full.
pub fn send_msg_nowait(fd: i32, msg: &[u8]) -> io::Result<usize> {
    send_msg_flags(fd, msg, None, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
}

fn send_msg_flags(fd: i32, msg: &[u8], pass: Option<i32>, flags: i32) -> io::Result<usize> {
    // Room for one descriptor's control message (CMSG_SPACE(4) is 16 on 64-bit Linux).
    let mut control = [0u64; 4];
    let mut iov = libc::iovec { iov_base: msg.as_ptr() as *mut libc::c_void, iov_len: msg.len() };
    // SAFETY: msghdr is plain data; every pointer we set points at live locals of the right
    // size, and CMSG_* walk only the control buffer we give.
    unsafe {
        let mut hdr: libc::msghdr = std::mem::zeroed();
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        if let Some(pass) = pass {
            hdr.msg_control = control.as_mut_ptr().cast();
            hdr.msg_controllen = libc::CMSG_SPACE(4) as usize;
            let c = libc::CMSG_FIRSTHDR(&hdr);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<i32>(), pass);
        }
        loop {
            let n = libc::sendmsg(fd, &hdr, flags);
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }
}

/// Receives one message from socket `fd` into `buf`, and the descriptor it carries, if any
/// (closed on exec). `Ok((0, None))` at end of stream. `dontwait`: EAGAIN when nothing is
/// queued, instead of waiting. Retried on EINTR; async-signal-safe.
pub fn recv_msg(fd: i32, buf: &mut [u8], dontwait: bool) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut control = [0u64; 4];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: as in send_msg; a descriptor the kernel put in the control message is new
    // and ours alone.
    unsafe {
        let mut hdr: libc::msghdr = std::mem::zeroed();
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = control.as_mut_ptr().cast();
        hdr.msg_controllen = std::mem::size_of_val(&control);
        let flags = libc::MSG_CMSG_CLOEXEC | if dontwait { libc::MSG_DONTWAIT } else { 0 };
        let n = loop {
            let n = libc::recvmsg(fd, &mut hdr, flags);
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        };
        let mut passed = None;
        let c = libc::CMSG_FIRSTHDR(&hdr);
        if !c.is_null() && (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
            let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>());
            passed = Some(OwnedFd::from_raw_fd(fd));
        }
        Ok((n, passed))
    }
}

/// Reads `buf.len()` bytes of this process's own memory at `addr` without faulting on it:
/// `process_vm_readv` on ourselves. A page registered on a userfaultfd in SIGBUS mode
/// that is still missing answers EFAULT instead of raising SIGBUS. Async-signal-safe.
pub fn read_own_memory(addr: usize, buf: &mut [u8]) -> io::Result<usize> {
    let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: buf.len() };
    // SAFETY: the local iovec is our live buffer; the kernel checks the remote one and
    // reports EFAULT for what it cannot read.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// The CPU the calling thread runs on (it may have moved by the time the caller looks).
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes nothing and returns a CPU number or -1.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// The CPU a thread last ran on, from the text of its `/proc/…/stat`: field 39, counting
/// from the pid; fields are counted after the command's closing parenthesis, since the
/// command itself may hold spaces and parentheses.
pub fn stat_cpu(stat: &str) -> Option<usize> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // After the command come the state (field 3) and the rest: field 39 is the 37th.
    after_comm.split_ascii_whitespace().nth(39 - 3).and_then(|f| f.parse().ok())
}

/// Restricts the calling thread to one CPU.
pub fn pin_thread(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain bits; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: `cpu` is below the set's size (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `PROCMAP_QUERY` (uapi linux/fs.h, Linux 6.11): `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: u64 = 0xC068_6611;

/// uapi `struct procmap_query` (104 bytes); only the fields we use are named in use.
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// The mapping (VMA) that holds `addr`, as (start, end), asked of the kernel with
/// PROCMAP_QUERY on /proc/self/maps, or read from its text where that ioctl is missing.
/// `None`: nothing maps `addr`, or /proc cannot say.
pub fn vma_of(addr: usize) -> Option<(usize, usize)> {
    use std::io::Read;
    let mut f = std::fs::File::open("/proc/self/maps").ok()?;
    let mut q = ProcmapQuery {
        size: std::mem::size_of::<ProcmapQuery>() as u64,
        query_addr: addr as u64,
        ..Default::default()
    };
    // SAFETY: PROCMAP_QUERY reads and writes one `procmap_query` of the size we give; no
    // name or build-id buffer is passed (sizes 0, addresses 0).
    let r = unsafe { libc::ioctl(f.as_raw_fd(), PROCMAP_QUERY as _, &mut q as *mut ProcmapQuery) };
    if r == 0 {
        return Some((q.vma_start as usize, q.vma_end as usize));
    }
    if io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
        return None;
    }
    // Older kernels (ENOTTY): the text, one "start-end perms ..." line per mapping.
    let mut text = String::new();
    f.read_to_string(&mut text).ok()?;
    text.lines().filter_map(maps_line).find(|&(a, b, _)| a <= addr && addr < b).map(|(a, b, _)| (a, b))
}

/// CLOCK_MONOTONIC in milliseconds: the same clock in every process of the machine.
/// Async-signal-safe (one vDSO call).
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into ours.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// The number of CPUs this process may run on.
pub fn online_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Whether the page at `addr` (page-aligned, in a mapping of ours) is resident (mincore):
/// false for a hole in anonymous memory.
pub fn is_resident(addr: usize) -> bool {
    let mut vec = 0u8;
    // SAFETY: mincore writes one byte for one page into `vec`; the range is our mapping.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, crate::page::PAGE_SIZE, &mut vec) };
    r == 0 && vec & 1 == 1
}

/// Whether a seccomp filter applies to this thread (`Seccomp: 2` in its status; true when
/// the status cannot be read).
pub fn seccomp_filtered() -> bool {
    std::fs::read_to_string("/proc/thread-self/status")
        .map_or(true, |st| st.lines().any(|l| l.starts_with("Seccomp:") && l.trim_end().ends_with('2')))
}

/// Fills `out[k]` with whether page `k` of the range at `addr` (page-aligned, in a mapping
/// of ours) is resident, with one mincore. False everywhere if mincore fails.
pub fn residency(addr: usize, out: &mut [bool]) {
    let mut vec = [0u8; 512];
    for (chunk, part) in out.chunks_mut(vec.len()).enumerate() {
        let at = addr + chunk * vec.len() * crate::page::PAGE_SIZE;
        // SAFETY: mincore writes one byte per page of the range into `vec`, which has room
        // for `part.len()` pages; it only reads page tables.
        let r =
            unsafe { libc::mincore(at as *mut libc::c_void, part.len() * crate::page::PAGE_SIZE, vec.as_mut_ptr()) };
        for (k, o) in part.iter_mut().enumerate() {
            *o = r == 0 && vec[k] & 1 == 1;
        }
    }
}

/// A /proc/self/pagemap entry's bit: the page is present.
pub const PAGEMAP_PRESENT: u64 = 1 << 63;
/// A /proc/self/pagemap entry's bit: the page is mapped by this process alone.
pub const PAGEMAP_EXCLUSIVE: u64 = 1 << 56;

/// The /proc/self/pagemap entries of the `n_pages` pages from `addr` (page-aligned).
pub fn page_map(addr: usize, n_pages: usize) -> io::Result<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap")?;
    let mut bytes = vec![0u8; n_pages * 8];
    f.read_exact_at(&mut bytes, (addr / crate::page::PAGE_SIZE * 8) as u64)?;
    Ok(bytes.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8]))).collect())
}

/// Whether each page at `addrs` (page-aligned) is present and mapped by this process
/// alone, into `alone[k]` for `addrs[k]`: one read of /proc/self/pagemap a page.
pub fn mapped_alone(addrs: &[usize], alone: &mut [bool]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap")?;
    for (&addr, out) in addrs.iter().zip(alone.iter_mut()) {
        let mut w = [0u8; 8];
        f.read_exact_at(&mut w, (addr / crate::page::PAGE_SIZE * 8) as u64)?;
        let e = u64::from_le_bytes(w);
        *out = e & PAGEMAP_PRESENT != 0 && e & PAGEMAP_EXCLUSIVE != 0;
    }
    Ok(())
}

/// The mappings of this process that overlap `[start, end)`, clipped to it, in address
/// order, each with whether it is plain read-write (`rw-`), from /proc/self/maps.
pub fn mappings_in(start: usize, end: usize) -> io::Result<Vec<(usize, usize, bool)>> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    Ok(maps
        .lines()
        .filter_map(maps_line)
        .filter(|&(a, b, _)| a < end && b > start)
        .map(|(a, b, perms)| (a.max(start), b.min(end), perms.starts_with("rw-")))
        .collect())
}

/// One line of /proc/self/maps: start, end and permissions.
fn maps_line(line: &str) -> Option<(usize, usize, &str)> {
    let mut f = line.split_whitespace();
    let (a, b) = f.next()?.split_once('-')?;
    Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?, f.next()?))
}

/// Blocks every asynchronous signal on the calling thread (pager threads call it first):
/// a program's signal handler must never run on a pager thread (it may take a lock of the
/// program's or expect its own thread), and a signal must never interrupt a pager thread
/// mid-ioctl. Synchronous signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS) stay
/// open: blocking them would not stop them and would hide a crash. glibc keeps its own
/// internal signals open whatever we ask.
pub(crate) fn block_signals() {
    // SAFETY: sigset_t is plain data; the calls fill and apply a set on our stack to the
    // calling thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS] {
            libc::sigdelset(&mut set, sig);
        }
        // Cannot fail with a valid `how` and set.
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Gives the calling background thread (`what`: reclaim, writeback) nice value `nice`, and
/// SCHED_IDLE when `idle`; a refusal is said once and costs only the priority.
pub(crate) fn lower_priority(nice: i32, idle: bool, what: &str) {
    if idle {
        if let Err(e) = set_thread_sched_idle() {
            eprintln!("tierswap: the {what} thread keeps its policy (SCHED_IDLE refused: {e})");
        }
    }
    if nice != 0 {
        if let Err(e) = set_thread_nice(nice) {
            eprintln!("tierswap: the {what} thread keeps its priority (nice {nice} refused: {e})");
        }
    }
}

/// Pins the calling thread, fault thread or reclaim helper (`what`) `index`, to the
/// `index`-th CPU this process may run on (wrapping), so that a fault on any CPU finds one
/// of each on that CPU (`PagerConfig::fault_pin`). A failure costs only speed: the thread
/// stays unpinned and says so once.
pub(crate) fn pin_to_cpu(index: usize, what: &str) {
    let pinned = allowed_cpus().and_then(|cpus| match cpus.get(index % cpus.len().max(1)) {
        Some(&cpu) => pin_thread(cpu),
        None => Err(std::io::Error::from_raw_os_error(libc::ESRCH)),
    });
    if let Err(e) = pinned {
        eprintln!("tierswap: {what} {index} stays unpinned: cannot set its CPU affinity: {e}");
    }
}

/// The pager cannot serve faults any more: the program would hang. Say so and abort.
pub(crate) fn fatal(msg: &str) -> ! {
    eprintln!("tierswap: {msg}; the program's memory can no longer be served, aborting");
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn vma_of_names_the_mapping_that_holds_an_address() {
        assert_eq!(std::mem::size_of::<ProcmapQuery>(), 104, "the uapi struct's size");
        let len = 16 * 4096;
        let addr = mmap_reserve(len).expect("mmap");
        // Guard pages on both sides: the kernel may not merge them with the mapping.
        // SAFETY: our fresh mapping; PROT_NONE on its first and last page.
        unsafe {
            libc::mprotect(addr as *mut libc::c_void, 4096, libc::PROT_NONE);
            libc::mprotect((addr + len - 4096) as *mut libc::c_void, 4096, libc::PROT_NONE);
        }
        let (a, b) = (addr + 4096, addr + len - 4096);
        assert_eq!(vma_of(a), Some((a, b)));
        assert_eq!(vma_of(b - 1), Some((a, b)));
        assert_eq!(vma_of(addr), Some((addr, a)));
        assert_eq!(vma_of(b), Some((b, addr + len)));
        // SAFETY: ours, unused.
        unsafe { munmap(addr, len) }.expect("munmap");
        assert_eq!(vma_of(a), None, "nothing maps it any more");
    }

    #[test]
    fn reserve_touch_release() {
        let len = 1 << 20;
        let addr = mmap_reserve(len).expect("mmap");
        // SAFETY: freshly mapped, len bytes, ours.
        let s = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
        s[4096] = 7;
        assert_eq!(s[4096], 7);
        // SAFETY: ours; we accept the zeros.
        unsafe { madvise(addr, len, libc::MADV_DONTNEED) }.expect("madvise");
        assert_eq!(s[4096], 0);
        // SAFETY: ours, the slice is not used again.
        unsafe { munmap(addr, len) }.expect("munmap");
    }

    #[test]
    fn process_madvise_drops_every_range_and_nothing_between() {
        let len = 8 * 4096;
        let addr = mmap_reserve(len).expect("mmap");
        // SAFETY: freshly mapped, len bytes, ours.
        let s = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
        for (p, chunk) in s.chunks_mut(4096).enumerate() {
            chunk.fill(p as u8 + 1);
        }
        let pidfd = pidfd_self().expect("pidfd_open");
        // Pages 1 and 4..6 dropped; 0, 2, 3, 6 and 7 kept.
        let ranges = [
            libc::iovec { iov_base: (addr + 4096) as *mut libc::c_void, iov_len: 4096 },
            libc::iovec { iov_base: (addr + 4 * 4096) as *mut libc::c_void, iov_len: 2 * 4096 },
        ];
        // SAFETY: ours; we accept the zeros in the two ranges.
        let done = unsafe { process_madvise(pidfd.as_fd(), &ranges, libc::MADV_DONTNEED) }.expect("process_madvise");
        assert_eq!(done, 3 * 4096);
        for (p, chunk) in s.chunks(4096).enumerate() {
            let want = if p == 1 || p == 4 || p == 5 { 0 } else { p as u8 + 1 };
            assert!(chunk.iter().all(|&b| b == want), "page {p} should read {want}");
        }
        // SAFETY: ours, the slice is not used again.
        unsafe { munmap(addr, len) }.expect("munmap");
    }

    #[test]
    fn a_pinned_thread_runs_only_on_its_cpu() {
        let cpus = allowed_cpus().expect("sched_getaffinity");
        // A cpuset or taskset may leave fewer CPUs than are online, never more.
        assert!(!cpus.is_empty() && cpus.len() <= online_cpus(), "{cpus:?}");
        let last = *cpus.last().unwrap();
        let (on, after) = std::thread::spawn(move || {
            pin_thread(last).expect("sched_setaffinity");
            // SAFETY: sched_getcpu has no preconditions.
            let on = unsafe { libc::sched_getcpu() };
            (on, allowed_cpus().expect("sched_getaffinity"))
        })
        .join()
        .unwrap();
        assert_eq!((on as usize, after), (last, vec![last]));
        // The spawning thread keeps its own set.
        assert_eq!(allowed_cpus().unwrap(), cpus);
        assert!(pin_thread(1 << 20).is_err());
    }

    #[test]
    fn a_pinned_threads_stat_names_its_cpu() {
        // A command with spaces and parentheses, as a program may name its threads.
        assert_eq!(stat_cpu(&format!("7 (a) b (c) S{} 3 0 0", " 1".repeat(35))), Some(3));
        assert_eq!(stat_cpu("7 (short) S 1 2"), None);
        let last = *allowed_cpus().expect("sched_getaffinity").last().unwrap();
        let seen = std::thread::spawn(move || {
            pin_thread(last).expect("sched_setaffinity");
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).expect("stat");
            (stat_cpu(&stat), current_cpu())
        })
        .join()
        .unwrap();
        assert_eq!(seen, (Some(last), Some(last)));
    }

    #[test]
    fn an_eventfd_rung_is_readable_until_drained() {
        let fd = eventfd().expect("eventfd");
        let fds = [fd.as_raw_fd()];
        assert_eq!(crate::uffd::poll_fds(&fds, 0).unwrap(), 0);
        eventfd_ring(fd.as_fd());
        eventfd_ring(fd.as_fd());
        assert_eq!(crate::uffd::poll_fds(&fds, 0).unwrap(), 1);
        eventfd_drain(fd.as_fd());
        assert_eq!(crate::uffd::poll_fds(&fds, 0).unwrap(), 0, "one drain takes every ring");
        eventfd_drain(fd.as_fd());
    }

    #[test]
    fn a_thread_moved_to_sched_idle_is_there_and_the_others_are_not() {
        let policy = std::thread::spawn(|| {
            set_thread_sched_idle().expect("sched_setscheduler");
            // SAFETY: sched_getscheduler on the calling thread, no pointers.
            unsafe { libc::sched_getscheduler(0) }
        })
        .join()
        .unwrap();
        assert_eq!(policy, libc::SCHED_IDLE);
        // SAFETY: as above.
        assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);
    }
}
