//! Raw memory calls for the engine's own memory, made as system calls so that an
//! LD_PRELOAD shim interposing libc's `mmap` family never sees (or manages) them.
//!
//! Nothing here decides anything; callers own the mappings they make.

use std::io;

/// Maps `len_bytes` of private anonymous memory, reserved but not committed
/// (MAP_NORESERVE): pages cost memory only once touched. `len_bytes` is rounded up to pages.
pub fn mmap_reserve(len_bytes: usize) -> io::Result<usize> {
    mmap_anon(len_bytes, libc::MAP_NORESERVE)
}

/// Maps `len_bytes` of private anonymous memory with extra `flags`.
pub fn mmap_anon(len_bytes: usize, flags: i32) -> io::Result<usize> {
    let len = crate::page::round_up_pages(len_bytes.max(1));
    // SAFETY: a fresh anonymous mapping at an address the kernel picks; it aliases nothing.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            0usize,
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

/// The number of CPUs this process may run on.
pub fn online_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

/// Whether the page at `addr` (page-aligned, in a mapping of ours) is resident (mincore):
/// false for a hole in anonymous memory.
pub fn is_resident(addr: usize) -> bool {
    let mut vec = 0u8;
    // SAFETY: mincore writes one byte for one page into `vec`; the range is our mapping.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, crate::page::PAGE_SIZE, &mut vec) };
    r == 0 && vec & 1 == 1
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
