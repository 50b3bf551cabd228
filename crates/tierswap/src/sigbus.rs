//! Signal mode ([`FaultMode::Signal`]): the faulting thread serves its own fault.
//!
//! A pager in signal mode opens its program userfaultfd with UFFD_FEATURE_SIGBUS, so a
//! fault on a page it does not map raises SIGBUS (`BUS_ADRERR`) in the faulting thread
//! instead of queueing a message for a fault thread. The handler installed here finds the
//! pager owning the address and runs the same fault path a fault thread runs
//! (`fault::signal::serve_in_thread`), in the faulting thread, on its stack; when the
//! handler returns, the access is retried and finds its page. There is no hand-off between
//! CPUs, which costs ~80 µs a fault on a VM whose idle vCPU halts (docs/design.md, Fault hand-off and wake-ups).
//!
//! What is not ours goes to the handler that was there before: other `si_code`s (a
//! poisoned page's `BUS_MCEERR_AR`, which is how a page that cannot be read back reaches
//! the program in both modes) and addresses no signal-mode pager knows (a file mapping
//! past its end). With the default action in place the retried access then ends the
//! process with SIGBUS, as it would have without tierswap.
//!
//! The handler runs with every asynchronous signal blocked, so no handler of the program
//! runs on top of it while it holds a page's lock, and with SIGBUS itself open, so a bug
//! that faults in it ends the process at once instead of deadlocking.
//!
//! A program that installs its own SIGBUS handler after the pager must call
//! [`serve`] first (or chain to the previous handler) for signals it does not expect.
//! Under `tierswap run` it need not: the shim interposes `sigaction` and `signal`, and a
//! SIGBUS action the program sets through them becomes [`program_sigaction`]'s: ours stays
//! installed and passes what is not ours to the program's handler (redis, the JVM and Go's
//! runtime install one at start; each replaced ours and died at its first fault).

use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

use crate::fault::signal::{serve_in_thread, SignalServer};

/// Most pagers in signal mode at once in one process.
pub const MAX_PAGERS: usize = 32;

/// One registered pager: its signal server (owned by the table), how many handlers are
/// looking at it right now (unregistering waits for them), and the process it serves.
struct Entry {
    shared: AtomicPtr<SignalServer>,
    users: AtomicUsize,
    /// The pid that registered it. A forked child inherits the table but not the pager's
    /// threads, and its pager's userfaultfd installs pages in the *parent*: the child's
    /// handler does not serve those entries itself, it asks the parent's pager (events/fork.rs).
    pid: AtomicI32,
    /// In a forked child: its link to the parent's pager (pid << 32 | socket; another
    /// pid's is an ancestor's, inherited).
    link: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Entry = Entry {
    shared: AtomicPtr::new(ptr::null_mut()),
    users: AtomicUsize::new(0),
    pid: AtomicI32::new(0),
    link: AtomicU64::new(0),
};
static PAGERS: [Entry; MAX_PAGERS] = [EMPTY; MAX_PAGERS];

static INSTALL: Once = Once::new();
/// The SIGBUS action before ours: signals that are not ours go there. Set once at install;
/// then changed only by [`program_sigaction`] (the program's own action, as it set it).
static PREVIOUS: ProgramAction = ProgramAction::new();
/// Whether the kernel's SIGBUS action is ours: from install until [`default_action`] puts
/// the default back.
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// libc's `sigaction`, the real one, when a shim interposes the symbol (0: `libc::sigaction`
/// as linked). See [`set_real_sigaction`].
static REAL_SIGACTION: AtomicUsize = AtomicUsize::new(0);

/// The action signals that are not ours go to, read by the handler and written by the
/// program's `sigaction` calls. Two slots and the index of the current one: a writer fills
/// the other slot and then flips the index, so a handler reads a whole action even when it
/// interrupts a write on its own thread. `writing` is the writers' lock: it guards the
/// spare slot. It is taken with a bounded spin, since a program may call `sigaction` from a
/// handler that interrupted its own `sigaction`: then the two writes may interleave, and
/// the action last written wins or is mixed (a program doing that races itself anyway).
struct ProgramAction {
    slots: [std::cell::UnsafeCell<libc::sigaction>; 2],
    current: AtomicUsize,
    writing: AtomicBool,
    set: AtomicBool,
}

// SAFETY: the slots are read and written only as described on the type: a writer writes
// only the slot `current` does not name, under `writing`.
unsafe impl Sync for ProgramAction {}

impl ProgramAction {
    const fn new() -> Self {
        // SAFETY: an all-zero sigaction is a valid value (SIG_DFL, empty mask, no flags).
        let zero = unsafe { std::mem::MaybeUninit::<libc::sigaction>::zeroed().assume_init() };
        ProgramAction {
            slots: [std::cell::UnsafeCell::new(zero), std::cell::UnsafeCell::new(zero)],
            current: AtomicUsize::new(0),
            writing: AtomicBool::new(false),
            set: AtomicBool::new(false),
        }
    }

    fn get(&self) -> Option<libc::sigaction> {
        if !self.set.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: `current` names a slot no writer writes (see the type).
        Some(unsafe { *self.slots[self.current.load(Ordering::Acquire) & 1].get() })
    }

    fn put(&self, a: &libc::sigaction) {
        let mut spins = 0;
        while self.writing.swap(true, Ordering::Acquire) && spins < 10_000 {
            spins += 1;
            std::hint::spin_loop();
        }
        let spare = (self.current.load(Ordering::Acquire) + 1) & 1;
        // SAFETY: the spare slot: no reader loads it until `current` names it below.
        unsafe { *self.slots[spare].get() = *a };
        self.current.store(spare, Ordering::Release);
        self.set.store(true, Ordering::Release);
        self.writing.store(false, Ordering::Release);
    }
}

/// Tells this module where libc's own `sigaction` is, for a shim that interposes the symbol
/// (its interposer would otherwise be the one the handler's installation reaches). `f` is
/// the address of a function of `sigaction(2)`'s type.
pub fn set_real_sigaction(f: usize) {
    REAL_SIGACTION.store(f, Ordering::Relaxed);
}

/// `sigaction(2)` itself, past any interposer.
///
/// # Safety
/// As `libc::sigaction`: `new` and `old` null or valid.
unsafe fn real_sigaction(sig: libc::c_int, new: *const libc::sigaction, old: *mut libc::sigaction) -> libc::c_int {
    let f = REAL_SIGACTION.load(Ordering::Relaxed);
    if f == 0 {
        // SAFETY: the caller's promise.
        return unsafe { libc::sigaction(sig, new, old) };
    }
    // SAFETY: `set_real_sigaction`'s promise: a function of this type.
    let f: unsafe extern "C" fn(libc::c_int, *const libc::sigaction, *mut libc::sigaction) -> libc::c_int =
        unsafe { std::mem::transmute(f) };
    // SAFETY: the caller's promise.
    unsafe { f(sig, new, old) }
}

/// For a shim interposing `sigaction(2)` for SIGBUS: when this module's handler is the
/// kernel's SIGBUS action in this process, the program's action is kept here instead (what
/// is not ours is passed to it) and the call is answered from here: `old` gets the
/// program's previous action (the one before the pager's, until the program set one),
/// `new` becomes its action. Returns false, touching nothing, when the handler is not
/// installed (thread mode, or the default action put back): the caller makes the real call.
pub fn program_sigaction(new: Option<&libc::sigaction>, old: Option<&mut libc::sigaction>) -> bool {
    if !INSTALLED.load(Ordering::Acquire) {
        return false;
    }
    if let Some(old) = old {
        if let Some(prev) = PREVIOUS.get() {
            *old = prev;
        }
    }
    if let Some(new) = new {
        PREVIOUS.put(new);
    }
    true
}

/// Registers `server` for the handler (installing it on first use); returns its place for
/// [`unregister`].
pub(crate) fn register(server: SignalServer) -> std::io::Result<usize> {
    install()?;
    let raw = Box::into_raw(Box::new(server));
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    for (i, e) in PAGERS.iter().enumerate() {
        // The pid is in place before the pointer is: a handler that sees the pointer sees it.
        // (Registrations racing for a free place are of one process: they store one pid.)
        if !e.shared.load(Ordering::SeqCst).is_null() {
            continue;
        }
        e.pid.store(pid, Ordering::SeqCst);
        if e.shared.compare_exchange(ptr::null_mut(), raw, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            return Ok(i);
        }
    }
    // SAFETY: `raw` came from Box::into_raw above and was not stored anywhere.
    drop(unsafe { Box::from_raw(raw) });
    Err(std::io::Error::other(format!(
        "more than {MAX_PAGERS} pagers in signal mode in one process: use fault mode 'thread' for the others"
    )))
}

/// Takes the pager at `place` out of the table, once no handler is looking at it.
pub(crate) fn unregister(place: usize) {
    let e = &PAGERS[place];
    let raw = e.shared.swap(ptr::null_mut(), Ordering::SeqCst);
    // A handler that loaded the pointer before the swap counted itself in `users` first.
    while e.users.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
    if !raw.is_null() {
        // SAFETY: the table owned this server (Box::into_raw in `register`), and no handler
        // can reach it any more.
        drop(unsafe { Box::from_raw(raw) });
    }
}

fn install() -> std::io::Result<()> {
    let mut result = Ok(());
    INSTALL.call_once(|| {
        // SAFETY: sigaction is plain data, zeroed then filled; sigaction(2) installs our
        // handler (of the three-argument type SA_SIGINFO asks for) and returns the previous
        // action into `old`, which we keep for chaining.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_RESTART;
            libc::sigfillset(&mut sa.sa_mask);
            for sig in [libc::SIGBUS, libc::SIGSEGV, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS] {
                libc::sigdelset(&mut sa.sa_mask, sig);
            }
            let mut old: libc::sigaction = std::mem::zeroed();
            if real_sigaction(libc::SIGBUS, &sa, &mut old) != 0 {
                result = Err(std::io::Error::last_os_error());
                return;
            }
            PREVIOUS.put(&old);
            INSTALLED.store(true, Ordering::Release);
            libc::pthread_atfork(Some(before_fork), None, None);
        }
    });
    result?;
    if !INSTALLED.load(Ordering::Acquire) {
        return Err(std::io::Error::other("the SIGBUS handler could not be installed earlier in this process"));
    }
    Ok(())
}

/// How the faulting access touched the page, from the CPU's page-fault error code:
/// `(write, protection)`; protection means the page was present (a write-protect fault).
/// `None` where the error code is not at hand.
///
/// # Safety
/// `ctx` is the `ucontext_t` the kernel passed to a SA_SIGINFO handler.
unsafe fn access_of(ctx: *mut libc::c_void) -> Option<(bool, bool)> {
    #[cfg(target_arch = "x86_64")]
    {
        if ctx.is_null() {
            return None;
        }
        // SAFETY: the caller's contract; REG_ERR holds the page fault's error code
        // (bit 0: the page was present, bit 1: a write).
        let err = unsafe { (*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs[libc::REG_ERR as usize] };
        Some((err & 2 != 0, err & 1 != 0))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ctx;
        None
    }
}

/// Serves a SIGBUS raised by a signal-mode pager's userfaultfd, in the calling thread.
/// Returns false when the signal is not such a fault (the caller passes it on).
///
/// # Safety
/// `info` and `ctx` are the arguments the kernel passed to a SA_SIGINFO handler of
/// SIGBUS, on the thread that took the signal.
pub unsafe fn serve(info: *const libc::siginfo_t, ctx: *mut libc::c_void) -> bool {
    if info.is_null() {
        return false;
    }
    // SAFETY: the caller's contract: a siginfo_t from the kernel.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code != libc::BUS_ADRERR {
        return false;
    }
    // SAFETY: the caller's contract.
    let access = unsafe { access_of(ctx) };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    // Known regions first; then, for each pager, once the events in flight are handled
    // (an mremap's new range), and last as memory it registered but does not track.
    for pass in 0..3 {
        for e in &PAGERS {
            e.users.fetch_add(1, Ordering::SeqCst);
            let raw = e.shared.load(Ordering::SeqCst);
            let raw = if e.pid.load(Ordering::SeqCst) == pid { raw } else { ptr::null_mut() };
            // SAFETY: a non-null pointer in the table is a live strong reference, and
            // `unregister` waits for `users` to drop to zero before releasing it.
            let served = !raw.is_null() && serve_in_thread(unsafe { &*raw }, addr, access, pass);
            e.users.fetch_sub(1, Ordering::SeqCst);
            if served {
                return true;
            }
        }
    }
    // A forked child: the fault is on memory a parent's pager served (the child has no
    // pager threads); that pager serves it through the child's userfaultfd.
    for e in &PAGERS {
        let raw = e.shared.load(Ordering::SeqCst);
        let theirs = e.pid.load(Ordering::SeqCst);
        if raw.is_null() || theirs == pid {
            continue;
        }
        // SAFETY: in a forked child the table and the pagers it points at are the child's
        // copies, which nothing of the child frees; only the link's immutable parts and
        // its own atomics are read (events::fork::ask_parent).
        let shared = unsafe { &(*raw).shared };
        if crate::events::fork::ask_parent(shared, &e.link, addr, access) {
            return true;
        }
    }
    false
}

/// fork's prepare handler: a forked child of a signal-mode pager claims its link before
/// it forks in turn (events::fork::claim_before_fork).
extern "C" fn before_fork() {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    for e in &PAGERS {
        let raw = e.shared.load(Ordering::SeqCst);
        if !raw.is_null() && e.pid.load(Ordering::SeqCst) != pid {
            // SAFETY: as in `serve`: the child's own copy, never freed in the child.
            crate::events::fork::claim_before_fork(unsafe { &(*raw).shared }, &e.link);
        }
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: __errno_location is the calling thread's errno; the interrupted code must
    // find it as it left it.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel's arguments to this SA_SIGINFO handler.
    let ours = unsafe { serve(info, ctx) };
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    if !ours {
        pass_on(sig, info, ctx);
    }
}

/// Hands a signal that is not ours to the program's action (the one before ours, or the one
/// the program set since through [`program_sigaction`]).
fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel's siginfo for this signal.
    let sent = !info.is_null() && unsafe { (*info).si_code } <= 0;
    let Some(prev) = PREVIOUS.get() else { return default_action(sig, sent) };
    let h = prev.sa_sigaction;
    if h == libc::SIG_DFL {
        return default_action(sig, sent);
    }
    if h == libc::SIG_IGN {
        if !sent {
            // Ignoring a synchronous SIGBUS retries the access for ever: end as the kernel would.
            default_action(sig, false)
        }
        return;
    }
    if prev.sa_flags & libc::SA_RESETHAND as libc::c_int != 0 {
        // A one-shot handler: the program's action is the default from now on, as the
        // kernel would have made it.
        // SAFETY: an all-zero sigaction is SIG_DFL with an empty mask.
        PREVIOUS.put(&unsafe { std::mem::zeroed() });
    }
    if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the program's handler was set for SIGBUS with SA_SIGINFO, so it has this
        // type; it gets the kernel's own arguments.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a one-argument handler set for SIGBUS.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

/// Puts the default action back; the retried access then takes it (the process ends with
/// SIGBUS, as it would have without us). A signal that was sent (`kill`, `raise`: no access
/// to retry) is sent again, and the default action takes it at once (SIGBUS is not blocked
/// in this handler).
fn default_action(sig: libc::c_int, sent: bool) {
    INSTALLED.store(false, Ordering::Release);
    // SAFETY: a zeroed sigaction is SIG_DFL with an empty mask; only this signal's action
    // changes. raise(3) is async-signal-safe.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = libc::SIG_DFL;
        real_sigaction(sig, &sa, ptr::null_mut());
        if sent {
            libc::raise(sig);
        }
    }
}
