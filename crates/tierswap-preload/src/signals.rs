//! `sigaction` and `signal` for SIGBUS in signal mode: the program's handler is kept aside,
//! the pager's stays the kernel's.
//!
//! In signal mode the pager serves each fault in a SIGBUS handler. redis (its crash
//! report), the JVM (faults in unsafe accesses) and Go's runtime with cgo install a SIGBUS
//! handler of their own at start; it replaced the pager's, and the next fault on a page
//! that was swapped out reached the program's handler instead: the program ended (redis:
//! exit 135 at startup; java: InternalError). So a SIGBUS action set through these two
//! calls goes to the engine (`tierswap::sigbus::program_sigaction`), which passes every
//! SIGBUS that is not a pager's to it, and answers the program's queries with it. The
//! program's mask and SA_ONSTACK are not applied when its handler runs (it runs inside the
//! pager's, with every asynchronous signal blocked); SA_RESETHAND is.
//!
//! Everything else, and SIGBUS while the pager's handler is not installed (thread mode),
//! is libc's own call. A program that makes the raw system call gets past this, as before.

use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_int, sighandler_t};

/// libc's `sigaction` and `signal` (0: not found yet).
static REAL_SIGACTION: AtomicUsize = AtomicUsize::new(0);
static REAL_SIGNAL: AtomicUsize = AtomicUsize::new(0);

/// Finds libc's own `sigaction` and `signal` and gives the engine the first, so that the
/// pager's handler is installed past this interposer. Called by the constructor, before
/// any pager starts (dlsym may allocate), or by a call that comes before it.
pub(crate) fn find_libc_signals() {
    // SAFETY: dlsym with NUL-terminated names; RTLD_NEXT is the next object after the shim,
    // libc for these symbols.
    let (sa, sig) = unsafe {
        (libc::dlsym(libc::RTLD_NEXT, c"sigaction".as_ptr()), libc::dlsym(libc::RTLD_NEXT, c"signal".as_ptr()))
    };
    REAL_SIGACTION.store(sa as usize, Ordering::Relaxed);
    REAL_SIGNAL.store(sig as usize, Ordering::Relaxed);
    if !sa.is_null() {
        tierswap::sigbus::set_real_sigaction(sa as usize);
    }
}

/// libc's function kept in `slot`, looked up now when a call comes before the constructor
/// (another library's); 0 when libc has none.
fn libc_fn(slot: &AtomicUsize) -> usize {
    let f = slot.load(Ordering::Relaxed);
    if f != 0 {
        return f;
    }
    find_libc_signals();
    slot.load(Ordering::Relaxed)
}

/// sigaction(2).
///
/// # Safety
/// As libc's: `act` and `oldact` null or valid.
#[no_mangle]
pub unsafe extern "C" fn sigaction(sig: c_int, act: *const libc::sigaction, oldact: *mut libc::sigaction) -> c_int {
    if sig == libc::SIGBUS {
        // SAFETY: the caller's pointers, null or valid.
        let (new, old) = unsafe { (act.as_ref(), oldact.as_mut()) };
        if tierswap::sigbus::program_sigaction(new, old) {
            return 0;
        }
    }
    let f = libc_fn(&REAL_SIGACTION);
    if f == 0 {
        crate::raw::set_errno(libc::ENOSYS);
        return -1;
    }
    // SAFETY: libc's sigaction, found by dlsym; the caller's arguments.
    let f: unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int =
        unsafe { std::mem::transmute(f) };
    // SAFETY: as above.
    unsafe { f(sig, act, oldact) }
}

/// signal(3), with glibc's BSD semantics (SA_RESTART, the signal blocked in its handler).
///
/// # Safety
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: sighandler_t) -> sighandler_t {
    if sig == libc::SIGBUS {
        // SAFETY: sigaction is plain data; sigemptyset/sigaddset fill its mask.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = handler;
        new.sa_flags = libc::SA_RESTART;
        // SAFETY: as above.
        unsafe {
            libc::sigemptyset(&mut new.sa_mask);
            libc::sigaddset(&mut new.sa_mask, sig);
        }
        // SAFETY: as above.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        if tierswap::sigbus::program_sigaction(Some(&new), Some(&mut old)) {
            return old.sa_sigaction;
        }
    }
    let f = libc_fn(&REAL_SIGNAL);
    if f == 0 {
        crate::raw::set_errno(libc::ENOSYS);
        return libc::SIG_ERR;
    }
    // SAFETY: libc's signal, found by dlsym; the caller's arguments.
    let f: unsafe extern "C" fn(c_int, sighandler_t) -> sighandler_t = unsafe { std::mem::transmute(f) };
    // SAFETY: as above.
    unsafe { f(sig, handler) }
}
