//! The userfaultfd calls tierswap uses, as thin safe wrappers. No decisions here: every
//! errno is mapped to a variant that names the situation, and callers decide.
//!
//! The structs and ioctl numbers are declared here because the kernel headers on our
//! machines (6.1) predate UFFDIO_MOVE, UFFDIO_POISON and WP_ASYNC; their layouts are the
//! kernel's uapi (include/uapi/linux/userfaultfd.h), checked by the tests below.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use thiserror::Error;

/// Feature bits of UFFDIO_API.
pub mod features {
    /// Report write-protect faults.
    pub const PAGEFAULT_FLAG_WP: u64 = 1 << 0;
    /// Report fork, with the child's userfaultfd.
    pub const EVENT_FORK: u64 = 1 << 1;
    /// Report mremap.
    pub const EVENT_REMAP: u64 = 1 << 2;
    /// Report MADV_DONTNEED / MADV_REMOVE.
    pub const EVENT_REMOVE: u64 = 1 << 3;
    /// MISSING on hugetlbfs.
    pub const MISSING_HUGETLBFS: u64 = 1 << 4;
    /// MISSING on shmem.
    pub const MISSING_SHMEM: u64 = 1 << 5;
    /// Report munmap.
    pub const EVENT_UNMAP: u64 = 1 << 6;
    /// Deliver SIGBUS instead of a message.
    pub const SIGBUS: u64 = 1 << 7;
    /// Report the faulting thread id.
    pub const THREAD_ID: u64 = 1 << 8;
    /// MINOR on hugetlbfs.
    pub const MINOR_HUGETLBFS: u64 = 1 << 9;
    /// MINOR on shmem.
    pub const MINOR_SHMEM: u64 = 1 << 10;
    /// Report the exact faulting address.
    pub const EXACT_ADDRESS: u64 = 1 << 11;
    /// Write-protect hugetlbfs and shmem.
    pub const WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
    /// Write-protect unpopulated ptes.
    pub const WP_UNPOPULATED: u64 = 1 << 13;
    /// UFFDIO_POISON.
    pub const POISON: u64 = 1 << 14;
    /// Write-protect faults resolved by the kernel (with PAGEMAP_SCAN).
    pub const WP_ASYNC: u64 = 1 << 15;
    /// UFFDIO_MOVE (Linux 6.8).
    pub const MOVE: u64 = 1 << 16;

    /// Names of the bits set in `bits`.
    pub fn names(bits: u64) -> Vec<&'static str> {
        const ALL: [(u64, &str); 17] = [
            (PAGEFAULT_FLAG_WP, "PAGEFAULT_FLAG_WP"),
            (EVENT_FORK, "EVENT_FORK"),
            (EVENT_REMAP, "EVENT_REMAP"),
            (EVENT_REMOVE, "EVENT_REMOVE"),
            (MISSING_HUGETLBFS, "MISSING_HUGETLBFS"),
            (MISSING_SHMEM, "MISSING_SHMEM"),
            (EVENT_UNMAP, "EVENT_UNMAP"),
            (SIGBUS, "SIGBUS"),
            (THREAD_ID, "THREAD_ID"),
            (MINOR_HUGETLBFS, "MINOR_HUGETLBFS"),
            (MINOR_SHMEM, "MINOR_SHMEM"),
            (EXACT_ADDRESS, "EXACT_ADDRESS"),
            (WP_HUGETLBFS_SHMEM, "WP_HUGETLBFS_SHMEM"),
            (WP_UNPOPULATED, "WP_UNPOPULATED"),
            (POISON, "POISON (Linux 6.6)"),
            (WP_ASYNC, "WP_ASYNC (Linux 6.7)"),
            (MOVE, "MOVE (Linux 6.8)"),
        ];
        ALL.iter().filter(|(b, _)| bits & b != 0).map(|&(_, n)| n).collect()
    }
}

/// A userfaultfd error.
#[derive(Debug, Error)]
pub enum Error {
    /// Neither /dev/userfaultfd nor the userfaultfd(2) system call could be used.
    #[error("userfaultfd is not available to this process (/dev/userfaultfd: {dev}; userfaultfd(2): {syscall}): run it as root, or with CAP_SYS_PTRACE, which its fork events need anyway (`tierswap run --user USER` as root keeps it across the switch; systemd: AmbientCapabilities=CAP_SYS_PTRACE); vm.unprivileged_userfaultfd=1 alone is not enough")]
    Unavailable {
        /// Why /dev/userfaultfd failed.
        dev: io::Error,
        /// Why the system call failed.
        syscall: io::Error,
    },
    /// UFFDIO_API failed.
    #[error("UFFDIO_API handshake failed: {0}")]
    Api(io::Error),
    /// UFFDIO_API refused the fork events: the kernel grants them only with CAP_SYS_PTRACE.
    #[error("userfaultfd's fork events need CAP_SYS_PTRACE in a process not run by root: run it as root, or keep that capability across the switch to its user (`tierswap run --user USER`, systemd's AmbientCapabilities=CAP_SYS_PTRACE)")]
    ForkEventsNeedPtrace,
    /// The kernel lacks features we need.
    #[error("this kernel's userfaultfd lacks {}: tierswap needs Linux 6.8 or newer", features::names(*wanted & !*have).join(", "))]
    MissingFeatures {
        /// Features asked for.
        wanted: u64,
        /// Features the kernel has.
        have: u64,
    },
    /// EEXIST: a page is already mapped at the destination.
    #[error("{op}: a page is already there (after {done_bytes} bytes)")]
    PageExist {
        /// The operation.
        op: &'static str,
        /// Bytes done before the error.
        done_bytes: usize,
    },
    /// EAGAIN: an event (REMOVE, UNMAP) is pending or the mm is changing: drain, retry.
    #[error("{op}: try again, an event is pending (after {done_bytes} bytes)")]
    Again {
        /// The operation.
        op: &'static str,
        /// Bytes done before the error.
        done_bytes: usize,
    },
    /// ENOENT: no page at the source (MOVE), or no mapping.
    #[error("{op}: no page at the source (after {done_bytes} bytes)")]
    NoPage {
        /// The operation.
        op: &'static str,
        /// Bytes done before the error.
        done_bytes: usize,
    },
    /// EBUSY: a page is shared (after fork) or pinned and cannot move.
    #[error("{op}: page busy or shared (after {done_bytes} bytes)")]
    Busy {
        /// The operation.
        op: &'static str,
        /// Bytes done before the error.
        done_bytes: usize,
    },
    /// ESRCH: the process's mm is gone.
    #[error("{op}: the process has exited")]
    ProcessGone {
        /// The operation.
        op: &'static str,
    },
    /// EINVAL: a range not registered, unaligned, or across mappings.
    #[error("{op}: invalid range or mode")]
    Invalid {
        /// The operation.
        op: &'static str,
    },
    /// ENOMEM: the kernel could not allocate a page or page table.
    #[error("{op}: out of memory")]
    NoMemory {
        /// The operation.
        op: &'static str,
    },
    /// EFAULT: a bad address in the request.
    #[error("{op}: bad address")]
    BadAddress {
        /// The operation.
        op: &'static str,
    },
    /// Any other errno.
    #[error("{op}: {}", io::Error::from_raw_os_error(*errno))]
    Other {
        /// The operation.
        op: &'static str,
        /// The errno.
        errno: i32,
    },
}

impl Error {
    /// Bytes the operation reported done before it failed (0 for kinds that carry none).
    pub fn done_bytes(&self) -> usize {
        match *self {
            Error::PageExist { done_bytes, .. }
            | Error::Again { done_bytes, .. }
            | Error::NoPage { done_bytes, .. }
            | Error::Busy { done_bytes, .. } => done_bytes,
            _ => 0,
        }
    }
}

/// The userfaultfd `Result`.
pub type Result<T> = std::result::Result<T, Error>;

/// Maps an errno to its variant; `done` is the count the kernel reported (negative values
/// are errnos stored in the count field, not progress, and count as 0).
fn map_errno(op: &'static str, errno: i32, done: i64) -> Error {
    let done_bytes = if done > 0 { done as usize } else { 0 };
    match errno {
        libc::EEXIST => Error::PageExist { op, done_bytes },
        libc::EAGAIN => Error::Again { op, done_bytes },
        libc::ENOENT => Error::NoPage { op, done_bytes },
        libc::EBUSY => Error::Busy { op, done_bytes },
        libc::ESRCH => Error::ProcessGone { op },
        libc::EINVAL => Error::Invalid { op },
        libc::ENOMEM => Error::NoMemory { op },
        libc::EFAULT => Error::BadAddress { op },
        _ => Error::Other { op, errno },
    }
}

// The uapi structs.
#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioPoison {
    range: UffdioRange,
    mode: u64,
    updated: i64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioMove {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}

/// `_IOC(dir, 0xAA, nr, size)` for the userfaultfd ioctls.
const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (0xAA << 8) | nr
}
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;
const IOC_RW: u64 = IOC_READ | IOC_WRITE;

/// UFFDIO_API.
pub const UFFDIO_API: u64 = ioc(IOC_RW, 0x3F, std::mem::size_of::<UffdioApi>());
/// UFFDIO_REGISTER.
pub const UFFDIO_REGISTER: u64 = ioc(IOC_RW, 0x00, std::mem::size_of::<UffdioRegister>());
/// UFFDIO_UNREGISTER.
pub const UFFDIO_UNREGISTER: u64 = ioc(IOC_READ, 0x01, std::mem::size_of::<UffdioRange>());
/// UFFDIO_WAKE.
pub const UFFDIO_WAKE: u64 = ioc(IOC_READ, 0x02, std::mem::size_of::<UffdioRange>());
/// UFFDIO_COPY.
pub const UFFDIO_COPY: u64 = ioc(IOC_RW, 0x03, std::mem::size_of::<UffdioCopy>());
/// UFFDIO_ZEROPAGE.
pub const UFFDIO_ZEROPAGE: u64 = ioc(IOC_RW, 0x04, std::mem::size_of::<UffdioZeropage>());
/// UFFDIO_MOVE.
pub const UFFDIO_MOVE: u64 = ioc(IOC_RW, 0x05, std::mem::size_of::<UffdioMove>());
/// UFFDIO_WRITEPROTECT.
pub const UFFDIO_WRITEPROTECT: u64 = ioc(IOC_RW, 0x06, std::mem::size_of::<UffdioWriteprotect>());
/// UFFDIO_POISON.
pub const UFFDIO_POISON: u64 = ioc(IOC_RW, 0x08, std::mem::size_of::<UffdioPoison>());
/// USERFAULTFD_IOC_NEW on /dev/userfaultfd: `_IO(0xAA, 0x00)`.
pub const USERFAULTFD_IOC_NEW: u64 = ioc(0, 0x00, 0);

const UFFD_API: u64 = 0xAA;
const MODE_DONTWAKE: u64 = 1;
const COPY_MODE_WP: u64 = 2;
const MOVE_MODE_ALLOW_SRC_HOLES: u64 = 2;
const WP_MODE_WP: u64 = 1;
const WP_MODE_DONTWAKE: u64 = 2;

const EVENT_PAGEFAULT: u8 = 0x12;
const EVENT_FORK: u8 = 0x13;
const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;
const PAGEFAULT_FLAG_WRITE: u64 = 1;
const PAGEFAULT_FLAG_WP: u64 = 2;
const PAGEFAULT_FLAG_MINOR: u64 = 4;

/// Bytes of one `struct uffd_msg`.
pub const MSG_BYTES: usize = 32;

/// How to register a range.
#[derive(Clone, Copy, Debug, Default)]
pub struct RegisterMode {
    /// Report faults on missing pages.
    pub missing: bool,
    /// Report writes to write-protected pages.
    pub wp: bool,
    /// Report minor faults (shmem/hugetlbfs).
    pub minor: bool,
}

/// What `poll` found readable.
#[derive(Clone, Copy, Debug, Default)]
pub struct Readiness {
    /// The userfaultfd has messages.
    pub uffd: bool,
    /// The extra fd (a shutdown eventfd) is readable.
    pub extra: bool,
}

/// A message read from the userfaultfd.
#[derive(Debug)]
pub enum Event {
    /// A thread faulted.
    PageFault {
        /// The faulting address (page-aligned unless EXACT_ADDRESS).
        addr: usize,
        /// A write fault.
        write: bool,
        /// A write-protect fault.
        wp: bool,
        /// A minor fault.
        minor: bool,
        /// The faulting thread (with THREAD_ID), else 0.
        tid: u32,
    },
    /// The process forked; the child's memory reports to this new userfaultfd.
    Fork {
        /// The child's userfaultfd.
        uffd: Uffd,
    },
    /// mremap moved a range.
    Remap {
        /// Old start.
        from: usize,
        /// New start.
        to: usize,
        /// Length.
        len: usize,
    },
    /// MADV_DONTNEED / MADV_REMOVE dropped a range.
    Remove {
        /// Start.
        start: usize,
        /// End (exclusive).
        end: usize,
    },
    /// munmap removed a range.
    Unmap {
        /// Start.
        start: usize,
        /// End (exclusive).
        end: usize,
    },
    /// A message type we do not know.
    Unknown(u8),
}

/// Decodes one 32-byte `struct uffd_msg`. `fork_fd` turns a fork's fd into a Uffd.
fn decode(msg: &[u8; MSG_BYTES], features: u64) -> Event {
    let u64_at = |o: usize| u64::from_ne_bytes(msg[o..o + 8].try_into().unwrap_or([0; 8]));
    let u32_at = |o: usize| u32::from_ne_bytes(msg[o..o + 4].try_into().unwrap_or([0; 4]));
    // Layout: event u8, reserved u8, u16, u32, then the 24-byte union at offset 8.
    match msg[0] {
        EVENT_PAGEFAULT => {
            let flags = u64_at(8);
            Event::PageFault {
                addr: u64_at(16) as usize,
                write: flags & PAGEFAULT_FLAG_WRITE != 0,
                wp: flags & PAGEFAULT_FLAG_WP != 0,
                minor: flags & PAGEFAULT_FLAG_MINOR != 0,
                tid: u32_at(24),
            }
        }
        EVENT_FORK => {
            let fd = u32_at(8) as RawFd;
            // SAFETY: the kernel installed this fd in our table for us with the message; we
            // are its only owner.
            Event::Fork { uffd: Uffd { fd: unsafe { OwnedFd::from_raw_fd(fd) }, features } }
        }
        EVENT_REMAP => Event::Remap { from: u64_at(8) as usize, to: u64_at(16) as usize, len: u64_at(24) as usize },
        EVENT_REMOVE => Event::Remove { start: u64_at(8) as usize, end: u64_at(16) as usize },
        EVENT_UNMAP => Event::Unmap { start: u64_at(8) as usize, end: u64_at(16) as usize },
        other => Event::Unknown(other),
    }
}

/// A userfaultfd.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    features: u64,
}

/// What a refused UFFDIO_API means: EPERM when fork events were asked for is the kernel's
/// CAP_SYS_PTRACE check (the only one it makes there).
pub fn api_error(e: io::Error, wanted: u64) -> Error {
    if e.raw_os_error() == Some(libc::EPERM) && wanted & features::EVENT_FORK != 0 {
        Error::ForkEventsNeedPtrace
    } else {
        Error::Api(e)
    }
}

impl AsRawFd for Uffd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Uffd {
    /// Opens a userfaultfd (close-on-exec; non-blocking reads if `nonblock`): through
    /// /dev/userfaultfd, else the system call. No API handshake yet.
    pub fn open(nonblock: bool) -> Result<Uffd> {
        let flags = libc::O_CLOEXEC | if nonblock { libc::O_NONBLOCK } else { 0 };
        let dev = match std::fs::OpenOptions::new().read(true).write(true).open("/dev/userfaultfd") {
            Ok(dev) => {
                // SAFETY: USERFAULTFD_IOC_NEW takes the flags as its argument and returns a
                // new fd that we own.
                let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
                if fd >= 0 {
                    // SAFETY: fd is a new descriptor nobody else owns.
                    return Ok(Uffd { fd: unsafe { OwnedFd::from_raw_fd(fd) }, features: 0 });
                }
                io::Error::last_os_error()
            }
            Err(e) => e,
        };
        // SAFETY: userfaultfd(2) takes flags and returns a new fd we own.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
        if fd >= 0 {
            // SAFETY: a new descriptor nobody else owns.
            return Ok(Uffd { fd: unsafe { OwnedFd::from_raw_fd(fd as RawFd) }, features: 0 });
        }
        Err(Error::Unavailable { dev, syscall: io::Error::last_os_error() })
    }

    /// The features this kernel's userfaultfd offers.
    pub fn supported_features() -> Result<u64> {
        let u = Uffd::open(false)?;
        let mut api = UffdioApi { api: UFFD_API, features: 0, ioctls: 0 };
        // SAFETY: UFFDIO_API reads and writes a UffdioApi we own.
        if unsafe { libc::ioctl(u.fd.as_raw_fd(), UFFDIO_API as _, &mut api) } < 0 {
            return Err(Error::Api(io::Error::last_os_error()));
        }
        Ok(api.features)
    }

    /// Opens a userfaultfd and negotiates exactly `wanted` features.
    pub fn new(wanted: u64, nonblock: bool) -> Result<Uffd> {
        let have = Uffd::supported_features()?;
        if wanted & !have != 0 {
            return Err(Error::MissingFeatures { wanted, have });
        }
        let mut u = Uffd::open(nonblock)?;
        let mut api = UffdioApi { api: UFFD_API, features: wanted, ioctls: 0 };
        // SAFETY: as in supported_features.
        if unsafe { libc::ioctl(u.fd.as_raw_fd(), UFFDIO_API as _, &mut api) } < 0 {
            return Err(api_error(io::Error::last_os_error(), wanted));
        }
        u.features = wanted;
        Ok(u)
    }

    /// The negotiated features.
    pub fn features(&self) -> u64 {
        self.features
    }

    fn ioctl<T>(&self, op: &'static str, req: u64, arg: &mut T, done: impl Fn(&T) -> i64) -> Result<()> {
        // SAFETY: every request number here is paired with the struct type its uapi
        // definition names, which the kernel reads and writes within its size.
        let ret = unsafe { libc::ioctl(self.fd.as_raw_fd(), req as _, arg as *mut T) };
        if ret < 0 {
            let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(map_errno(op, errno, done(arg)));
        }
        Ok(())
    }

    /// Registers `[start, start + len)`; returns the ioctls allowed on it.
    pub fn register(&self, start: usize, len: usize, mode: RegisterMode) -> Result<u64> {
        let mut m = 0;
        if mode.missing {
            m |= 1;
        }
        if mode.wp {
            m |= 2;
        }
        if mode.minor {
            m |= 4;
        }
        let mut r = UffdioRegister { range: UffdioRange { start: start as u64, len: len as u64 }, mode: m, ioctls: 0 };
        self.ioctl("UFFDIO_REGISTER", UFFDIO_REGISTER, &mut r, |_| 0)?;
        Ok(r.ioctls)
    }

    /// Unregisters `[start, start + len)`.
    pub fn unregister(&self, start: usize, len: usize) -> Result<()> {
        let mut r = UffdioRange { start: start as u64, len: len as u64 };
        self.ioctl("UFFDIO_UNREGISTER", UFFDIO_UNREGISTER, &mut r, |_| 0)
    }

    /// Copies `src` into the missing pages at `dst` (UFFDIO_COPY); returns bytes copied.
    /// `src.len()` must be a whole number of pages.
    pub fn copy(&self, dst: usize, src: &[u8], dontwake: bool, wp: bool) -> Result<usize> {
        let mode = if dontwake { MODE_DONTWAKE } else { 0 } | if wp { COPY_MODE_WP } else { 0 };
        let mut c = UffdioCopy { dst: dst as u64, src: src.as_ptr() as u64, len: src.len() as u64, mode, copy: 0 };
        self.ioctl("UFFDIO_COPY", UFFDIO_COPY, &mut c, |c| c.copy)?;
        Ok(c.copy.max(0) as usize)
    }

    /// Maps the zero page at the missing pages `[dst, dst + len)`; returns bytes mapped.
    pub fn zeropage(&self, dst: usize, len: usize, dontwake: bool) -> Result<usize> {
        let mut z = UffdioZeropage {
            range: UffdioRange { start: dst as u64, len: len as u64 },
            mode: if dontwake { MODE_DONTWAKE } else { 0 },
            zeropage: 0,
        };
        self.ioctl("UFFDIO_ZEROPAGE", UFFDIO_ZEROPAGE, &mut z, |z| z.zeropage)?;
        Ok(z.zeropage.max(0) as usize)
    }

    /// Moves the pages at `[src, src + len)` to the missing `[dst, dst + len)`
    /// (UFFDIO_MOVE); returns bytes moved.
    ///
    /// # Safety
    /// The caller owns the contents of both ranges: after the call the bytes that were at
    /// `src` are at `dst` and `src` is empty, which every other user of either range must
    /// expect.
    pub unsafe fn move_pages(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        dontwake: bool,
        allow_src_holes: bool,
    ) -> Result<usize> {
        let mode =
            if dontwake { MODE_DONTWAKE } else { 0 } | if allow_src_holes { MOVE_MODE_ALLOW_SRC_HOLES } else { 0 };
        let mut m = UffdioMove { dst: dst as u64, src: src as u64, len: len as u64, mode, moved: 0 };
        self.ioctl("UFFDIO_MOVE", UFFDIO_MOVE, &mut m, |m| m.moved)?;
        Ok(m.moved.max(0) as usize)
    }

    /// Wakes threads waiting on faults in `[start, start + len)`.
    pub fn wake(&self, start: usize, len: usize) -> Result<()> {
        let mut r = UffdioRange { start: start as u64, len: len as u64 };
        self.ioctl("UFFDIO_WAKE", UFFDIO_WAKE, &mut r, |_| 0)
    }

    /// Sets or clears write protection on `[start, start + len)`.
    pub fn writeprotect(&self, start: usize, len: usize, protect: bool, dontwake: bool) -> Result<()> {
        let mode = if protect { WP_MODE_WP } else { 0 } | if dontwake { WP_MODE_DONTWAKE } else { 0 };
        let mut w = UffdioWriteprotect { range: UffdioRange { start: start as u64, len: len as u64 }, mode };
        self.ioctl("UFFDIO_WRITEPROTECT", UFFDIO_WRITEPROTECT, &mut w, |_| 0)
    }

    /// Marks the missing pages `[start, start + len)` poisoned: touching them raises SIGBUS.
    pub fn poison(&self, start: usize, len: usize, dontwake: bool) -> Result<usize> {
        let mut p = UffdioPoison {
            range: UffdioRange { start: start as u64, len: len as u64 },
            mode: if dontwake { MODE_DONTWAKE } else { 0 },
            updated: 0,
        };
        self.ioctl("UFFDIO_POISON", UFFDIO_POISON, &mut p, |p| p.updated)?;
        Ok(p.updated.max(0) as usize)
    }

    /// Reads up to `max` (≤ 64) messages in one read(2), appending them to `out`. Returns
    /// how many; 0 when none is pending on a non-blocking fd.
    pub fn read_events(&self, out: &mut Vec<Event>, max: usize) -> Result<usize> {
        let mut buf = [[0u8; MSG_BYTES]; 64];
        let max = max.clamp(1, 64);
        // SAFETY: reading at most max * 32 bytes into our stack buffer of 64 * 32 bytes.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, max * MSG_BYTES) };
        if n < 0 {
            let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if errno == libc::EAGAIN || errno == libc::EINTR {
                return Ok(0);
            }
            return Err(map_errno("read", errno, 0));
        }
        let count = n as usize / MSG_BYTES;
        for msg in &buf[..count] {
            out.push(decode(msg, self.features));
        }
        Ok(count)
    }

    /// Waits up to `timeout_ms` for messages on the userfaultfd or for `extra` to become
    /// readable.
    pub fn poll_readable(&self, timeout_ms: i32, extra: Option<RawFd>) -> Result<Readiness> {
        let mut fds = [
            libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: extra.unwrap_or(-1), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: poll on our own array of two pollfd; a negative fd is ignored by poll.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if n < 0 {
            let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if errno == libc::EINTR {
                return Ok(Readiness::default());
            }
            return Err(map_errno("poll", errno, 0));
        }
        Ok(Readiness {
            uffd: fds[0].revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0,
            extra: fds[1].revents & libc::POLLIN != 0,
        })
    }
}

/// Waits up to `timeout_ms` for any of `fds` (at most 8; negative ones ignored) to become
/// readable; returns a bit per fd, in order (hang-up and error count as readable).
pub fn poll_fds(fds: &[RawFd], timeout_ms: i32) -> Result<u32> {
    let mut p = [libc::pollfd { fd: -1, events: libc::POLLIN, revents: 0 }; 8];
    let n = fds.len().min(8);
    for (slot, &fd) in p.iter_mut().zip(&fds[..n]) {
        slot.fd = fd;
    }
    // SAFETY: poll on our own array of `n` pollfd.
    let ret = unsafe { libc::poll(p.as_mut_ptr(), n as libc::nfds_t, timeout_ms) };
    if ret < 0 {
        let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
        if errno == libc::EINTR {
            return Ok(0);
        }
        return Err(map_errno("poll", errno, 0));
    }
    // A descriptor closed under us (the program closed it: POLLNVAL) would make every poll
    // return at once, and its faults could never be served: an error, not a spin.
    if p[..n].iter().any(|slot| slot.revents & libc::POLLNVAL != 0) {
        return Err(map_errno("poll", libc::EBADF, 0));
    }
    let mut ready = 0;
    for (k, slot) in p[..n].iter().enumerate() {
        if slot.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0 {
            ready |= 1 << k;
        }
    }
    Ok(ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_uapi() {
        assert_eq!(UFFDIO_API, 0xC018_AA3F);
        assert_eq!(UFFDIO_REGISTER, 0xC020_AA00);
        assert_eq!(UFFDIO_UNREGISTER, 0x8010_AA01);
        assert_eq!(UFFDIO_WAKE, 0x8010_AA02);
        assert_eq!(UFFDIO_COPY, 0xC028_AA03);
        assert_eq!(UFFDIO_ZEROPAGE, 0xC020_AA04);
        assert_eq!(UFFDIO_MOVE, 0xC028_AA05);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xC018_AA06);
        assert_eq!(UFFDIO_POISON, 0xC020_AA08);
        assert_eq!(USERFAULTFD_IOC_NEW, 0xAA00);
    }

    #[test]
    fn errno_mapping_never_turns_a_negative_count_into_progress() {
        assert!(matches!(map_errno("c", libc::EAGAIN, -(libc::EAGAIN as i64)), Error::Again { done_bytes: 0, .. }));
        assert!(matches!(map_errno("c", libc::EEXIST, 8192), Error::PageExist { done_bytes: 8192, .. }));
        assert!(matches!(map_errno("m", libc::ENOENT, 4096), Error::NoPage { done_bytes: 4096, .. }));
        assert!(matches!(map_errno("m", libc::EBUSY, 0), Error::Busy { .. }));
        assert!(matches!(map_errno("m", libc::ESRCH, 0), Error::ProcessGone { .. }));
        assert!(matches!(map_errno("m", libc::EPERM, 0), Error::Other { errno: libc::EPERM, .. }));
    }

    #[test]
    fn decodes_messages() {
        let mut m = [0u8; MSG_BYTES];
        m[0] = EVENT_PAGEFAULT;
        m[8..16].copy_from_slice(&(PAGEFAULT_FLAG_WRITE).to_ne_bytes());
        m[16..24].copy_from_slice(&0x7f00_1000u64.to_ne_bytes());
        m[24..28].copy_from_slice(&1234u32.to_ne_bytes());
        match decode(&m, 0) {
            Event::PageFault { addr, write, wp, minor, tid } => {
                assert_eq!((addr, write, wp, minor, tid), (0x7f00_1000, true, false, false, 1234));
            }
            e => panic!("{e:?}"),
        }
        let mut m = [0u8; MSG_BYTES];
        m[0] = EVENT_REMOVE;
        m[8..16].copy_from_slice(&0x1000u64.to_ne_bytes());
        m[16..24].copy_from_slice(&0x3000u64.to_ne_bytes());
        assert!(matches!(decode(&m, 0), Event::Remove { start: 0x1000, end: 0x3000 }));
        m[0] = EVENT_REMAP;
        m[24..32].copy_from_slice(&0x2000u64.to_ne_bytes());
        assert!(matches!(decode(&m, 0), Event::Remap { from: 0x1000, to: 0x3000, len: 0x2000 }));
        m[0] = 0x42;
        assert!(matches!(decode(&m, 0), Event::Unknown(0x42)));
    }

    #[test]
    fn missing_features_are_named() {
        let e = Error::MissingFeatures { wanted: features::MOVE | features::POISON, have: features::POISON };
        assert!(e.to_string().contains("MOVE"));
        assert!(!e.to_string().contains("POISON"));
    }
}
