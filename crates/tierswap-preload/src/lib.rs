//! `libtierswap_preload.so`: puts an unmodified program's anonymous memory under a tierswap
//! pager. `tierswap run` sets `LD_PRELOAD` and the `TIERSWAP_*` environment and execs the
//! program; this library does the rest from inside it.
//!
//! What is managed:
//! - anonymous private `mmap`s of at least `TIERSWAP_MIN_SIZE` bytes (default 256 KiB: V8
//!   maps its heap a 256 KiB page at a time, python's pymalloc arenas are 1 MiB, jemalloc's
//!   extents 2 MiB and up), read-write or `PROT_NONE`, an address taken as a hint only:
//!   they become [`tierswap::Pager::map_detached_near`] mappings. A `PROT_NONE` one is a
//!   managed runtime's reservation (the JVM's heap, Go's arenas, V8's pages): its commits
//!   (`mmap(MAP_FIXED)` of read-write anonymous memory over part of it, or `mprotect`) are
//!   managed memory at once; a fixed anonymous mapping inside managed memory is done in
//!   place (MADV_DONTNEED + mprotect: the same zero pages, the registration kept), and
//!   every `mprotect` of managed memory is told to the pager (pages that are not read-write
//!   cannot be staged, see `tierswap::mm::protect`).
//! - smaller read-write ones asked for without an address, in thread mode: pages of a
//!   managed zone (see [`zones`]; Ruby's 16 KiB heap pages). Every other mmap (files,
//!   shared, fixed elsewhere, executable, stacks, small with an address or in signal mode)
//!   goes to the kernel untouched.
//! - the malloc family (`TIERSWAP_MALLOC`, default `all`): glibc's malloc uses the brk heap
//!   and an internal mmap the shim cannot see, so the shim serves malloc itself from
//!   managed memory (see [`heap`]). `large` manages only allocations of at least the
//!   minimum size (glibc keeps the rest); `off` leaves malloc to glibc.
//!
//! Read-only opens of the memory cgroup's limit file give the budget (see `cgroup.rs`):
//! runtimes size their heaps for it as they would in a memcg of that limit.
//!
//! `munmap`, `mremap` and `madvise` pass through to the kernel (raw syscalls) and the pager
//! follows them through userfaultfd events (zone pages excepted: they go back to their
//! zone); the one rewrite is MADV_FREE on managed memory, which becomes MADV_DONTNEED: a
//! lazily freed page stays mapped until the kernel feels memory pressure, so the pager
//! would count it as present, and could not tell whether the program's next read should
//! see the old bytes or zeros.
//!
//! Start-up: the pager is created in an `.init_array` constructor, before `main` and
//! before any other library's constructor can allocate much. Why not lazily on the first
//! large allocation: that can happen on any thread, inside any libc lock (stdio, dl), or in
//! a child after fork, and creating a pager starts threads; doing it once, single-threaded,
//! at start also lets a bad configuration fail (or, under `TIERSWAP_STRICT=1`, exit 2)
//! before the program has done anything. Memory allocated before the constructor runs is
//! glibc's and stays glibc's: every free finds out whose a pointer is.
//!
//! The shim's own allocations (the pager's metadata, buffers, threads) go straight to glibc
//! through a `#[global_allocator]` calling `__libc_malloc` & co., so they are never managed.
//! The pager's threads (named `tierswap-…`) get glibc memory even from the interposed
//! malloc (a C library they call may allocate): a pager thread faulting on managed memory
//! could end up waiting for itself.
//!
//! The process tree (`TIERSWAP_TREE`, set by `tierswap run`): every process of the tree
//! that has a pager charges one budget (see [`tierswap::tree`]).
//! - fork: memory managed before the fork is served by the parent's pager through the
//!   userfaultfd fork event. In thread mode the child gets a pager of its own for what it
//!   allocates afterwards, started at its first need (below); the heap's spans are taken
//!   afresh from the child's own arenas, so the child's objects are not put in the
//!   parent's; and the pager takes over, as the parent's server grants it, what the child
//!   reads of the memory it inherited (`Pager::link_to_parent`, `take_over_inherited`). In
//!   signal mode, or outside a tree, the child manages nothing new (everything passes
//!   through).
//! - exec: `LD_PRELOAD` and the environment are inherited, so an exec'd program gets a
//!   pager of its own, with the same settings, in the same tree.
//! - First need: a forked child, and an exec'd program that is not the tree's root, start
//!   their pager when they first ask for a managed-size mapping or allocation, or once they
//!   have allocated [`START_AFTER_BYTES`], or (a forked child) at an allocation
//!   [`START_AFTER_MS`] after the fork; until then everything passes through. A child
//!   that execs or exits at once (a shell's, `system()`'s) then costs nothing: creating a
//!   pager starts threads and opens the swap file, ~2 ms, four times a fork and exec. The
//!   start runs in whatever thread asks first, outside the shim's own locks; it needs
//!   only glibc's malloc and pthread_create.
#![deny(missing_docs)]
// The unit tests build without `interpose`, the module that calls into most of this crate.
#![cfg_attr(test, allow(dead_code))]

mod cgroup;
mod creds;
mod fds;
pub mod heap;
#[cfg(not(test))]
mod interpose;
pub mod raw;
mod signals;
pub mod zones;

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

use tierswap::config::Setting;
use tierswap::{parse_size, Hint, Pager, PagerConfig, Tiers};

/// The shim's life: not started, serving, in a fork child without a pager of its own,
/// passing everything through, or waiting for the first need to start its pager.
pub(crate) const STATE_OFF: u8 = 0;
pub(crate) const STATE_READY: u8 = 1;
pub(crate) const STATE_CHILD: u8 = 2;
pub(crate) const STATE_FAILED: u8 = 3;
pub(crate) const STATE_WAITING: u8 = 4;
pub(crate) static STATE: AtomicU8 = AtomicU8::new(STATE_OFF);
/// This process is a fork child (of a process with the shim): its MADV_FREE calls are
/// rewritten (see `interpose::madvise`), its heap starts afresh with its own pager.
pub(crate) static FORKED: AtomicBool = AtomicBool::new(false);
/// Bytes a waiting process has allocated or mapped since it began to wait.
static WAITING_BYTES: AtomicUsize = AtomicUsize::new(0);
/// A thread is starting the waiting process's pager (the others pass through meanwhile).
static STARTING: AtomicBool = AtomicBool::new(false);
/// A waiting process starts its pager once it has allocated this much (4 MiB): below it, a
/// child that only prepares an exec, or a short helper, never pays for a pager.
pub const START_AFTER_BYTES: usize = 4 << 20;
/// …or, a forked child, at its first allocation this long after the fork (20 ms): a child
/// that has neither exec'd nor exited by then is a worker (a BGSAVE, a prefork server's),
/// and its own pager takes over what it reads of what it inherited. Started at its first
/// need only, a BGSAVE child of redis had read 15 MiB of its parent's data before.
pub const START_AFTER_MS: u64 = 20;
/// CLOCK_MONOTONIC at the fork, in ms (a forked child's).
static FORKED_AT_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How much of malloc the shim serves.
pub(crate) const MALLOC_OFF: u8 = 0;
pub(crate) const MALLOC_LARGE: u8 = 1;
pub(crate) const MALLOC_ALL: u8 = 2;
pub(crate) static MALLOC_MODE: AtomicU8 = AtomicU8::new(MALLOC_ALL);
/// Smallest managed mmap / own-mapping malloc, bytes.
pub(crate) static MIN_SIZE: AtomicUsize = AtomicUsize::new(DEFAULT_MIN_SIZE);
/// Grow large allocations with mremap (1) or by copying (0).
pub(crate) static REALLOC_MREMAP: AtomicU8 = AtomicU8::new(0);
/// glibc's malloc_usable_size (it has no `__libc_` alias), found at start-up.
pub(crate) static LIBC_USABLE_SIZE: AtomicUsize = AtomicUsize::new(0);

/// Default `TIERSWAP_MIN_SIZE`: 256 KiB (V8's heap pages; see the crate comment).
pub const DEFAULT_MIN_SIZE: usize = 256 << 10;

/// The pager serving this process (leaked: it lives as long as the process): the one made
/// at start, or a fork child's own. Null before a pager starts.
static CURRENT: AtomicPtr<Pager> = AtomicPtr::new(std::ptr::null_mut());
/// The configuration pagers of this process start with (a fork child's too).
static CONFIG: OnceLock<PagerConfig> = OnceLock::new();
static SETTINGS: OnceLock<Settings> = OnceLock::new();
/// The pid that created the pager: a fork child must not report the parent's stats.
static OWNER_PID: AtomicUsize = AtomicUsize::new(0);

/// What the environment asked for, beyond the pager's own configuration.
struct Settings {
    log: bool,
    stats_path: Option<String>,
    /// Reads of the memory cgroup's limit give the budget (`TIERSWAP_CGROUP_LIMIT`, on
    /// unless 0; see [`cgroup`]).
    cgroup_limit: bool,
}

/// Whether this thread's allocations are managed now.
#[inline]
pub(crate) fn managing() -> bool {
    STATE.load(Ordering::Acquire) == STATE_READY && raw::thread_may_manage()
}

/// The pager serving this process, if one has started.
fn pager() -> Option<&'static Pager> {
    let p = CURRENT.load(Ordering::Acquire);
    // SAFETY: CURRENT only ever holds a leaked Box<Pager> (start_pager), never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Whether this process's footprint is at most half its budget: the shim's heap keeps freed
/// large mappings for reuse only then ([`heap::free_large`]).
pub(crate) fn well_under_budget() -> bool {
    pager().is_some_and(|p| {
        let (footprint, budget) = p.footprint_and_budget();
        footprint <= budget / 2
    })
}

/// Whether this thread's allocation of `n` bytes is managed, starting a waiting process's
/// pager when this is its first need (see the crate comment), unless the start is held.
#[inline]
pub(crate) fn managing_for(n: usize) -> bool {
    if STATE.load(Ordering::Acquire) == STATE_WAITING && !START_HELD.with(|h| h.get()) {
        start_at_need(n);
    }
    managing()
}

thread_local! {
    /// Set while this thread serves an allocation glibc or the loader asked for.
    static START_HELD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While it lives, an allocation on this thread does not start a waiting pager (`Some`:
/// what to restore; `None`: nothing was held).
pub(crate) struct StartHeld(Option<bool>);

impl Drop for StartHeld {
    fn drop(&mut self) {
        if let Some(was) = self.0 {
            START_HELD.with(|h| h.set(was));
        }
    }
}

/// Holds the start of a waiting pager for an allocation called from glibc's or the
/// loader's code (`caller`, a return address): they may be holding a lock of their own
/// (gettext's, while PostgreSQL's checkpointer formatted a message), and a start takes
/// locks of theirs (an error message's strerror: gettext again; a thread's creation): the
/// process hung in its own lock. The start waits for the program's next allocation.
/// Costs one load on every allocation of a process whose pager is running (or not coming).
#[inline]
pub(crate) fn hold_start_for(caller: usize) -> StartHeld {
    if STATE.load(Ordering::Relaxed) != STATE_WAITING || !in_libc_text(caller) {
        return StartHeld(None);
    }
    StartHeld(Some(START_HELD.with(|h| h.replace(true))))
}

#[cold]
fn start_at_need(n: usize) {
    if !raw::thread_may_manage() {
        return;
    }
    let asked = WAITING_BYTES.fetch_add(n, Ordering::Relaxed).saturating_add(n);
    let worker = || {
        let forked_at = FORKED_AT_MS.load(Ordering::Relaxed);
        forked_at != 0 && tierswap::sys::monotonic_ms().saturating_sub(forked_at) >= START_AFTER_MS
    };
    if n < MIN_SIZE.load(Ordering::Relaxed) && asked < START_AFTER_BYTES && !worker() {
        return;
    }
    start_waiting_pager();
}

/// A process still waiting for its first need (a forked child, an exec'd program of the
/// tree) that is about to give up root starts its pager first: a process not run by root
/// cannot have userfaultfd's fork events (they need CAP_SYS_PTRACE), and a pager made
/// while it is root keeps them after the switch, its threads switched with the program's.
/// A server whose workers drop to a user of their own after the fork (php-fpm, Apache,
/// nginx) thus has its workers managed instead of warned about.
pub(crate) fn before_giving_up_root() {
    // SAFETY: geteuid has no preconditions.
    if STATE.load(Ordering::Acquire) == STATE_WAITING && unsafe { libc::geteuid() } == 0 && raw::thread_may_manage() {
        start_waiting_pager();
    }
}

/// This process's pid as the shim last saw it: set by the constructor and by the fork
/// handler, which a vfork child does not run.
static PROCESS_PID: AtomicUsize = AtomicUsize::new(0);

/// Whether this is a vfork child (it shares its parent's memory until it execs: starting
/// threads or allocating there would be the parent's).
fn in_vfork_child() -> bool {
    PROCESS_PID.load(Ordering::Relaxed) != std::process::id() as usize
}

/// Before a process of a tree switches from root to the effective uid `to`: the tree's
/// ledger, made by `run` as root with mode 0644, becomes `to`'s, so that the processes
/// this one forks or execs as `to` can join it (members already in keep their mapping;
/// root can open it whoever owns it). A launcher like setpriv or capsh switching to a
/// service's user is the tree's root: PostgreSQL's every process, started after it,
/// could not join (EACCES) and kept a budget of its own.
pub(crate) fn before_switching_uid(to: libc::uid_t) {
    // SAFETY: geteuid has no preconditions.
    if to == 0 || unsafe { libc::geteuid() } != 0 || in_vfork_child() {
        return;
    }
    let Some(path) = CONFIG.get().and_then(|c| c.tree.as_deref()) else { return };
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else { return };
    // SAFETY: chown of a NUL-terminated path; -1 keeps the group. A failure leaves the
    // ledger as it was (the new user's processes then keep budgets of their own, and say so).
    unsafe { libc::chown(c_path.as_ptr(), to, libc::gid_t::MAX) };
}

/// A program image that cannot write its tree's ledger starts a ledger of its own beside
/// it, as the root of its descendants' tree (and starts its pager now, as roots do): a
/// launcher that switched to a service's user with the raw system call, past
/// [`before_switching_uid`] (capsh does, through libcap), and exec'd the service, left a
/// ledger of root's that none of the service's processes could join, each keeping a
/// budget of its own. Nested under another program of the tree, such a service's tree
/// gets the whole budget beside it. The old ledger is swept by the next `run`.
fn reroot_unwritable_ledger(cfg: &mut PagerConfig) {
    let Some(path) = cfg.tree.clone() else { return };
    // SAFETY: geteuid has no preconditions. Root writes it whoever owns it: no open needed.
    if unsafe { libc::geteuid() } == 0 {
        return;
    }
    let refused = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied);
    if !refused {
        return;
    }
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else { return };
    // SAFETY: geteuid has no preconditions.
    let own = path.with_file_name(format!("{name}.u{}", unsafe { libc::geteuid() }));
    if tierswap::tree::create(&own, cfg.budget_bytes).is_ok() {
        // The constructor runs before the program's main, on its only thread.
        std::env::set_var("TIERSWAP_TREE", &own);
        cfg.tree = Some(own);
    }
}

/// Starts the pager of a process waiting for its first need (once; see the crate comment).
/// Never in a vfork child, whose memory is its parent's.
fn start_waiting_pager() {
    if in_vfork_child() || STARTING.swap(true, Ordering::AcqRel) {
        return;
    }
    let Some(cfg) = CONFIG.get().cloned() else { return };
    let mut inherited = None;
    if FORKED.load(Ordering::Relaxed) {
        // The inherited spans are the parent's arenas, served by its pager: new objects go
        // to arenas of this process's own pager.
        heap::start_afresh();
        // What it inherited comes over to this process's pager piece by piece, as it
        // takes it in (the parent's server grants it through this link).
        let _inside = raw::InPager::enter();
        inherited = pager().and_then(|parent| parent.link_to_parent());
    }
    match start_pager(cfg) {
        Ok(()) => {
            if let (Some(link), Some(own)) = (inherited, pager()) {
                let _inside = raw::InPager::enter();
                if let Err(e) = own.take_over_inherited(link) {
                    eprintln!(
                        "tierswap: pid {}: {e}; what it inherited stays its parent's to serve",
                        std::process::id()
                    );
                }
            }
            OWNER_PID.store(std::process::id() as usize, Ordering::Relaxed);
            STATE.store(STATE_READY, Ordering::Release);
            if SETTINGS.get().is_some_and(|s| s.log) {
                eprintln!(
                    "tierswap: managing the memory of {} (pid {}) from here on",
                    program_name(),
                    std::process::id()
                );
            }
        }
        Err(e) => refuse(&e),
    }
}

/// The control socket of this process's pager, taken away at exit ([`at_exit`]); a forked
/// child that starts a pager of its own replaces it with its own.
static CONTROL_SOCKET: std::sync::Mutex<Option<tierswap::control::BoundSocket>> = std::sync::Mutex::new(None);

/// Starts a pager and its control socket and makes it this process's ([`CURRENT`]).
fn start_pager(cfg: PagerConfig) -> Result<(), String> {
    // The descriptors the pager and its control socket open are kept open (see fds).
    let fds_before = fds::open_fds();
    let low = fds::hold_low();
    let keep = if cfg.keep_freed_large { cfg.budget_bytes } else { 0 };
    let new = {
        let _inside = raw::InPager::enter();
        Pager::new(cfg).map_err(|e| e.to_string())?
    };
    heap::set_cache_limit(keep);
    CURRENT.store(Box::into_raw(Box::new(new)), Ordering::Release);
    // The control socket serves `tierswap stat PID`; its thread is named `tierswap-control`,
    // so its allocations stay unmanaged like the pager's own. Without it the program still
    // runs managed: say so once. It lives as long as the process; its socket goes at exit.
    let control = {
        let _inside = raw::InPager::enter();
        tierswap::control::ControlServer::start(
            || pager().map(|p| p.stats()).unwrap_or_default(),
            tierswap::control::ControlOptions::default(),
        )
        .map(|server| *CONTROL_SOCKET.lock().unwrap_or_else(|e| e.into_inner()) = Some(server.run_until_exit()))
    };
    match control {
        Ok(()) => {}
        Err(e) => {
            eprintln!("tierswap: no control socket for pid {} (`tierswap stat` cannot see it): {e}", std::process::id())
        }
    }
    fds::protect_new_since(&fds_before, &low);
    drop(low);
    // The pager's threads exist now, and with them glibc's SIGSETXID handler.
    creds::wrap_setxid_handler();
    Ok(())
}

/// A fresh managed mapping of `len_bytes` (at `near` when that is free, 0: anywhere), or
/// `None` (the caller passes through).
pub(crate) fn map_managed(len_bytes: usize, near: usize) -> Option<usize> {
    let pager = pager()?;
    let _inside = raw::InPager::enter();
    match pager.map_detached_near(len_bytes, Hint::Normal, near) {
        Ok(p) => Some(p as usize),
        Err(e) => {
            if SETTINGS.get().is_some_and(|s| s.log) {
                eprintln!("tierswap: cannot map {len_bytes} bytes of managed memory ({e}); this one is unmanaged");
            }
            None
        }
    }
}

/// Hands the pager the tail `[addr, addr + len_bytes)` an mremap added to a managed mapping
/// (the kernel's REMAP event tells the old length only).
pub(crate) fn adopt_grown(addr: usize, len_bytes: usize) {
    let Some(pager) = pager() else { return };
    let _inside = raw::InPager::enter();
    if let Err(e) = pager.adopt_grown(addr, len_bytes) {
        if SETTINGS.get().is_some_and(|s| s.log) {
            eprintln!(
                "tierswap: cannot manage the {len_bytes} bytes an mremap added at {addr:#x} ({e}); they stay unmanaged"
            );
        }
    }
}

/// Tells the pager the program set the protection of `[addr, addr + len_bytes)` to `prot`
/// (nothing in a fork child, whose memory the parent's pager knows as of the fork).
pub(crate) fn note_protection(addr: usize, len_bytes: usize, prot: i32) {
    if !managing() {
        return;
    }
    let _inside = raw::InPager::enter();
    if let Some(p) = pager() {
        p.note_protection(addr, len_bytes, prot);
    }
}

/// A fixed anonymous mapping (`interpose::mmap`) replaces what was there with zero pages
/// under `prot`. Over managed memory that is MADV_DONTNEED (the pager frees the slots
/// through the REMOVE event; the next touch reads zeros) and mprotect, which keeps the
/// range registered: a runtime's commits into its reservation (JVM, Go, V8) become managed
/// memory at once, and its uncommits give everything back. False when either call fails
/// (part of the range not mapped): the caller lets the kernel do it.
pub(crate) fn commit_in_place(addr: usize, len: usize, prot: i32) -> bool {
    let len = len.div_ceil(4096) * 4096;
    // SAFETY: the program asked for the range to be replaced by fresh zero pages.
    if unsafe { raw::madvise(addr, len, libc::MADV_DONTNEED) } != 0 {
        return false;
    }
    // SAFETY: the program asked for this protection of the range.
    unsafe { protect(addr, len, prot) == 0 }
}

/// mprotect(2) with the pager told (mm/protect.rs): before the call when the pages stop
/// being read-write (reclaim must not take a failed move for a bug while the call is under
/// way), after it when they become read-write (fault-around must not reach pages the
/// program cannot touch yet). A failed call leaves read-write pages noted as not, which
/// only keeps them present.
///
/// # Safety
/// As [`raw::mprotect`].
pub(crate) unsafe fn protect(addr: usize, len: usize, prot: i32) -> i32 {
    if len == 0 {
        // SAFETY: the caller's call, unchanged.
        return unsafe { raw::mprotect(addr, len, prot) };
    }
    const RW: i32 = libc::PROT_READ | libc::PROT_WRITE;
    let rw = prot & (RW | libc::PROT_EXEC) == RW;
    if !rw {
        note_protection(addr, len, prot);
    }
    // SAFETY: the caller accepts the new protection.
    let r = unsafe { raw::mprotect(addr, len, prot) };
    if rw && r == 0 {
        note_protection(addr, len, prot);
    }
    r
}

/// Whether `[addr, addr + len_bytes)` lies inside one managed mapping (see [`is_managed`]).
pub(crate) fn inside_one_mapping(addr: usize, len_bytes: usize) -> bool {
    if len_bytes == 0 || !managing() {
        return false;
    }
    let Some(last) = addr.checked_add(len_bytes - 1) else { return false };
    let _inside = raw::InPager::enter();
    pager().is_some_and(|p| match (p.mapping_of(addr), p.mapping_of(last)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    })
}

/// Whether `addr` is in memory this process's pager manages (false in a fork child before
/// its own pager starts: the parent's locks may have been held by a thread that does not
/// exist there; memory inherited from the parent is not the child's pager's).
pub(crate) fn is_managed(addr: usize) -> bool {
    if !managing() {
        return false;
    }
    let _inside = raw::InPager::enter();
    pager().is_some_and(|p| p.mapping_of(addr).is_some())
}

/// The pager's configuration and the shim's settings from the `TIERSWAP_*` environment;
/// `TIERSWAP_SETTINGS` (engine settings, [`tierswap::config::Setting`]) is applied last.
fn config_from_env() -> Result<(PagerConfig, Settings), String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let size = |name: &str| -> Result<Option<u64>, String> {
        var(name).map(|v| parse_size(&v).map_err(|e| format!("{name}={v}: {e}"))).transpose()
    };
    let mut cfg = PagerConfig::default();
    if let Some(b) = size("TIERSWAP_BUDGET")? {
        cfg.budget_bytes = b;
    }
    if let Some(t) = var("TIERSWAP_TIERS") {
        cfg.tiers = t.parse::<Tiers>().map_err(|e| format!("TIERSWAP_TIERS={t}: {e}"))?;
    }
    if let Some(c) = var("TIERSWAP_COMPRESSOR") {
        cfg.compressor = c.parse().map_err(|e| format!("TIERSWAP_COMPRESSOR={c}: {e}"))?;
    }
    cfg.pool_max_bytes = size("TIERSWAP_POOL_MAX")?;
    cfg.swap_dir = var("TIERSWAP_SWAP_DIR").map(Into::into);
    if let Some(n) = var("TIERSWAP_FAULT_THREADS") {
        cfg.fault_threads = n
            .trim()
            .parse()
            .ok()
            .filter(|&t: &usize| t <= 256)
            .ok_or_else(|| format!("TIERSWAP_FAULT_THREADS={n}: give 0 (one per CPU) to 256 threads"))?;
    }
    cfg.fault_pin = match var("TIERSWAP_PIN").as_deref().map(str::trim) {
        None | Some("1") => true,
        Some("0") => false,
        Some(other) => return Err(format!("TIERSWAP_PIN={other}: use 1 (pin fault threads) or 0")),
    };
    cfg.tree = var("TIERSWAP_TREE").map(Into::into);
    if let Some(m) = var("TIERSWAP_FAULT_MODE") {
        cfg.fault_mode = m.parse().map_err(|e| format!("TIERSWAP_FAULT_MODE={m}: {e}"))?;
    }
    // Engine settings last (`tierswap run --set`): one that repeats a variable above wins.
    if let Some(list) = var("TIERSWAP_SETTINGS") {
        for s in Setting::parse_list(&list).map_err(|e| format!("TIERSWAP_SETTINGS={list}: {e}"))? {
            s.apply(&mut cfg);
        }
    }
    cfg.validate().map_err(|e| e.to_string())?;
    if let Some(m) = size("TIERSWAP_MIN_SIZE")? {
        if m == 0 {
            return Err("TIERSWAP_MIN_SIZE=0: give at least 4K".into());
        }
        MIN_SIZE.store(m as usize, Ordering::Relaxed);
    }
    let mode = match var("TIERSWAP_MALLOC").as_deref() {
        None | Some("all") => MALLOC_ALL,
        Some("large") => MALLOC_LARGE,
        Some("off") => MALLOC_OFF,
        Some(other) => return Err(format!("TIERSWAP_MALLOC={other}: use all, large or off")),
    };
    MALLOC_MODE.store(mode, Ordering::Relaxed);
    #[cfg(not(test))]
    if mode == MALLOC_OFF {
        interpose::keep_deepbind();
    }
    REALLOC_MREMAP.store(u8::from(var("TIERSWAP_REALLOC_MREMAP").as_deref() == Some("1")), Ordering::Relaxed);
    let cgroup_limit = match var("TIERSWAP_CGROUP_LIMIT").as_deref().map(str::trim) {
        None | Some("1") => true,
        Some("0") => false,
        Some(other) => {
            return Err(format!("TIERSWAP_CGROUP_LIMIT={other}: use 1 (the budget as the cgroup's limit) or 0"))
        }
    };
    let settings = Settings {
        log: var("TIERSWAP_LOG").is_some_and(|v| v != "0"),
        stats_path: var("TIERSWAP_STATS_ON_EXIT"),
        cgroup_limit,
    };
    Ok((cfg, settings))
}

fn program_name() -> String {
    std::fs::read_to_string("/proc/self/comm").map(|s| s.trim().to_string()).unwrap_or_else(|_| "?".into())
}

/// The constructor: reads the environment and starts the pager, or says why not.
extern "C" fn init() {
    find_libc_usable_size();
    #[cfg(not(test))]
    interpose::find_next_opens();
    #[cfg(not(test))]
    interpose::find_next_dlopen();
    creds::find_next_setuids();
    PROCESS_PID.store(std::process::id() as usize, Ordering::Relaxed);
    signals::find_libc_signals();
    let (cfg, settings) = match config_from_env() {
        Ok(x) => x,
        Err(reason) => return refuse(&reason),
    };
    find_libc_text();
    if cfg.fault_mode == tierswap::FaultMode::Signal {
        LIBC_KEEPS_OWN.store(true, Ordering::Relaxed);
    } else {
        zones::enable();
    }
    // A process that started a pager, then exec'd this program, left a row its pager no
    // longer backs (start_image frees it). The tree's root starts its pager now; an exec'd
    // program of the tree at its first need (see the crate comment).
    let mut cfg = cfg;
    reroot_unwritable_ledger(&mut cfg);
    let waits = cfg.tree.as_deref().is_some_and(|t| tierswap::tree::start_image(t) != Some(std::process::id()));
    let _ = CONFIG.set(cfg.clone());
    let budget = cfg.budget_bytes;
    let summary = (!waits && settings.log).then(|| summary(&cfg));
    if !waits {
        if let Err(e) = start_pager(cfg) {
            return refuse(&e);
        }
    }
    // A program running unmanaged (refused above) reads its real limit.
    if settings.cgroup_limit {
        cgroup::show(budget);
    }
    let _ = SETTINGS.set(settings);
    OWNER_PID.store(std::process::id() as usize, Ordering::Relaxed);
    // SAFETY: the handlers are plain extern "C" fns that only touch the shim's statics.
    unsafe {
        libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
        libc::atexit(at_exit);
    }
    if waits {
        // Said by --log when (if ever) the pager starts: a shell's helpers never need one.
        STATE.store(STATE_WAITING, Ordering::Release);
        return;
    }
    STATE.store(STATE_READY, Ordering::Release);
    if let Some(summary) = summary {
        eprintln!("tierswap: managing the memory of {} (pid {}): {summary}", program_name(), std::process::id());
    }
}

/// The settings --log names when a pager starts.
fn summary(cfg: &PagerConfig) -> String {
    format!(
        "budget {} MiB, tiers {}{}{}, min size {} KiB{}",
        cfg.budget_bytes >> 20,
        if cfg.tiers.zero { "zero," } else { "" },
        if cfg.tiers.pool { "pool" } else { "" },
        if cfg.tiers.file { ",file" } else { "" },
        MIN_SIZE.load(Ordering::Relaxed) >> 10,
        std::env::var("TIERSWAP_SETTINGS")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map_or(String::new(), |v| format!(", settings {v}"))
    )
}

/// Not managing: one warning, then everything passes through.
fn refuse(reason: &str) {
    if strict() {
        refuse_strict(reason);
    }
    eprintln!(
        "tierswap: not managing the memory of {} (pid {}): {reason}; it runs unmanaged (TIERSWAP_STRICT=1 refuses instead)",
        program_name(),
        std::process::id()
    );
    STATE.store(STATE_FAILED, Ordering::Release);
}

/// `TIERSWAP_STRICT=1` (`tierswap run --strict`): exit 2 rather than run unmanaged.
fn strict() -> bool {
    std::env::var("TIERSWAP_STRICT").is_ok_and(|v| v == "1")
}

fn refuse_strict(reason: &str) -> ! {
    eprintln!(
        "tierswap: cannot manage the memory of {} (pid {}): {reason}; TIERSWAP_STRICT=1, so exiting with status 2",
        program_name(),
        std::process::id()
    );
    // SAFETY: _exit ends the process at once; nothing of ours needs flushing.
    unsafe { libc::_exit(2) }
}

/// The executable segment of glibc itself, `[start, end)`, and of the loader (`[2]..[4]`).
/// In both modes an allocation called from there does not start a waiting pager
/// ([`hold_start_for`]). In signal mode ([`LIBC_KEEPS_OWN`]) allocations glibc makes for its own use (a stdio stream's buffer, opendir's
/// dirent buffer, getline's line) are handed to system calls (write(2) of a full or
/// flushed stdout buffer, getdents64), and in signal mode a system call whose buffer is
/// swapped out fails with EFAULT: a program's buffered output was lost at exit when its
/// stdout buffer had been evicted. The malloc family asks who called it and leaves such
/// allocations to glibc, unmanaged (a few KiB per stream). The same for the dynamic
/// loader's allocations (`[2]..[4]`, its executable segment): a thread's DTV, which every
/// thread-local access reads, the pager's SIGBUS handler's included. Managed, it was
/// evicted, and the handler's own thread-local access faulted inside the handler: a JVM's
/// threads each held a fault buffer and waited for another, for ever.
pub(crate) static LIBC_TEXT: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

/// Signal mode: glibc's and the loader's own allocations stay glibc's ([`LIBC_TEXT`]).
static LIBC_KEEPS_OWN: AtomicBool = AtomicBool::new(false);

/// Finds the executable segments of glibc and of the loader for [`LIBC_TEXT`] (a plain walk
/// of the loaded objects; it may allocate: the shim is not serving yet).
fn find_libc_text() {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        _data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the loader hands a valid dl_phdr_info for the duration of the callback;
        // dlpi_name is NUL-terminated (maybe empty), dlpi_phdr has dlpi_phnum entries.
        let info = unsafe { &*info };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: as above.
        let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes();
        let file = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
        let at = if file.starts_with(b"libc.so") {
            0
        } else if file.starts_with(b"ld-linux") {
            2
        } else {
            return 0;
        };
        // SAFETY: as above.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let Some(text) = phdrs.iter().find(|ph| ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_X != 0) else {
            return 0;
        };
        let start = info.dlpi_addr as usize + text.p_vaddr as usize;
        LIBC_TEXT[at].store(start, Ordering::Relaxed);
        LIBC_TEXT[at + 1].store(start + text.p_memsz as usize, Ordering::Relaxed);
        // Both found: done.
        i32::from(LIBC_TEXT[0].load(Ordering::Relaxed) != 0 && LIBC_TEXT[2].load(Ordering::Relaxed) != 0)
    }
    // SAFETY: dl_iterate_phdr calls `visit` once per loaded object, on this thread.
    unsafe { libc::dl_iterate_phdr(Some(visit), std::ptr::null_mut()) };
}

/// Whether `caller` (a return address) is inside glibc or the loader: see [`LIBC_TEXT`].
fn in_libc_text(caller: usize) -> bool {
    let inside = |at: usize| {
        caller >= LIBC_TEXT[at].load(Ordering::Relaxed) && caller < LIBC_TEXT[at + 1].load(Ordering::Relaxed)
    };
    inside(0) || inside(2)
}

/// Whether an allocation for `caller` stays glibc's: glibc's or the loader's own, in
/// signal mode (see [`LIBC_TEXT`]).
pub(crate) fn called_from_libc(caller: usize) -> bool {
    LIBC_KEEPS_OWN.load(Ordering::Relaxed) && in_libc_text(caller)
}

fn find_libc_usable_size() {
    // glibc's own, not the next one in search order: a program linked with another malloc
    // (redis with jemalloc) has that library's malloc_usable_size first, and asking it about
    // a glibc block crashes (a BGSAVE child did). The shim's fallback blocks are glibc's
    // (`__libc_malloc`), so their size must come from glibc too.
    // SAFETY: dlopen/dlsym with NUL-terminated names; RTLD_NOLOAD only looks up libc.so.6,
    // which is loaded in every process this shim runs in. dlsym may allocate: the shim is
    // not serving yet.
    let f = unsafe {
        let libc_handle = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        let f = if libc_handle.is_null() {
            std::ptr::null_mut()
        } else {
            libc::dlsym(libc_handle, c"malloc_usable_size".as_ptr())
        };
        if f.is_null() {
            libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr())
        } else {
            f
        }
    };
    LIBC_USABLE_SIZE.store(f as usize, Ordering::Relaxed);
}

extern "C" fn fork_prepare() {
    if FORKED.load(Ordering::Relaxed) && STATE.load(Ordering::Acquire) == STATE_WAITING {
        // A child without a pager yet: its link to its parent's server stays its own.
        if let Some(parent) = pager() {
            parent.claim_link_before_fork();
        }
    }
    heap::lock_all();
    zones::lock();
}

extern "C" fn fork_parent() {
    zones::unlock();
    heap::unlock_all();
}

extern "C" fn fork_child() {
    // The pager's threads do not exist here. In a tree, in thread mode, the child starts a
    // pager of its own at its first need; otherwise it manages nothing new.
    PROCESS_PID.store(std::process::id() as usize, Ordering::Relaxed);
    FORKED.store(true, Ordering::Relaxed);
    let state = STATE.load(Ordering::Acquire);
    let own = matches!(state, STATE_READY | STATE_WAITING)
        && CONFIG.get().is_some_and(|c| c.tree.is_some() && c.fault_mode == tierswap::FaultMode::Thread);
    WAITING_BYTES.store(0, Ordering::Relaxed);
    FORKED_AT_MS.store(tierswap::sys::monotonic_ms(), Ordering::Relaxed);
    STARTING.store(false, Ordering::Relaxed);
    STATE.store(if own { STATE_WAITING } else { STATE_CHILD }, Ordering::Release);
    zones::unlock();
    zones::forked();
    heap::unlock_all();
}

/// `_exit` and `_Exit`: how a forked worker usually ends (Python's `os._exit`, a prefork
/// server's children, a `fork` without `exec` in C), running no atexit handler, so its
/// pager's control socket is taken away here first; `tierswap stat` would otherwise list it
/// until someone found nobody listening. Then the process ends as libc's would
/// (exit_group). The tree's row goes as for a process killed by a signal: its members free
/// it. Allocation-free and lock-free: a forked child of a threaded program may get here
/// with another thread's locks copied held.
#[no_mangle]
pub extern "C" fn _exit(status: libc::c_int) -> ! {
    end_now(status)
}

/// See [`_exit`].
#[no_mangle]
pub extern "C" fn _Exit(status: libc::c_int) -> ! {
    end_now(status)
}

fn end_now(status: libc::c_int) -> ! {
    let sock = match CONTROL_SOCKET.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    };
    if let Some(sock) = sock.as_ref().and_then(|g| g.as_ref()) {
        // Only the process that bound it removes it (a child holds its parent's name).
        sock.remove();
    }
    drop(sock);
    loop {
        // SAFETY: exit_group ends every thread of the process; it does not return.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}

/// At exit: the stats file (`TIERSWAP_STATS_ON_EXIT`, `%p` becomes the pid) and the log line.
extern "C" fn at_exit() {
    if OWNER_PID.load(Ordering::Relaxed) != std::process::id() as usize || STATE.load(Ordering::Acquire) != STATE_READY
    {
        return;
    }
    let (Some(pager), Some(settings)) = (pager(), SETTINGS.get()) else { return };
    let _inside = raw::InPager::enter();
    let stats = pager.stats();
    // The tree stops counting this process (its memory goes with it).
    pager.leave_tree();
    // `tierswap stat` stops listing it (a process killed by a signal leaves its socket to
    // the next run or `stat` that finds nobody listening).
    if let Some(sock) = CONTROL_SOCKET.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        sock.remove();
    }
    let (arena_bytes, large_live) = heap::usage();
    let mut doc = stats.to_json();
    if let Some(o) = doc.as_object_mut() {
        o.insert(
            "shim".into(),
            serde_json::json!({ "arena_bytes": arena_bytes, "large_allocations_live": large_live,
                "protected_fds": fds::protected(), "fd_calls_refused": fds::REFUSED.load(Ordering::Relaxed),
                "min_size": MIN_SIZE.load(Ordering::Relaxed), "pid": std::process::id() }),
        );
    }
    if let Some(path) = &settings.stats_path {
        let path = path.replace("%p", &std::process::id().to_string());
        if let Err(e) = std::fs::write(&path, doc.to_string()) {
            eprintln!("tierswap: cannot write the stats to {path} (TIERSWAP_STATS_ON_EXIT): {e}");
        }
    }
    if let Some(line) = unmanaged_at_exit(stats.footprint, stats.budget) {
        let strict = strict();
        eprintln!("tierswap: {line}{}", if strict { " (--strict: exit status 2)" } else { "" });
        if strict {
            // SAFETY: fflush(NULL) flushes every stdio stream; _exit ends the process with
            // the status --strict promised (exit() from an atexit handler is undefined).
            unsafe {
                libc::fflush(std::ptr::null_mut());
                libc::_exit(2)
            }
        }
    }
    if settings.log {
        let c = &stats.counters;
        eprintln!(
            "tierswap: pid {} exits: footprint max {} MiB of budget {} MiB; swapped out: {} pool, {} file, {} zero, {} same-filled; faults {}",
            std::process::id(),
            c.footprint_max >> 20,
            stats.budget >> 20,
            c.zswpout,
            c.pswpout,
            c.swpout_zero,
            c.swpout_samefill,
            c.faults
        );
    }
}

/// At exit, the line that says the budget did not hold because most of the process's
/// memory was out of the shim's reach, or None. Resident memory from /proc/self/status:
/// anonymous memory the pager does not hold (`RssAnon` beyond the footprint: memory mapped
/// before the shim started, by raw system calls, under --min-size, thread stacks), shared
/// memory (`RssShmem`: MAP_SHARED, memfd, shm; ZGC's heap) and file pages (`RssFile`, named
/// for the reader, not counted: the kernel reclaims them on its own). Said when what is
/// out of reach is over the budget (and over 64 MiB, so a small program under a tiny
/// budget is not told about its libraries) and more than what is managed.
fn unmanaged_at_exit(footprint: u64, budget: u64) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            << 10
    };
    let (anon, shmem, file) = (kib("RssAnon:"), kib("RssShmem:"), kib("RssFile:"));
    let managed = footprint.min(anon);
    let out = anon - managed + shmem;
    if out <= budget.max(64 << 20) || out <= managed {
        return None;
    }
    let mib = |b: u64| b >> 20;
    Some(format!(
        "{} (pid {}) exits with {} MiB resident that tierswap could not manage ({} MiB anonymous outside the shim's mappings, {} MiB shared memory: MAP_SHARED, memfd, shm), over its budget of {} MiB; managed {} MiB (file pages, the kernel's to reclaim: {} MiB). See `tierswap run --help`, \"Not managed\"",
        program_name(),
        std::process::id(),
        mib(out),
        mib(anon - managed),
        mib(shmem),
        mib(budget),
        mib(managed),
        mib(file)
    ))
}

#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// The shim's own allocator: glibc's, by the names interposition cannot take away.
#[cfg(not(test))]
struct LibcAlloc;

/// glibc's malloc returns 16-byte aligned memory on x86_64 and aarch64.
#[cfg(not(test))]
const LIBC_ALIGN: usize = 16;

#[cfg(not(test))]
// SAFETY: every method forwards to the glibc function with the contract GlobalAlloc asks
// for (alignment honoured through memalign above malloc's own).
unsafe impl std::alloc::GlobalAlloc for LibcAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: plain glibc allocation calls.
        unsafe {
            if layout.align() <= LIBC_ALIGN {
                raw::__libc_malloc(layout.size()) as *mut u8
            } else {
                raw::__libc_memalign(layout.align(), layout.size()) as *mut u8
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        if layout.align() <= LIBC_ALIGN {
            // SAFETY: glibc calloc.
            return unsafe { raw::__libc_calloc(1, layout.size()) as *mut u8 };
        }
        // SAFETY: alloc honours the layout; the memset stays inside it.
        unsafe {
            let p = self.alloc(layout);
            if !p.is_null() {
                std::ptr::write_bytes(p, 0, layout.size());
            }
            p
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        // SAFETY: ptr came from one of glibc's allocators above.
        unsafe { raw::__libc_free(ptr as *mut libc::c_void) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= LIBC_ALIGN {
            // SAFETY: ptr came from __libc_malloc/calloc with malloc's alignment.
            return unsafe { raw::__libc_realloc(ptr as *mut libc::c_void, new_size) as *mut u8 };
        }
        // SAFETY: a fresh block of the new size, the old contents copied, the old freed.
        unsafe {
            let new_layout = std::alloc::Layout::from_size_align_unchecked(new_size, layout.align());
            let q = self.alloc(new_layout);
            if !q.is_null() {
                std::ptr::copy_nonoverlapping(ptr, q, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            q
        }
    }
}

#[cfg(not(test))]
#[global_allocator]
static GLOBAL: LibcAlloc = LibcAlloc;
