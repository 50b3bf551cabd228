//! The shim's floor: raw system calls, glibc's own allocator entry points, a spin lock and
//! the per-thread "may this thread get managed memory?" answer. Nothing here allocates
//! through the interposed malloc, so everything above may call it from inside malloc.

use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicBool, Ordering};

extern "C" {
    /// glibc's close(2) (a cancellation point, like `close`), by its other exported name.
    pub fn __close(fd: libc::c_int) -> libc::c_int;
    /// glibc's dup2(2), by its other exported name.
    pub fn __dup2(old: libc::c_int, new: libc::c_int) -> libc::c_int;
    /// glibc's malloc, under the name interposition cannot take away.
    pub fn __libc_malloc(size: usize) -> *mut libc::c_void;
    /// glibc's free.
    pub fn __libc_free(ptr: *mut libc::c_void);
    /// glibc's calloc.
    pub fn __libc_calloc(n: usize, size: usize) -> *mut libc::c_void;
    /// glibc's realloc.
    pub fn __libc_realloc(ptr: *mut libc::c_void, size: usize) -> *mut libc::c_void;
    /// glibc's memalign.
    pub fn __libc_memalign(align: usize, size: usize) -> *mut libc::c_void;
}

/// `mmap` as the kernel sees it: no libc wrapper, so no interposer (ours or anyone's).
///
/// # Safety
/// As mmap(2): a MAP_FIXED mapping replaces whatever was there.
pub unsafe fn mmap(addr: usize, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> isize {
    // SAFETY: the caller upholds mmap(2)'s contract; the syscall returns -errno on failure.
    kernel_result(unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) })
}

/// `munmap` as the kernel sees it.
///
/// # Safety
/// Nothing may use the range afterwards.
pub unsafe fn munmap(addr: usize, len: usize) -> i32 {
    // SAFETY: the caller gives up the range.
    kernel_result(unsafe { libc::syscall(libc::SYS_munmap, addr, len) }) as i32
}

/// `madvise` as the kernel sees it.
///
/// # Safety
/// Destructive advice (DONTNEED, FREE, REMOVE) throws the range's contents away.
pub unsafe fn madvise(addr: usize, len: usize, advice: i32) -> i32 {
    // SAFETY: the caller accepts the advice's effect on the range.
    kernel_result(unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) }) as i32
}

/// `mprotect` as the kernel sees it.
///
/// # Safety
/// Accesses the new protection forbids fault (SIGSEGV) afterwards.
pub unsafe fn mprotect(addr: usize, len: usize, prot: i32) -> i32 {
    // SAFETY: the caller accepts the new protection of the range.
    kernel_result(unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) }) as i32
}

/// `mremap` as the kernel sees it (`new_addr` only read with MREMAP_FIXED).
///
/// # Safety
/// The old range is gone (or moved) afterwards.
pub unsafe fn mremap(old: usize, old_len: usize, new_len: usize, flags: i32, new_addr: usize) -> isize {
    // SAFETY: the caller gives up the old range.
    kernel_result(unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) })
}

/// The kernel's answer as it gave it: the result, or `-errno`. libc's `syscall()` has
/// already turned a failure into -1 and set errno; taking -1 for `-EPERM` made every
/// failed call the shim passes through report EPERM (a program waiting for EEXIST from
/// MAP_FIXED_NOREPLACE, or ENOMEM from an mremap that cannot grow in place, saw EPERM).
fn kernel_result(r: libc::c_long) -> isize {
    if r == -1 {
        // SAFETY: __errno_location is this thread's errno, always valid.
        -(unsafe { *libc::__errno_location() } as isize)
    } else {
        r as isize
    }
}

/// Turns a raw syscall's `-errno` into libc's convention: errno set, `-1` returned.
pub fn syscall_result(ret: isize) -> isize {
    if (-4095..0).contains(&ret) {
        // SAFETY: __errno_location is this thread's errno, always valid.
        unsafe { *libc::__errno_location() = (-ret) as i32 };
        -1
    } else {
        ret
    }
}

/// Sets this thread's errno.
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location is this thread's errno, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// A lock that spins, then yields: it never allocates and never sleeps in the kernel on a
/// futex someone else must wake, so it is safe inside malloc and around fork. Holders may
/// fault on managed memory (a free-list link swapped out): waiters yield meanwhile.
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through the lock.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    /// A new, unlocked lock.
    pub const fn new(value: T) -> Self {
        SpinLock { locked: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    /// Takes the lock; released when the guard drops.
    pub fn lock(&self) -> SpinGuard<'_, T> {
        self.acquire();
        SpinGuard { lock: self }
    }

    fn acquire(&self) {
        let mut spins = 0u32;
        while self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
    }

    /// Takes the lock without a guard (fork's prepare handler holds it across fork).
    pub fn lock_raw(&self) {
        self.acquire();
    }

    /// Releases a lock taken with [`SpinLock::lock_raw`].
    ///
    /// # Safety
    /// The caller (or, in a fork child, the parent thread that forked) holds the lock.
    pub unsafe fn unlock_raw(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

/// Holds a [`SpinLock`].
pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> std::ops::Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> std::ops::DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock, and is borrowed mutably.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// What this thread is, for the shim: 0 not asked yet, 1 the program's, 2 the pager's.
const KIND_UNKNOWN: u8 = 0;
const KIND_PROGRAM: u8 = 1;
const KIND_PAGER: u8 = 2;

thread_local! {
    static THREAD_KIND: Cell<u8> = const { Cell::new(KIND_UNKNOWN) };
    /// >0 while this thread is inside the pager on the shim's behalf (creating a mapping).
    static IN_PAGER: Cell<u32> = const { Cell::new(0) };
}

/// Whether memory this thread asks for may be managed. No for the pager's own threads
/// (named `tierswap-…`): a fault or reclaim thread touching managed memory could wait for
/// itself. No while this thread is inside the pager. The name is read once per thread
/// (Rust names a thread before running its body, and the pager's threads are Rust's).
pub fn thread_may_manage() -> bool {
    IN_PAGER.with(|d| d.get()) == 0 && !on_pager_thread()
}

/// Whether this thread is one of the pager's (named `tierswap-…`, not the main thread).
/// System calls and a thread-local only: a signal handler may ask.
pub fn on_pager_thread() -> bool {
    THREAD_KIND.with(|k| {
        let mut kind = k.get();
        if kind == KIND_UNKNOWN {
            let mut name = [0u8; 17];
            // SAFETY: PR_GET_NAME writes at most 16 bytes and a NUL into our 17-byte buffer.
            let ret = unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr() as libc::c_ulong, 0, 0, 0) };
            // SAFETY: gettid and getpid have no preconditions.
            let main_thread = unsafe { libc::syscall(libc::SYS_gettid) as i32 == libc::getpid() };
            // The main thread is the program's whatever its name (a program may be called tierswap-…).
            kind = if !main_thread && ret == 0 && name.starts_with(b"tierswap-") { KIND_PAGER } else { KIND_PROGRAM };
            k.set(kind);
        }
        kind == KIND_PAGER
    })
}

/// Marks this thread as inside the pager until the guard drops.
pub struct InPager;

impl InPager {
    /// Enters.
    pub fn enter() -> InPager {
        IN_PAGER.with(|d| d.set(d.get() + 1));
        InPager
    }
}

impl Drop for InPager {
    fn drop(&mut self) {
        IN_PAGER.with(|d| d.set(d.get().saturating_sub(1)));
    }
}
