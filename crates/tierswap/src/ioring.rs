//! File reads that wait for their completion on the CPU instead of sleeping.
//!
//! A fault thread reading a record blocks in pread(2) while the program waits for the same
//! read: its CPU goes idle (on a VM the vCPU halts), the disk's interrupt completes the read
//! on another CPU, and waking the thread costs a scheduler wake-up and, for a halted vCPU,
//! an IPI and a VM entry. On this project's machine a random 4 KiB `O_DIRECT` read takes
//! 58–68 µs (p50) that way and 37–44 µs when the reader polls its completion (three runs
//! each, program on CPU 0, the disk's interrupt on CPU 1; docs/design.md, Measured costs).
//! A thread that [asked for it](spin_reads) submits its reads on an io_uring of its own and
//! polls the completion queue for up to its spin, then sleeps in the kernel for the rest.
//!
//! The ring is set up with COOP_TASKRUN and TASKRUN_FLAG: the completion's task work is not
//! pushed to the thread with an interrupt; the kernel raises IORING_SQ_TASKRUN in the ring
//! and the polling thread enters the kernel to run it. A read is always reaped before
//! [`read_at`] returns, so the buffer it wrote into is never touched afterwards; a ring
//! that fails is given up (left open, with its buffers, see [`read_at`]) and the thread
//! reads with pread from then on.
//!
//! Reads ahead: several program threads may wait on faults that a fault thread read together
//! from the userfaultfd. The thread can start their file reads at once ([`read_ahead`], into
//! buffers of the ring's own), so the disk serves them side by side, and then serve the
//! faults one by one as before: a read that asks for bytes a read ahead holds, under the
//! same tag ([`read_tagged`]), waits for that read and copies its bytes. This machine's disk
//! reads 4 KiB at random ~15,000 times a second one at a time and 36,000–40,000 with four
//! in flight (threads doing O_DIRECT preads of a 1 GiB file). The tag is the caller's proof
//! that the bytes are still the ones it wants (the file tier passes the write generation
//! of the unit read); a read ahead nobody asked for is forgotten ([`forget_ahead`]). A read
//! ahead's buffer is used again, or freed with the ring, only once its completion is
//! reaped.
//!
//! Only fault threads ask: the shim keeps their rings' descriptors from the program's close
//! and dup (their number is known when the pager starts), so the descriptor a thread's ring
//! closes when the thread ends is still the ring's.
//!
//! Owns: one ring per thread that asked for one. Calls: the io-uring crate (the ring's
//! setup, mappings and io_uring_enter), nothing of the engine.

use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};

/// Reads ahead a thread may have in flight.
pub const AHEAD_SLOTS: usize = 8;
/// The bytes a read ahead may read: a record of a page and its header, IO-aligned, spans at
/// most three 4 KiB blocks.
pub const AHEAD_BYTES: usize = 16 << 10;
/// Entries of a thread's ring: the reads ahead and the read the thread waits for.
const RING_ENTRIES: u32 = 16;
/// The `user_data` of the read the thread waits for; a read ahead's is its slot + 1.
const WAITED: u64 = 0;
/// Fault threads beyond this many read with pread: the shim protects 256 of the pager's
/// descriptors, the rings and the handful the pager opens besides.
pub const MAX_RINGS: usize = 192;

/// A thread's ring and how long it polls a read's completion.
struct Spinner {
    ring: IoUring,
    spin: Duration,
    /// Polls by giving the CPU to whatever else is runnable there ([`yield_while_polling`]).
    yields: bool,
    /// The reads ahead, one per slot of `bufs`.
    ahead: [Ahead; AHEAD_SLOTS],
    /// `AHEAD_SLOTS` buffers of `AHEAD_BYTES`, page-aligned for O_DIRECT. Freed only once no
    /// read into them is in flight (`Drop`).
    bufs: *mut u8,
}

/// A read ahead's slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AheadState {
    Free,
    /// Submitted; its buffer belongs to the kernel until the completion is reaped.
    InFlight,
    /// Submitted and forgotten: free once reaped.
    Forgotten,
    /// Completed with this result (bytes read, or -errno).
    Done(i32),
}

#[derive(Clone, Copy, Debug)]
struct Ahead {
    state: AheadState,
    fd: RawFd,
    offset: u64,
    len: usize,
    tag: u64,
}

impl Ahead {
    const FREE: Ahead = Ahead { state: AheadState::Free, fd: -1, offset: 0, len: 0, tag: 0 };

    /// Whether this read ahead is of `[offset, offset + len)` of `fd`, under `tag`.
    fn covers(&self, fd: RawFd, offset: u64, len: usize, tag: u64) -> bool {
        matches!(self.state, AheadState::InFlight | AheadState::Done(_))
            && self.fd == fd
            && self.tag == tag
            && self.offset <= offset
            && offset + len as u64 <= self.offset + self.len as u64
    }
}

fn ahead_layout() -> Layout {
    // A constant size and a power-of-two alignment: never fails.
    Layout::from_size_align(AHEAD_SLOTS * AHEAD_BYTES, 4096).expect("layout")
}

thread_local! {
    /// Whether this thread has a ring. Looked at first: a `Cell<bool>` has no destructor,
    /// so reading it registers none (glibc allocates for that), which keeps [`read_at`]
    /// async-signal-safe in a thread without a ring (signal mode reads in the program's
    /// SIGBUS handler).
    static SPINS: Cell<bool> = const { Cell::new(false) };
    /// Reads ahead this thread served reads from (a count that only grows).
    static TAKEN: Cell<u64> = const { Cell::new(0) };
    /// This thread's ring, if it asked for one and the kernel gave it.
    static SPINNER: RefCell<Option<Spinner>> = const { RefCell::new(None) };
}

/// Makes this thread's file reads poll their completion for up to `spin` (zero: back to
/// pread). Err when the kernel gives no ring (io_uring disabled, too old): reads stay
/// pread's.
pub fn spin_reads(spin: Duration) -> io::Result<()> {
    let spinner = if spin.is_zero() {
        None
    } else {
        let ring = IoUring::builder().setup_coop_taskrun().setup_taskrun_flag().build(RING_ENTRIES)?;
        // SAFETY: the layout has a nonzero size.
        let bufs = unsafe { std::alloc::alloc(ahead_layout()) };
        if bufs.is_null() {
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        Some(Spinner { ring, spin, yields: false, ahead: [Ahead::FREE; AHEAD_SLOTS], bufs })
    };
    SPINS.with(|on| on.set(spinner.is_some()));
    SPINNER.with(|s| *s.borrow_mut() = spinner);
    Ok(())
}

/// How many reads this thread has served from reads ahead so far.
pub fn aheads_taken() -> u64 {
    TAKEN.with(Cell::get)
}

/// Makes this thread's polling give its CPU to any other runnable thread there between
/// looks at the completion queue, and sleep until the completion when one took it: a
/// program with more threads than CPUs (a server's workers) gets the CPU a spinning fault
/// thread would burn, while a program blocked on the fault (nothing else runnable) sees
/// the completion as soon as with plain polling. No effect without a ring.
pub fn yield_while_polling(on: bool) {
    SPINNER.with(|s| {
        if let Ok(mut slot) = s.try_borrow_mut() {
            if let Some(sp) = slot.as_mut() {
                sp.yields = on;
            }
        }
    });
}

/// Whether this thread's reads poll their completion.
pub fn spins() -> bool {
    SPINS.with(Cell::get)
}

/// `file.read_at(buf, offset)`, polled on this thread's ring when it has one.
pub fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    with_spinner(file, buf, offset, |sp, file, buf, offset| sp.read(file, buf, offset))
}

/// [`read_at`], served from a read ahead of this thread that covers `[offset, offset +
/// buf.len())` under the same `tag` when there is one (waiting for it if still in flight);
/// the read ahead is used up. Otherwise (none, or it failed or came short) a read of its own.
pub fn read_tagged(file: &File, buf: &mut [u8], offset: u64, tag: u64) -> io::Result<usize> {
    with_spinner(file, buf, offset, |sp, file, buf, offset| {
        if let Some(n) = sp.take_ahead(file.as_raw_fd(), buf, offset, tag) {
            return Ok(Ok(n));
        }
        sp.read(file, buf, offset)
    })
}

/// Starts reading `[offset, offset + len)` of `file` ahead, under `tag` (see [`read_tagged`]),
/// if this thread has a ring with a free slot and `len` fits one; `offset` and `len` must
/// suit the file's IO alignment. Returns whether the read went out. Waits for nothing.
pub fn read_ahead(file: &File, offset: u64, len: usize, tag: u64) -> bool {
    if !spins() || len == 0 || len > AHEAD_BYTES {
        return false;
    }
    SPINNER.with(|s| {
        let Ok(mut slot) = s.try_borrow_mut() else { return false };
        let Some(spinner) = slot.as_mut() else { return false };
        spinner.start_ahead(file.as_raw_fd(), offset, len, tag)
    })
}

/// This thread's reads ahead in flight or done and not yet taken.
pub fn aheads_outstanding() -> usize {
    if !spins() {
        return 0;
    }
    SPINNER.with(|s| {
        let Ok(slot) = s.try_borrow() else { return 0 };
        slot.as_ref().map_or(0, |sp| {
            sp.ahead.iter().filter(|a| matches!(a.state, AheadState::InFlight | AheadState::Done(_))).count()
        })
    })
}

/// Whether a read ahead of this thread (in flight or done) covers `[offset, offset + len)`
/// of `file` under `tag`.
pub fn holds_ahead(file: &File, offset: u64, len: usize, tag: u64) -> bool {
    if !spins() {
        return false;
    }
    SPINNER.with(|s| {
        let Ok(slot) = s.try_borrow() else { return false };
        slot.as_ref().is_some_and(|sp| sp.ahead.iter().any(|a| a.covers(file.as_raw_fd(), offset, len, tag)))
    })
}

/// Forgets this thread's reads ahead: those done are freed, those in flight are freed when
/// reaped. Bytes no read asked for are never served after this.
pub fn forget_ahead() {
    if !spins() {
        return;
    }
    SPINNER.with(|s| {
        let Ok(mut slot) = s.try_borrow_mut() else { return };
        let Some(spinner) = slot.as_mut() else { return };
        for a in spinner.ahead.iter_mut() {
            a.state = match a.state {
                AheadState::InFlight | AheadState::Forgotten => AheadState::Forgotten,
                AheadState::Free | AheadState::Done(_) => AheadState::Free,
            };
        }
    })
}

/// Runs `read` on this thread's ring, or reads with pread where there is none; a ring that
/// fails is given up.
fn with_spinner(
    file: &File,
    buf: &mut [u8],
    offset: u64,
    read: impl FnOnce(&mut Spinner, &File, &mut [u8], u64) -> io::Result<io::Result<usize>>,
) -> io::Result<usize> {
    if !spins() {
        return file.read_at(buf, offset);
    }
    SPINNER.with(|s| {
        let Ok(mut slot) = s.try_borrow_mut() else { return file.read_at(buf, offset) };
        let Some(spinner) = slot.as_mut() else { return file.read_at(buf, offset) };
        match read(spinner, file, buf, offset) {
            Ok(res) => res,
            Err(failed) => {
                // The ring itself failed: pread from now on. The ring is left open, not
                // dropped: a failure may mean the program closed its descriptor and the
                // number now names a file of the program's, which closing would take from
                // it; so are its read-ahead buffers (a read ahead may still be in flight).
                std::mem::forget(slot.take());
                SPINS.with(|on| on.set(false));
                eprintln!("tierswap: a fault thread's polled reads failed ({failed}); it reads with pread from now on");
                file.read_at(buf, offset)
            }
        }
    })
}

impl Spinner {
    /// One read through the ring: `Ok(result of the read)`, or `Err` when the ring could
    /// not take it (nothing of this read in flight then).
    fn read(&mut self, file: &File, buf: &mut [u8], offset: u64) -> io::Result<io::Result<usize>> {
        let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let entry = opcode::Read::new(types::Fd(file.as_raw_fd()), buf.as_mut_ptr(), len)
            .offset(offset)
            .build()
            .user_data(WAITED);
        // SAFETY: the entry points into `buf` for `len` bytes; `buf` is borrowed mutably
        // until this function returns, and it returns only once the read's completion is
        // reaped (or the entry was never submitted: the ring is then given up unread).
        unsafe { self.ring.submission().push(&entry) }.map_err(|_| io::Error::other("the ring is full"))?;
        self.submit()?;
        let res = self.wait_for(WAITED);
        Ok(if res < 0 { Err(io::Error::from_raw_os_error(-res)) } else { Ok(res as usize) })
    }

    /// Submits what the submission queue holds; Err when the kernel takes none of it.
    fn submit(&mut self) -> io::Result<()> {
        loop {
            match self.ring.submit() {
                Ok(n) if n >= 1 => return Ok(()),
                Ok(_) => return Err(io::Error::other("the kernel took no entry")),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Polls (then sleeps) until the completion with `user_data` is reaped, recording the
    /// reads ahead completed meanwhile; returns its result. The read is in flight and owns
    /// its buffer, so nothing here gives up.
    fn wait_for(&mut self, user_data: u64) -> i32 {
        let t0 = Instant::now();
        loop {
            if let Some(res) = self.reap(user_data) {
                return res;
            }
            if self.ring.submission().taskrun() {
                // The completion's task work is pending: entering the kernel runs it.
                let _ = self.ring.submit();
                continue;
            }
            if t0.elapsed() >= self.spin || (self.yields && yielded_to_another()) {
                // Past the spin, or another thread had this CPU: sleep until a completion.
                // A failed wait (a signal) is retried.
                if self.ring.submit_and_wait(1).is_err() {
                    std::thread::yield_now();
                }
                continue;
            }
            std::hint::spin_loop();
        }
    }

    /// Reaps every completion in the queue into its read ahead's slot; returns the result of
    /// the one with `user_data` if it was among them.
    fn reap(&mut self, user_data: u64) -> Option<i32> {
        let mut found = None;
        for cqe in self.ring.completion() {
            let (ud, res) = (cqe.user_data(), cqe.result());
            if ud == user_data {
                found = Some(res);
            }
            if let Some(a) = ud.checked_sub(1).and_then(|i| self.ahead.get_mut(i as usize)) {
                a.state = match a.state {
                    AheadState::Forgotten => AheadState::Free,
                    _ => AheadState::Done(res),
                };
            }
        }
        found
    }

    fn ahead_buf(&self, i: usize) -> *mut u8 {
        // SAFETY: `bufs` holds AHEAD_SLOTS buffers of AHEAD_BYTES; i < AHEAD_SLOTS.
        unsafe { self.bufs.add(i * AHEAD_BYTES) }
    }

    /// See [`read_ahead`].
    fn start_ahead(&mut self, fd: RawFd, offset: u64, len: usize, tag: u64) -> bool {
        let _ = self.reap(u64::MAX);
        if self.ahead.iter().any(|a| a.covers(fd, offset, len, tag)) {
            return true;
        }
        let Some(i) = self.ahead.iter().position(|a| a.state == AheadState::Free) else { return false };
        let entry = opcode::Read::new(types::Fd(fd), self.ahead_buf(i), len as u32)
            .offset(offset)
            .build()
            .user_data(i as u64 + 1);
        // SAFETY: the entry points into slot i's buffer, AHEAD_BYTES ≥ len long, which stays
        // allocated and unused by anything else until the completion is reaped (`Drop`
        // waits for it).
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            return false;
        }
        self.ahead[i] = Ahead { state: AheadState::InFlight, fd, offset, len, tag };
        if self.submit().is_err() {
            // Not taken: nothing is in flight for this slot. (An entry left in the queue
            // goes out with the next submission and is reaped as forgotten.)
            self.ahead[i].state = AheadState::Forgotten;
            return false;
        }
        true
    }

    /// Serves `buf` at `offset` of `fd` from a read ahead under `tag`, waiting for it if in
    /// flight: `Some(bytes)` if it held them all, `None` otherwise (the read ahead, used or
    /// not, is freed).
    fn take_ahead(&mut self, fd: RawFd, buf: &mut [u8], offset: u64, tag: u64) -> Option<usize> {
        let i = self.ahead.iter().position(|a| a.covers(fd, offset, buf.len(), tag))?;
        if self.ahead[i].state == AheadState::InFlight {
            self.wait_for(i as u64 + 1);
        }
        let a = self.ahead[i];
        self.ahead[i] = Ahead::FREE;
        let AheadState::Done(res) = a.state else { return None };
        let at = (offset - a.offset) as usize;
        if res < 0 || (res as usize) < at + buf.len() {
            return None;
        }
        // SAFETY: the read into slot i is reaped, so its buffer is ours; it read `res` ≥
        // at + buf.len() bytes.
        let src = unsafe { std::slice::from_raw_parts(self.ahead_buf(i).add(at), buf.len()) };
        buf.copy_from_slice(src);
        TAKEN.with(|t| t.set(t.get() + 1));
        Some(buf.len())
    }
}

/// Gives the CPU to any other runnable thread on it; whether one ran (the yield took longer
/// than the system call does alone: ~0.5 µs at the median here, under 1 µs at the p99 of
/// 10,000 yields of a thread alone on its CPU, while a thread given the CPU keeps it until it
/// blocks or its slice ends).
fn yielded_to_another() -> bool {
    const ALONE: Duration = Duration::from_micros(20);
    let t = Instant::now();
    std::thread::yield_now();
    t.elapsed() >= ALONE
}

impl Drop for Spinner {
    fn drop(&mut self) {
        // Reads ahead still in flight write into `bufs`: reap them before freeing it. A ring
        // that keeps failing its waits leaves the buffers allocated instead.
        let in_flight =
            |sp: &Spinner| sp.ahead.iter().any(|a| matches!(a.state, AheadState::InFlight | AheadState::Forgotten));
        let mut failures = 0;
        loop {
            let _ = self.reap(u64::MAX);
            if !in_flight(self) {
                break;
            }
            if self.ring.submit_and_wait(1).is_err() {
                failures += 1;
                if failures > 1000 {
                    return;
                }
                std::thread::yield_now();
            }
        }
        // SAFETY: allocated in `spin_reads` with this layout; no read writes into it now.
        unsafe { std::alloc::dealloc(self.bufs, ahead_layout()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Every read through the ring returns the file's bytes, short at its end; an error of
    /// the read itself (a descriptor open for writing only) comes back as that error and
    /// leaves the ring in use.
    #[test]
    fn polled_reads_return_the_files_bytes() {
        let dir = std::env::temp_dir().join(format!("tierswap-ioring-{}", std::process::id()));
        let mut f = File::create(&dir).unwrap();
        let data: Vec<u8> = (0..40_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        f.write_all(&data).unwrap();
        drop(f);
        let f = File::open(&dir).unwrap();
        spin_reads(Duration::from_micros(50)).expect("a ring");
        assert!(spins());
        for &(off, len) in &[(0usize, 4096usize), (123, 5000), (36_000, 4096), (39_999, 10)] {
            let mut buf = vec![0u8; len];
            let n = read_at(&f, &mut buf, off as u64).unwrap();
            let want = len.min(data.len() - off);
            assert_eq!(n, want, "read of {len} at {off}");
            assert_eq!(&buf[..n], &data[off..off + n], "bytes at {off}");
        }
        let wo = std::fs::OpenOptions::new().write(true).open(&dir).unwrap();
        let err = read_at(&wo, &mut vec![0u8; 4096], 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF), "{err}");
        assert!(spins(), "a failed read is the read's, not the ring's");
        // A spin of 1 ns sleeps in the kernel at once: the same bytes.
        spin_reads(Duration::from_nanos(1)).unwrap();
        let mut buf = vec![0u8; 4096];
        assert_eq!(read_at(&f, &mut buf, 8192).unwrap(), 4096);
        assert_eq!(&buf[..], &data[8192..8192 + 4096]);
        spin_reads(Duration::ZERO).unwrap();
        assert!(!spins());
        assert_eq!(read_at(&f, &mut buf, 4096).unwrap(), 4096);
        assert_eq!(&buf[..], &data[4096..8192]);
        std::fs::remove_file(&dir).unwrap();
    }
    /// Polling that gives the CPU away: alone on its CPU and beside a thread spinning on the
    /// same one (the yield then lets it run and the read sleeps), every read returns the
    /// file's bytes.
    #[test]
    fn polled_reads_that_yield_return_the_files_bytes() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let path = std::env::temp_dir().join(format!("tierswap-ioring-yield-{}", std::process::id()));
        let data: Vec<u8> = (0..64_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = File::open(&path).unwrap();
        let pin = || {
            // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity of
            // the calling thread (0) read it only.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
        };
        spin_reads(Duration::from_micros(200)).expect("a ring");
        yield_while_polling(true);
        pin();
        for busy in [false, true] {
            let stop = Arc::new(AtomicBool::new(false));
            let spinner = busy.then(|| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    pin();
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            });
            for k in 0..15usize {
                let (off, len) = (k * 4096 + k, 4096);
                let mut buf = vec![0u8; len];
                assert_eq!(read_at(&f, &mut buf, off as u64).unwrap(), len, "busy {busy}: read at {off}");
                assert_eq!(&buf[..], &data[off..off + len], "busy {busy}: bytes at {off}");
            }
            stop.store(true, Ordering::Relaxed);
            if let Some(t) = spinner {
                t.join().unwrap();
            }
        }
        spin_reads(Duration::ZERO).unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    /// Reads started ahead serve the reads that ask for their bytes (or part of them) under
    /// the same tag, once each; a read under another tag, one the read ahead came short
    /// of (the end of the file), or one after they are forgotten reads the file itself.
    /// Every byte returned is the file's.
    #[test]
    fn reads_ahead_serve_reads_of_their_bytes_under_their_tag() {
        let path = std::env::temp_dir().join(format!("tierswap-ioring-ahead-{}", std::process::id()));
        let data: Vec<u8> = (0..40_000u32).map(|i| (i.wrapping_mul(2_246_822_519) >> 11) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = File::open(&path).unwrap();
        spin_reads(Duration::from_micros(50)).expect("a ring");
        let read = |off: usize, len: usize, tag: u64| {
            let taken = aheads_taken();
            let mut buf = vec![0u8; len];
            let n = read_tagged(&f, &mut buf, off as u64, tag).unwrap();
            assert_eq!(n, len.min(data.len() - off), "read of {len} at {off}");
            assert_eq!(&buf[..n], &data[off..off + n], "bytes at {off}");
            aheads_taken() - taken
        };
        assert!(read_ahead(&f, 0, 8192, 7));
        assert!(read_ahead(&f, 16384, 12288, 9));
        assert_eq!(aheads_outstanding(), 2);
        assert!(holds_ahead(&f, 4096, 4096, 7) && !holds_ahead(&f, 4096, 8192, 7) && !holds_ahead(&f, 0, 4096, 9));
        assert_eq!(read(4096, 4096, 7), 1, "part of a read ahead, same tag");
        assert_eq!(read(4096, 4096, 7), 0, "a read ahead serves once");
        assert_eq!(aheads_outstanding(), 1);
        assert_eq!(read(16384, 4096, 8), 0, "another tag");
        assert_eq!(read(20480, 8192, 9), 1, "the right tag");
        assert!(read_ahead(&f, 36864, 8192, 3));
        assert_eq!(read(36864, 4096, 3), 0, "the read ahead came short: the file ends at 40,000");
        assert!(read_ahead(&f, 8192, 4096, 5));
        forget_ahead();
        assert_eq!(read(8192, 4096, 5), 0, "forgotten");
        // As many as there are slots, each served under its tag.
        let started: Vec<usize> =
            (0..AHEAD_SLOTS + 2).filter(|&k| read_ahead(&f, (k * 4096 % 32768) as u64, 4096, 100 + k as u64)).collect();
        assert!((1..=AHEAD_SLOTS).contains(&started.len()), "{started:?} reads ahead in flight");
        for &k in &started {
            assert_eq!(read(k * 4096 % 32768, 4096, 100 + k as u64), 1, "read ahead {k}");
        }
        // Left in flight: dropping the ring waits for them.
        assert!(read_ahead(&f, 0, 16384, 1));
        spin_reads(Duration::ZERO).unwrap();
        assert!(!read_ahead(&f, 0, 4096, 1), "no ring, no read ahead");
        assert_eq!(read(0, 4096, 1), 0);
        std::fs::remove_file(&path).unwrap();
    }
}
