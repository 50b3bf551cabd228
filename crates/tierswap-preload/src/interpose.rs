//! The exported symbols that take libc's place: the mmap family and the malloc family.
//! Each decides "managed or not" and otherwise does exactly what libc would (raw syscalls
//! for the mmap family, glibc's `__libc_*` allocator for malloc).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use libc::{c_int, c_void, off_t, size_t};

use crate::heap::{self, Owner, SMALL_MAX};
use crate::{commit_in_place, fds, protect, raw, zones};
use crate::{managing_for, MALLOC_ALL, MALLOC_LARGE, MALLOC_MODE, MIN_SIZE, REALLOC_MREMAP};

const PAGE: usize = 4096;
/// malloc's alignment guarantee on x86_64 and aarch64.
const MALLOC_ALIGN: usize = 16;

// ---- the mmap family ------------------------------------------------------------------

/// What the shim makes of an mmap call.
enum MmapKind {
    /// A new managed mapping: anonymous, private, read-write or `PROT_NONE` (a runtime's
    /// reservation, committed later in place), at least the minimum size, an address only
    /// as a hint, no flags beyond MAP_NORESERVE (which means nothing for managed memory).
    Managed,
    /// A fixed anonymous private mapping inside one managed mapping, read-write, read-only
    /// or none: a runtime committing or uncommitting part of its reservation. Done in place
    /// (see [`commit_in_place`]).
    InPlace,
    /// A small one (read-write, below the minimum size, no address): pages of a zone
    /// (see [`zones`]) when there is room.
    Small,
    /// Everything else: the kernel's.
    Kernel,
}

fn mmap_kind(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> MmapKind {
    const ANON: c_int = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    let anon = fd == -1 && off == 0 && len > 0;
    let rest = flags & !libc::MAP_NORESERVE;
    if anon && rest == ANON | libc::MAP_FIXED && matches!(prot, libc::PROT_NONE | libc::PROT_READ | RW) {
        if (addr as usize).is_multiple_of(PAGE) && crate::inside_one_mapping(addr as usize, len) {
            return MmapKind::InPlace;
        }
        return MmapKind::Kernel;
    }
    if anon
        && rest == ANON
        && matches!(prot, libc::PROT_NONE | RW)
        && len >= MIN_SIZE.load(Ordering::Relaxed)
        && managing_for(len)
    {
        return MmapKind::Managed;
    }
    if anon
        && rest == ANON
        && prot == RW
        && addr.is_null()
        && len < MIN_SIZE.load(Ordering::Relaxed)
        && zones::enabled()
        && managing_for(len)
    {
        return MmapKind::Small;
    }
    MmapKind::Kernel
}

const RW: c_int = libc::PROT_READ | libc::PROT_WRITE;

/// A fresh managed mapping for [`MmapKind::Managed`] (at `addr` when that is free), with
/// the protection asked for; None when the pager cannot make one.
fn map_fresh(addr: *mut c_void, len: size_t, prot: c_int) -> Option<*mut c_void> {
    let p = crate::map_managed(len, addr as usize)?;
    // SAFETY: our fresh managed mapping, not handed out yet.
    if prot != RW && unsafe { protect(p, len, prot) } != 0 {
        // SAFETY: as above; the pager follows the unmap (UNMAP event).
        unsafe { raw::munmap(p, len) };
        return None;
    }
    Some(p as *mut c_void)
}

/// mmap(2): see [`MmapKind`].
#[no_mangle]
pub extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    match mmap_kind(addr, len, prot, flags, fd, off) {
        MmapKind::Managed => {
            if let Some(p) = map_fresh(addr, len, prot) {
                return p;
            }
        }
        MmapKind::Small => {
            if let Some(p) = zones::map(len) {
                return p as *mut c_void;
            }
        }
        MmapKind::InPlace if commit_in_place(addr as usize, len, prot) => {
            zones::note_fixed(addr as usize, len);
            return addr;
        }
        _ => {}
    }
    // SAFETY: the program's own mmap call, forwarded unchanged.
    raw::syscall_result(unsafe { raw::mmap(addr as usize, len, prot, flags, fd, off) }) as *mut c_void
}

/// mprotect(2), passed through; the pager is told when it changes managed memory (pages
/// that are not read-write stay out of fault-around and staging, mm/protect.rs).
#[no_mangle]
pub extern "C" fn mprotect(addr: *mut c_void, len: size_t, prot: c_int) -> c_int {
    // SAFETY: the program's own mprotect call, forwarded unchanged.
    raw::syscall_result(unsafe { protect(addr as usize, len, prot) } as isize) as c_int
}

/// mmap64(2): the same as mmap on 64-bit.
#[no_mangle]
pub extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    mmap(addr, len, prot, flags, fd, off)
}

/// munmap(2), passed through: the pager follows through its userfaultfd (UNMAP event).
/// Pages of a zone are given back to it instead (see [`zones`]).
#[no_mangle]
pub extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    if let Some(r) = zones::munmap(addr as usize, len) {
        return raw::syscall_result(r as isize) as c_int;
    }
    // SAFETY: the program's own munmap call, forwarded unchanged.
    raw::syscall_result(unsafe { raw::munmap(addr as usize, len) } as isize) as c_int
}

/// mremap(2), passed through: the pager follows (REMAP event); a zone's mapping is remapped
/// inside the zone or copied out (see [`zones`]). C declares it variadic; the fifth
/// argument is only read by the kernel with MREMAP_FIXED, when the caller passed it.
#[no_mangle]
pub extern "C" fn mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let new_addr = if flags & libc::MREMAP_FIXED != 0 { new_addr as usize } else { 0 };
    if let Some(r) = zones::mremap(old as usize, old_len, new_len, flags, new_addr) {
        return raw::syscall_result(r) as *mut c_void;
    }
    let page = |n: usize| n.div_ceil(4096) * 4096;
    let grows = page(new_len) > page(old_len) && crate::is_managed(old as usize);
    // SAFETY: the program's own mremap call, forwarded unchanged.
    let res = raw::syscall_result(unsafe { raw::mremap(old as usize, old_len, new_len, flags, new_addr) });
    if grows && res as *mut c_void != libc::MAP_FAILED {
        crate::adopt_grown(res as usize + page(old_len), page(new_len) - page(old_len));
    }
    res as *mut c_void
}

/// madvise(2), passed through, except MADV_FREE on managed memory, which becomes
/// MADV_DONTNEED: a lazily freed page stays mapped until the kernel wants it back, so the
/// pager would keep counting it and could not know whether the next read sees old bytes or
/// zeros. DONTNEED is one of the two outcomes MADV_FREE allows, made certain. In a fork
/// child every MADV_FREE is rewritten (the child cannot ask the pager, and the rewrite is
/// always a correct MADV_FREE).
#[no_mangle]
pub extern "C" fn madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    let mut advice = advice;
    if advice == libc::MADV_FREE && len > 0 {
        let a = addr as usize;
        let child = crate::FORKED.load(Ordering::Relaxed);
        if child || crate::is_managed(a) || crate::is_managed(a + len - 1) {
            advice = libc::MADV_DONTNEED;
        }
    }
    // SAFETY: the program's own madvise call (or its MADV_FREE made certain).
    raw::syscall_result(unsafe { raw::madvise(addr as usize, len, advice) } as isize) as c_int
}

// ---- dlopen: no RTLD_DEEPBIND while the malloc family is ours --------------------------

/// The flags bits dlopen passes on: all but RTLD_DEEPBIND while the malloc family is ours
/// (set at start, [`keep_deepbind`]). A library opened with RTLD_DEEPBIND looks its symbols
/// up in its own dependencies first, so its `free` is glibc's while the program's `malloc`
/// is ours: PHP opens its extensions so, and aborted at start ("double free or corruption"
/// in pdo.so's free of a block the PHP binary had allocated). Without the flag the library
/// binds as any other, to the global scope, the shim first; what it loses is only the
/// precedence of its own dependencies' symbols over the program's, which the sanitizers
/// refuse to keep for the same reason.
static DLOPEN_FLAGS_MASK: AtomicU32 = AtomicU32::new(!(libc::RTLD_DEEPBIND as u32));
/// The next dlopen in the search order (glibc's), found at start; 0 before.
static NEXT_DLOPEN: AtomicUsize = AtomicUsize::new(0);

/// Finds the next dlopen (the shim's constructor).
pub(crate) fn find_next_dlopen() {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT skips this library's own.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"dlopen".as_ptr()) };
    NEXT_DLOPEN.store(f as usize, Ordering::Release);
}

/// Lets RTLD_DEEPBIND through (the malloc family is glibc's: `TIERSWAP_MALLOC=off`).
pub(crate) fn keep_deepbind() {
    DLOPEN_FLAGS_MASK.store(!0, Ordering::Relaxed);
}

// dlopen(3) searches the library by the RPATH / RUNPATH of the object that called it,
// which it finds by its return address: a wrapper calling the next dlopen would make that
// this library. So the entry is a naked trampoline that masks the flags and tail-jumps to
// the next dlopen with the stack as the caller left it. Before that is found (a
// constructor running before ours), a plain call does, from here.

/// dlopen(3): see [`DLOPEN_FLAGS_MASK`].
#[cfg(target_arch = "x86_64")]
#[no_mangle]
// SAFETY: the trampoline changes only the flags argument (esi) and rax, a scratch register
// in the C calling convention, and tail-jumps with the stack untouched to the next dlopen,
// which takes the same arguments; without one it jumps to `dlopen_early`, which does too.
#[unsafe(naked)]
pub extern "C" fn dlopen(file: *const libc::c_char, flags: c_int) -> *mut c_void {
    core::arch::naked_asm!(
        "mov rax, qword ptr [rip + {next}]",
        "test rax, rax",
        "jz {early}",
        "and esi, dword ptr [rip + {mask}]",
        "jmp rax",
        next = sym NEXT_DLOPEN,
        mask = sym DLOPEN_FLAGS_MASK,
        early = sym dlopen_early,
    )
}

/// dlopen(3) elsewhere: the library is searched for by the shim's own RPATH (it has none),
/// then the usual paths.
#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
pub extern "C" fn dlopen(file: *const libc::c_char, flags: c_int) -> *mut c_void {
    dlopen_early(file, flags)
}

/// dlopen before the next one is known (or where no trampoline is written): finds it and
/// calls it with the flags masked.
extern "C" fn dlopen_early(file: *const libc::c_char, flags: c_int) -> *mut c_void {
    if NEXT_DLOPEN.load(Ordering::Acquire) == 0 {
        find_next_dlopen();
    }
    let next = NEXT_DLOPEN.load(Ordering::Acquire);
    if next == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: `next` is the address dlsym gave for "dlopen", whose type this is.
    let next: extern "C" fn(*const libc::c_char, c_int) -> *mut c_void = unsafe { std::mem::transmute(next) };
    next(file, flags & DLOPEN_FLAGS_MASK.load(Ordering::Relaxed) as c_int)
}

// ---- opens: the budget as the memory cgroup's limit (see crate::cgroup) ----------------

/// The next definitions of the open family in the search order (another preloaded
/// library's, say fakeroot's or eatmydata's, else glibc's), found by [`find_next_opens`]
/// at start-up; 0 before that, when the kernel's openat and glibc's fopen serve.
static NEXT_OPEN: [AtomicUsize; 6] = [const { AtomicUsize::new(0) }; 6];
const OPEN: usize = 0;
const OPEN64: usize = 1;
const OPENAT: usize = 2;
const OPENAT64: usize = 3;
const FOPEN: usize = 4;
const FOPEN64: usize = 5;

type OpenAtFn = unsafe extern "C" fn(c_int, *const libc::c_char, c_int, libc::mode_t) -> c_int;
type OpenFn = unsafe extern "C" fn(*const libc::c_char, c_int, libc::mode_t) -> c_int;
type FopenFn = unsafe extern "C" fn(*const libc::c_char, *const libc::c_char) -> *mut libc::FILE;

/// Finds the next open family (called once from the shim's constructor: dlsym may
/// allocate and take the loader's lock, which a vfork child or a signal handler must not).
pub(crate) fn find_next_opens() {
    let names = [c"open", c"open64", c"openat", c"openat64", c"fopen", c"fopen64"];
    for (slot, name) in NEXT_OPEN.iter().zip(names) {
        // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT skips this library's own.
        let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
        slot.store(f as usize, Ordering::Release);
    }
}

extern "C" {
    /// glibc's fopen, by its other exported name.
    fn _IO_fopen(path: *const libc::c_char, mode: *const libc::c_char) -> *mut libc::FILE;
}

/// Whether open flags ask only to read an existing file's contents.
fn read_only(flags: c_int) -> bool {
    const NOT_A_READ: c_int = libc::O_CREAT | libc::O_TRUNC | libc::O_TMPFILE | libc::O_PATH | libc::O_DIRECTORY;
    flags & libc::O_ACCMODE == libc::O_RDONLY && flags & NOT_A_READ == 0
}

/// The open family: the shown limit for a read of this process's memory cgroup limit file,
/// else the next open in the search order (`which`, an index of [`NEXT_OPEN`]; `dirfd`
/// is AT_FDCWD for open and open64). `mode` is passed on only with O_CREAT or O_TMPFILE,
/// as libc's variadic open reads it (otherwise the caller passed none and the register
/// holds anything).
fn open_at(which: usize, dirfd: c_int, path: *const libc::c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    if read_only(flags) {
        // SAFETY: the program's path argument, a C string by open's contract.
        if let Some(fd) = unsafe { crate::cgroup::open_limit(path, flags & libc::O_CLOEXEC != 0) } {
            return fd;
        }
    }
    let mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 { mode } else { 0 };
    let next = NEXT_OPEN[which].load(Ordering::Acquire);
    // SAFETY: the program's own open, as it asked, through the function dlsym found under
    // that name (its C prototype, the variadic mode passed as a fixed argument: see below),
    // or the system call itself.
    unsafe {
        match (next, which) {
            (0, _) => libc::syscall(libc::SYS_openat, dirfd, path, flags, mode) as c_int,
            (f, OPEN | OPEN64) => std::mem::transmute::<usize, OpenFn>(f)(path, flags, mode),
            (f, _) => std::mem::transmute::<usize, OpenAtFn>(f)(dirfd, path, flags, mode),
        }
    }
}

// SAFETY (for the four below and the calls above): libc declares them variadic
// (`open(path, flags, ...)`); on the x86_64 and aarch64 Linux ABIs a variadic integer
// argument travels in the register a fixed third (fourth) one would, and `mode` is read
// only when the flags say it was passed.

/// open(2): see [`open_at`].
#[no_mangle]
pub extern "C" fn open(path: *const libc::c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    open_at(OPEN, libc::AT_FDCWD, path, flags, mode)
}

/// open64(2): see [`open_at`].
#[no_mangle]
pub extern "C" fn open64(path: *const libc::c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    open_at(OPEN64, libc::AT_FDCWD, path, flags, mode)
}

/// openat(2): see [`open_at`] (the limit file only by its absolute path).
#[no_mangle]
pub extern "C" fn openat(dirfd: c_int, path: *const libc::c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    open_at(OPENAT, dirfd, path, flags, mode)
}

/// openat64(2): see [`open_at`].
#[no_mangle]
pub extern "C" fn openat64(dirfd: c_int, path: *const libc::c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    open_at(OPENAT64, dirfd, path, flags, mode)
}

/// The fopen family: a stream on the shown limit for a read ("r", no "+") of this
/// process's memory cgroup limit file, else the next fopen in the search order (`which`).
fn fopen_as(which: usize, path: *const libc::c_char, mode: *const libc::c_char) -> *mut libc::FILE {
    // SAFETY: fopen's arguments are C strings by its contract; the stream is made on our
    // own memfd; the next fopen is called with the arguments the program gave.
    unsafe {
        if !mode.is_null() {
            let m = std::ffi::CStr::from_ptr(mode).to_bytes();
            if m.first() == Some(&b'r') && !m.contains(&b'+') {
                if let Some(fd) = crate::cgroup::open_limit(path, m.contains(&b'e')) {
                    let f = libc::fdopen(fd, c"r".as_ptr());
                    if !f.is_null() {
                        return f;
                    }
                    raw::__close(fd);
                }
            }
        }
        match NEXT_OPEN[which].load(Ordering::Acquire) {
            0 => _IO_fopen(path, mode),
            f => std::mem::transmute::<usize, FopenFn>(f)(path, mode),
        }
    }
}

/// fopen(3): see [`fopen_as`].
#[no_mangle]
pub extern "C" fn fopen(path: *const libc::c_char, mode: *const libc::c_char) -> *mut libc::FILE {
    fopen_as(FOPEN, path, mode)
}

/// fopen64(3): see [`fopen_as`].
#[no_mangle]
pub extern "C" fn fopen64(path: *const libc::c_char, mode: *const libc::c_char) -> *mut libc::FILE {
    fopen_as(FOPEN64, path, mode)
}

// ---- descriptors: the pager's stay open (see crate::fds) ----------------------------

/// close(2), except on the pager's own descriptors (success, nothing closed).
#[no_mangle]
pub extern "C" fn close(fd: c_int) -> c_int {
    if fds::guards(fd) {
        fds::REFUSED.fetch_add(1, Ordering::Relaxed);
        return 0;
    }
    // SAFETY: glibc's close, on a descriptor the program gives up.
    unsafe { raw::__close(fd) }
}

/// The raw close_range system call.
fn sys_close_range(first: u32, last: u32, flags: u32) -> c_int {
    // SAFETY: the program's own close_range, on descriptors it gives up.
    raw::syscall_result(unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) } as isize) as c_int
}

/// close_range(2), split around the pager's own descriptors. CLOSE_RANGE_CLOEXEC only
/// marks descriptors close-on-exec, which the pager's are already: passed through whole.
#[no_mangle]
pub extern "C" fn close_range(first: u32, last: u32, flags: c_int) -> c_int {
    let flags = flags as u32;
    if flags & libc::CLOSE_RANGE_CLOEXEC != 0 || first > last {
        return sys_close_range(first, last, flags);
    }
    let (keep, k) = fds::guarded_in(first, last);
    // u64: a kept descriptor + 1 never wraps.
    let mut from = first as u64;
    for &fd in &keep[..k] {
        fds::REFUSED.fetch_add(1, Ordering::Relaxed);
        let fd = fd as u64;
        if fd > from && sys_close_range(from as u32, (fd - 1) as u32, flags) < 0 {
            return -1;
        }
        from = fd + 1;
    }
    if from <= last as u64 {
        return sys_close_range(from as u32, last, flags);
    }
    0
}

/// closefrom(3): close_range from `low` up.
#[no_mangle]
pub extern "C" fn closefrom(low: c_int) {
    let _ = close_range(low.max(0) as u32, u32::MAX, 0);
}

/// dup2(2), refused with EBUSY onto the pager's own descriptors.
#[no_mangle]
pub extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if old != new && fds::guards(new) {
        fds::REFUSED.fetch_add(1, Ordering::Relaxed);
        raw::set_errno(libc::EBUSY);
        return -1;
    }
    // SAFETY: glibc's dup2, as the program asked.
    unsafe { raw::__dup2(old, new) }
}

/// dup3(2), refused with EBUSY onto the pager's own descriptors.
#[no_mangle]
pub extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if old != new && fds::guards(new) {
        fds::REFUSED.fetch_add(1, Ordering::Relaxed);
        raw::set_errno(libc::EBUSY);
        return -1;
    }
    // SAFETY: the program's own dup3, as it asked.
    raw::syscall_result(unsafe { libc::syscall(libc::SYS_dup3, old, new, flags) } as isize) as c_int
}

// ---- the malloc family ----------------------------------------------------------------

/// Allocates `n` bytes aligned to `align` (a power of two): managed when the shim serves
/// this size, glibc's otherwise (and whenever managed memory cannot be had).
fn alloc(n: usize, align: usize) -> *mut u8 {
    if managing_for(n) {
        let mode = MALLOC_MODE.load(Ordering::Relaxed);
        let min = MIN_SIZE.load(Ordering::Relaxed);
        let ours = match mode {
            MALLOC_ALL if align > PAGE => heap::alloc_large(n, align),
            MALLOC_ALL if n < min.min(SMALL_MAX) => heap::alloc_small(n, align),
            MALLOC_ALL => heap::alloc_large(n, align),
            MALLOC_LARGE if n >= min => heap::alloc_large(n, align),
            _ => None,
        };
        if let Some(p) = ours {
            return p;
        }
    }
    // SAFETY: glibc's allocator, with an alignment it accepts.
    unsafe {
        if align <= MALLOC_ALIGN {
            raw::__libc_malloc(n) as *mut u8
        } else {
            raw::__libc_memalign(align, n) as *mut u8
        }
    }
}

/// Usable bytes of a live allocation, whoever made it.
fn usable_size(p: *mut u8) -> usize {
    match heap::owner(p) {
        Owner::Small(n) | Owner::Large(n, _) => n,
        Owner::Libc => libc_usable_size(p),
    }
}

fn libc_usable_size(p: *mut u8) -> usize {
    let f = crate::LIBC_USABLE_SIZE.load(Ordering::Relaxed);
    if f == 0 {
        return 0;
    }
    // SAFETY: f is glibc's malloc_usable_size, found by dlsym; p is a live glibc block.
    let f: extern "C" fn(*mut c_void) -> size_t = unsafe { std::mem::transmute(f) };
    f(p as *mut c_void)
}

/// Frees whatever `p` is.
fn release(p: *mut u8) {
    if p.is_null() {
        return;
    }
    match heap::owner(p) {
        // SAFETY: the program gives p up; owner() said it is one of ours, of this kind.
        Owner::Small(_) => unsafe { heap::free_small(p) },
        // SAFETY: as above.
        Owner::Large(..) => unsafe { heap::free_large(p) },
        // SAFETY: glibc's block, given up by the program.
        Owner::Libc => unsafe { raw::__libc_free(p as *mut c_void) },
    }
}

// malloc, calloc and realloc want to know who called them: glibc's own allocations stay
// glibc's in signal mode (see `crate::LIBC_TEXT`). Rust has no stable way to read a return
// address, so each entry is a naked trampoline that passes its return address (at [rsp] on
// x86_64, in x30 on aarch64, on entry) as one more argument to the body and jumps there;
// the stack is as the caller left it, so the body runs as if called directly. Elsewhere
// the caller is unknown (0) and every allocation is treated alike.

/// Defines the C entry `$name($args) -> $ret` that jumps to `$body($args, caller)`; `$x86`
/// and `$arm` are the argument registers that take the caller (the one after the last).
macro_rules! entry_with_caller {
    ($(#[$doc:meta])* $name:ident($($a:ident: $t:ty),*) -> $ret:ty => $body:ident, $x86:literal, $arm:literal) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[no_mangle]
        // SAFETY: the trampoline only copies the return address (at [rsp] on entry) into a
        // free argument register and tail-jumps to a body taking exactly one more argument,
        // with the stack untouched.
        #[unsafe(naked)]
        pub extern "C" fn $name($($a: $t),*) -> $ret {
            core::arch::naked_asm!(concat!("mov ", $x86, ", [rsp]"), "jmp {body}", body = sym $body)
        }

        $(#[$doc])*
        #[cfg(target_arch = "aarch64")]
        #[no_mangle]
        // SAFETY: as on x86_64; the return address is in the link register x30 on entry.
        #[unsafe(naked)]
        pub extern "C" fn $name($($a: $t),*) -> $ret {
            core::arch::naked_asm!(concat!("mov ", $arm, ", x30"), "b {body}", body = sym $body)
        }

        $(#[$doc])*
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        #[no_mangle]
        pub extern "C" fn $name($($a: $t),*) -> $ret {
            $body($($a,)* 0)
        }
    };
}

entry_with_caller! {
    /// malloc(3).
    malloc(n: size_t) -> *mut c_void => malloc_from, "rsi", "x1"
}

extern "C" fn malloc_from(n: size_t, caller: usize) -> *mut c_void {
    let _held = crate::hold_start_for(caller);
    if crate::called_from_libc(caller) {
        // SAFETY: glibc's malloc, for glibc's own use.
        return unsafe { raw::__libc_malloc(n) };
    }
    alloc(n, MALLOC_ALIGN) as *mut c_void
}

/// free(3).
#[no_mangle]
pub extern "C" fn free(p: *mut c_void) {
    release(p as *mut u8)
}

entry_with_caller! {
    /// calloc(3). A large allocation of ours is a fresh mapping, already zero: not touched.
    calloc(count: size_t, size: size_t) -> *mut c_void => calloc_from, "rdx", "x2"
}

extern "C" fn calloc_from(count: size_t, size: size_t, caller: usize) -> *mut c_void {
    let Some(n) = count.checked_mul(size) else {
        raw::set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    let _held = crate::hold_start_for(caller);
    if crate::called_from_libc(caller) || !managing_for(n) {
        // SAFETY: glibc's calloc.
        return unsafe { raw::__libc_calloc(count, size) };
    }
    let p = alloc(n, MALLOC_ALIGN);
    if p.is_null() {
        return std::ptr::null_mut();
    }
    match heap::owner(p) {
        Owner::Large(_, true) => {}
        // SAFETY: p has at least n bytes (a reused small or large allocation, or a malloc'd
        // glibc block).
        _ => unsafe { std::ptr::write_bytes(p, 0, n) },
    }
    p as *mut c_void
}

entry_with_caller! {
    /// realloc(3). Ours grow by allocate-copy-free (or mremap with TIERSWAP_REALLOC_MREMAP=1,
    /// once the pager follows REMAP events); glibc's stay glibc's unless they grow into a size
    /// the shim serves (and, in signal mode, glibc's own stay glibc's).
    realloc(p: *mut c_void, n: size_t) -> *mut c_void => realloc_from, "rdx", "x2"
}

extern "C" fn realloc_from(p: *mut c_void, n: size_t, caller: usize) -> *mut c_void {
    let p = p as *mut u8;
    if p.is_null() {
        return malloc_from(n, caller);
    }
    if n == 0 {
        release(p);
        return std::ptr::null_mut();
    }
    let _held = crate::hold_start_for(caller);
    let owner = heap::owner(p);
    let old_usable = match owner {
        Owner::Small(u) | Owner::Large(u, _) if n <= u => return p as *mut c_void,
        Owner::Small(u) | Owner::Large(u, _) => u,
        Owner::Libc => {
            let wants_ours = !crate::called_from_libc(caller)
                && managing_for(n)
                && match MALLOC_MODE.load(Ordering::Relaxed) {
                    MALLOC_ALL => n >= MIN_SIZE.load(Ordering::Relaxed).min(SMALL_MAX),
                    MALLOC_LARGE => n >= MIN_SIZE.load(Ordering::Relaxed),
                    _ => false,
                };
            if !wants_ours {
                // SAFETY: glibc's block, resized by glibc.
                return unsafe { raw::__libc_realloc(p as *mut c_void, n) };
            }
            libc_usable_size(p)
        }
    };
    if let Owner::Large(..) = owner {
        if REALLOC_MREMAP.load(Ordering::Relaxed) == 1 {
            // SAFETY: p is a live large allocation of ours.
            if let Some(q) = unsafe { heap::remap_large(p, n) } {
                return q as *mut c_void;
            }
        }
    }
    let q = alloc(n, MALLOC_ALIGN);
    if q.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: q has n > old_usable bytes; p has old_usable; distinct live blocks.
    unsafe { std::ptr::copy_nonoverlapping(p, q, old_usable.min(n)) };
    release(p);
    q as *mut c_void
}

/// reallocarray(3).
#[no_mangle]
pub extern "C" fn reallocarray(p: *mut c_void, count: size_t, size: size_t) -> *mut c_void {
    match count.checked_mul(size) {
        Some(n) => realloc(p, n),
        None => {
            raw::set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// posix_memalign(3).
///
/// # Safety
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: size_t, n: size_t) -> c_int {
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<*mut c_void>()) {
        return libc::EINVAL;
    }
    let p = alloc(n, align);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller gives a writable out pointer.
    unsafe { *out = p as *mut c_void };
    0
}

/// aligned_alloc(3) (C11; glibc takes any power-of-two alignment).
#[no_mangle]
pub extern "C" fn aligned_alloc(align: size_t, n: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        raw::set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    alloc(n, align.max(MALLOC_ALIGN)) as *mut c_void
}

/// memalign(3) (glibc rounds a non-power-of-two alignment up).
#[no_mangle]
pub extern "C" fn memalign(align: size_t, n: size_t) -> *mut c_void {
    let Some(align) = align.max(MALLOC_ALIGN).checked_next_power_of_two() else {
        raw::set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    alloc(n, align) as *mut c_void
}

/// valloc(3): page-aligned.
#[no_mangle]
pub extern "C" fn valloc(n: size_t) -> *mut c_void {
    alloc(n, PAGE) as *mut c_void
}

/// pvalloc(3): page-aligned, the size rounded up to pages.
#[no_mangle]
pub extern "C" fn pvalloc(n: size_t) -> *mut c_void {
    match n.max(1).checked_next_multiple_of(PAGE) {
        Some(n) => alloc(n, PAGE) as *mut c_void,
        None => {
            raw::set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// malloc_usable_size(3).
#[no_mangle]
pub extern "C" fn malloc_usable_size(p: *mut c_void) -> size_t {
    if p.is_null() {
        return 0;
    }
    usable_size(p as *mut u8)
}
