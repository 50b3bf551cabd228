//! The pager's threads keep the program's credentials when the program changes them one
//! thread at a time.
//!
//! A process's uid, gids and groups belong to each thread in the kernel; glibc makes
//! `setuid` and its kin apply to the whole process by signalling every other thread
//! (SIGSETXID, signal 33) to make the same system call, and aborts the process when one
//! thread's call succeeds and another's fails. Capabilities, the keep-capabilities flag and
//! the securebits are per thread too, and *not* broadcast: `capset` and `prctl` change the
//! calling thread only. So a program that drops privileges the way util-linux's `setpriv`
//! does — `prctl(PR_SET_KEEPCAPS, 1)`, `setresuid`, `capset` to raise its effective set
//! again, `setresgid` — aborted under `run` (SIGABRT from glibc, no message): the pager's
//! threads, which never saw the flag or the raise, lost every capability at the
//! `setresuid`, and their `setresgid` failed where the program's succeeded. Natively such a
//! program is single-threaded, and these threads are ours.
//!
//! So the shim takes `capset` and `prctl`: after a successful change of the calling
//! thread's capabilities or securebits (keep-caps among them) it records that thread's
//! sets and bits; and it puts a handler of its own in front of glibc's SIGSETXID handler,
//! which on a pager thread first applies the recorded bits and sets to itself, then runs
//! glibc's. Every setuid-family call thus finds the pager's threads where the program's
//! thread is, and they succeed or fail together. A program that never calls `capset` or
//! these `prctl`s records nothing and nothing changes. A raw system call gets past this.
//!
//! The uid family (`setuid`, `seteuid`, `setreuid`, `setresuid`) is taken too, for two
//! things before glibc's call: a process still waiting to start its pager starts it while
//! it is root ([`crate::before_giving_up_root`]), and the tree's ledger is given to the
//! new user ([`crate::before_switching_uid`]).
//!
//! Written here (no crate does it): the handler runs in a signal and may only make system
//! calls and read atomics.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use libc::{c_int, c_long, c_ulong, c_void};

/// glibc's SIGSETXID (`__SIGRTMIN + 1`), the signal its setuid family sends other threads.
const SIGSETXID: c_int = 33;
const CAP_VERSION_3: u32 = 0x2008_0522;
/// The keep-capabilities securebit (what `PR_SET_KEEPCAPS` sets).
const SECBIT_KEEP_CAPS: u32 = 1 << 4;

/// The header of capget(2) / capset(2).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: c_int,
}

/// One of capget(2)'s two 32-bit halves.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The program's last recorded credentials: `SEQ` odd while a writer stores them (a seqlock;
/// 0: never recorded), then the securebits and the three 64-bit sets.
static SEQ: AtomicU64 = AtomicU64::new(0);
static WRITER: AtomicU32 = AtomicU32::new(0);
static SECUREBITS: AtomicU32 = AtomicU32::new(0);
static EFFECTIVE: AtomicU64 = AtomicU64::new(0);
static PERMITTED: AtomicU64 = AtomicU64::new(0);
static INHERITABLE: AtomicU64 = AtomicU64::new(0);
/// glibc's SIGSETXID handler (0: ours not installed).
static GLIBC_HANDLER: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Copy, PartialEq, Debug)]
struct Creds {
    securebits: u32,
    effective: u64,
    permitted: u64,
    inheritable: u64,
}

fn raw_capget() -> Option<Creds> {
    let mut hdr = CapHeader { version: CAP_VERSION_3, pid: 0 };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two CapData for version 3 into our array; pid 0 is this thread.
    if unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut CapHeader, data.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: PR_GET_SECUREBITS takes no pointer.
    let bits = unsafe { libc::syscall(libc::SYS_prctl, libc::PR_GET_SECUREBITS, 0, 0, 0, 0) };
    let join = |lo: u32, hi: u32| lo as u64 | (hi as u64) << 32;
    Some(Creds {
        securebits: bits.max(0) as u32,
        effective: join(data[0].effective, data[1].effective),
        permitted: join(data[0].permitted, data[1].permitted),
        inheritable: join(data[0].inheritable, data[1].inheritable),
    })
}

/// Records the calling thread's credentials as the program's. Two program threads changing
/// theirs at once take turns; one that waited very long (a signal handler's prctl
/// interrupting its own thread's record) gives up rather than spin for ever.
fn record() {
    let Some(c) = raw_capget() else { return };
    let mut spins = 0u32;
    while WRITER.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
        spins += 1;
        if spins > 1 << 20 {
            return;
        }
        std::hint::spin_loop();
    }
    SEQ.fetch_add(1, Ordering::AcqRel);
    SECUREBITS.store(c.securebits, Ordering::Relaxed);
    EFFECTIVE.store(c.effective, Ordering::Relaxed);
    PERMITTED.store(c.permitted, Ordering::Relaxed);
    INHERITABLE.store(c.inheritable, Ordering::Relaxed);
    SEQ.fetch_add(1, Ordering::AcqRel);
    WRITER.store(0, Ordering::Release);
}

/// The recorded credentials, if any and not being written.
fn recorded() -> Option<Creds> {
    for _ in 0..64 {
        let s = SEQ.load(Ordering::Acquire);
        if s == 0 {
            return None;
        }
        if s % 2 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let c = Creds {
            securebits: SECUREBITS.load(Ordering::Relaxed),
            effective: EFFECTIVE.load(Ordering::Relaxed),
            permitted: PERMITTED.load(Ordering::Relaxed),
            inheritable: INHERITABLE.load(Ordering::Relaxed),
        };
        std::sync::atomic::fence(Ordering::Acquire);
        if SEQ.load(Ordering::Relaxed) == s {
            return Some(c);
        }
    }
    None
}

/// Makes the calling thread's securebits and capability sets `want`, as far as it may: the
/// bits first (setting them needs CAP_SETPCAP, which the sets may be about to drop; without
/// it the keep-caps bit alone, which needs nothing), then the sets. Failures are left to
/// show in the setuid-family call that follows, as they would in a program's own thread.
fn apply(want: Creds) {
    // SAFETY: prctl with integer arguments only.
    unsafe {
        if libc::syscall(libc::SYS_prctl, libc::PR_GET_SECUREBITS, 0, 0, 0, 0) != want.securebits as c_long
            && libc::syscall(libc::SYS_prctl, libc::PR_SET_SECUREBITS, want.securebits as c_ulong, 0, 0, 0) != 0
        {
            let keep = (want.securebits & SECBIT_KEEP_CAPS != 0) as c_ulong;
            libc::syscall(libc::SYS_prctl, libc::PR_SET_KEEPCAPS, keep, 0, 0, 0);
        }
    }
    let mut hdr = CapHeader { version: CAP_VERSION_3, pid: 0 };
    let half = |v: u64, i: u32| (v >> (32 * i)) as u32;
    let data = [0, 1].map(|i| CapData {
        effective: half(want.effective, i),
        permitted: half(want.permitted, i),
        inheritable: half(want.inheritable, i),
    });
    // SAFETY: capset reads the header and two CapData we own; pid 0 is this thread.
    unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) };
}

/// In front of glibc's SIGSETXID handler: a pager thread takes the program's recorded
/// credentials first.
extern "C" fn on_setxid(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: __errno_location is this thread's errno; kept for the interrupted code.
    let errno = unsafe { *libc::__errno_location() };
    if let Some(want) = recorded() {
        if crate::raw::on_pager_thread() {
            apply(want);
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    let glibc = GLIBC_HANDLER.load(Ordering::Acquire);
    if glibc != 0 {
        // SAFETY: glibc installed this SA_SIGINFO handler for this signal; we call it with
        // the arguments the kernel gave us, as it would have been called.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = unsafe { std::mem::transmute(glibc) };
        f(sig, info, ctx);
    }
}

/// Puts [`on_setxid`] in front of glibc's SIGSETXID handler, once per process image. glibc
/// installs its handler when the first thread is created, so this is called after the
/// pager's threads exist; without a handler of glibc's (none installed, or not SA_SIGINFO)
/// nothing is done. A forked child keeps both.
pub(crate) fn wrap_setxid_handler() {
    if GLIBC_HANDLER.load(Ordering::Acquire) != 0 {
        return;
    }
    // The kernel's struct sigaction for rt_sigaction (not libc's, which has a different layout).
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: c_ulong,
        restorer: usize,
        mask: u64,
    }
    let mut old = KernelSigaction { handler: 0, flags: 0, restorer: 0, mask: 0 };
    // SAFETY: rt_sigaction with a null new action only reads the current one into `old`.
    let got =
        unsafe { libc::syscall(libc::SYS_rt_sigaction, SIGSETXID, std::ptr::null::<KernelSigaction>(), &mut old, 8) };
    if got != 0 || old.handler <= 1 || old.flags & libc::SA_SIGINFO as c_ulong == 0 {
        return;
    }
    GLIBC_HANDLER.store(old.handler, Ordering::Release);
    let ours: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = on_setxid;
    let new = KernelSigaction { handler: ours as usize, ..old };
    // SAFETY: the same flags, restorer and mask as glibc's, with our handler, which calls
    // glibc's; the kernel copies the struct.
    let set =
        unsafe { libc::syscall(libc::SYS_rt_sigaction, SIGSETXID, &new, std::ptr::null_mut::<KernelSigaction>(), 8) };
    if set != 0 {
        GLIBC_HANDLER.store(0, Ordering::Release);
    }
}

/// capset(2): the calling thread's capabilities, recorded when changed.
///
/// # Safety
/// As capset(2): `hdr` and `data` point to the kernel's structures.
#[cfg(not(test))]
#[no_mangle]
pub unsafe extern "C" fn capset(hdr: *mut c_void, data: *const c_void) -> c_int {
    // SAFETY: the caller's pointers, passed to the kernel as they are.
    let ret = unsafe { libc::syscall(libc::SYS_capset, hdr, data) };
    if ret != 0 {
        return -1;
    }
    // SAFETY: capset succeeded, so hdr is a readable header.
    let pid = unsafe { (*(hdr as *const CapHeader)).pid };
    // SAFETY: gettid has no preconditions.
    if pid == 0 || pid == unsafe { libc::syscall(libc::SYS_gettid) } as c_int {
        record();
    }
    0
}

/// prctl(2): passed on unchanged; a change of the calling thread's securebits (keep-caps
/// among them) or ambient capabilities is recorded.
///
/// # Safety
/// As prctl(2): the arguments the option takes.
#[cfg(not(test))]
#[no_mangle]
pub unsafe extern "C" fn prctl(option: c_int, a2: c_ulong, a3: c_ulong, a4: c_ulong, a5: c_ulong) -> c_int {
    // SAFETY: the caller's arguments, passed to the kernel as they are.
    let ret = unsafe { libc::syscall(libc::SYS_prctl, option, a2, a3, a4, a5) };
    if ret >= 0 && matches!(option, libc::PR_SET_KEEPCAPS | libc::PR_SET_SECUREBITS) {
        record();
    }
    ret as c_int
}

/// The next definitions of the uid family (glibc's, which run the call on every thread),
/// found once by [`find_next_setuids`]: setuid, seteuid, setreuid, setresuid.
static NEXT_SETUID: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

/// Finds the next uid family (called once from the shim's constructor: dlsym may allocate).
pub(crate) fn find_next_setuids() {
    for (slot, name) in NEXT_SETUID.iter().zip([c"setuid", c"seteuid", c"setreuid", c"setresuid"]) {
        // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT skips this library's own.
        let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
        slot.store(f as usize, Ordering::Release);
    }
}

/// The uid family: a process waiting to start its pager starts it first while it is root
/// ([`crate::before_giving_up_root`]), then the next definition runs the call. Without one
/// (never seen with glibc) the system call, which changes the calling thread only.
fn set_uids(which: usize, ids: [libc::uid_t; 3]) -> c_int {
    crate::before_giving_up_root();
    let keep = libc::uid_t::MAX;
    // The effective uid the call asks for (keep: unchanged).
    let euid = match which {
        0 | 1 => ids[0],
        _ => ids[1],
    };
    if euid != keep {
        crate::before_switching_uid(euid);
    }
    let next = NEXT_SETUID[which].load(Ordering::Acquire);
    type One = unsafe extern "C" fn(libc::uid_t) -> c_int;
    type Two = unsafe extern "C" fn(libc::uid_t, libc::uid_t) -> c_int;
    type Three = unsafe extern "C" fn(libc::uid_t, libc::uid_t, libc::uid_t) -> c_int;
    // SAFETY: the function dlsym found under that name, called with its C prototype, or
    // the system call itself, with the program's arguments.
    unsafe {
        match (next, which) {
            (0, 0) => libc::syscall(libc::SYS_setuid, ids[0]) as c_int,
            (0, 1) => libc::syscall(libc::SYS_setresuid, keep, ids[0], keep) as c_int,
            (0, 2) => libc::syscall(libc::SYS_setreuid, ids[0], ids[1]) as c_int,
            (0, _) => libc::syscall(libc::SYS_setresuid, ids[0], ids[1], ids[2]) as c_int,
            (f, 0 | 1) => std::mem::transmute::<usize, One>(f)(ids[0]),
            (f, 2) => std::mem::transmute::<usize, Two>(f)(ids[0], ids[1]),
            (f, _) => std::mem::transmute::<usize, Three>(f)(ids[0], ids[1], ids[2]),
        }
    }
}

/// setuid(2).
#[cfg(not(test))]
#[no_mangle]
pub extern "C" fn setuid(uid: libc::uid_t) -> c_int {
    set_uids(0, [uid, 0, 0])
}

/// seteuid(3).
#[cfg(not(test))]
#[no_mangle]
pub extern "C" fn seteuid(euid: libc::uid_t) -> c_int {
    set_uids(1, [euid, 0, 0])
}

/// setreuid(2).
#[cfg(not(test))]
#[no_mangle]
pub extern "C" fn setreuid(ruid: libc::uid_t, euid: libc::uid_t) -> c_int {
    set_uids(2, [ruid, euid, 0])
}

/// setresuid(2).
#[cfg(not(test))]
#[no_mangle]
pub extern "C" fn setresuid(ruid: libc::uid_t, euid: libc::uid_t, suid: libc::uid_t) -> c_int {
    set_uids(3, [ruid, euid, suid])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_credentials_round_trip_through_the_seqlock() {
        assert_eq!(recorded(), None, "nothing recorded before a change");
        record();
        let mine = raw_capget().unwrap();
        assert_eq!(recorded(), Some(mine));
        // Applying what this thread has changes nothing.
        apply(mine);
        assert_eq!(raw_capget(), Some(mine));
    }
}
