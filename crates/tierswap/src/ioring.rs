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
//! that fails, with nothing in flight, is given up (left open, see [`read_at`]) and the
//! thread reads with pread from then on.
//!
//! Only fault threads ask: the shim keeps their rings' descriptors from the program's close
//! and dup (their number is known when the pager starts), so the descriptor a thread's ring
//! closes when the thread ends is still the ring's.
//!
//! Owns: one ring per thread that asked for one. Calls: the io-uring crate (the ring's
//! setup, mappings and io_uring_enter), nothing of the engine.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};

/// Entries of a thread's ring: one read is in flight at a time.
const RING_ENTRIES: u32 = 4;
/// Fault threads beyond this many read with pread: the shim protects 256 of the pager's
/// descriptors, the rings and the handful the pager opens besides.
pub const MAX_RINGS: usize = 192;

/// A thread's ring and how long it polls a read's completion.
struct Spinner {
    ring: IoUring,
    spin: Duration,
}

thread_local! {
    /// Whether this thread has a ring. Looked at first: a `Cell<bool>` has no destructor,
    /// so reading it registers none (glibc allocates for that), which keeps [`read_at`]
    /// async-signal-safe in a thread without a ring (signal mode reads in the program's
    /// SIGBUS handler).
    static SPINS: Cell<bool> = const { Cell::new(false) };
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
        Some(Spinner { ring, spin })
    };
    SPINS.with(|on| on.set(spinner.is_some()));
    SPINNER.with(|s| *s.borrow_mut() = spinner);
    Ok(())
}

/// Whether this thread's reads poll their completion.
pub fn spins() -> bool {
    SPINS.with(Cell::get)
}

/// `file.read_at(buf, offset)`, polled on this thread's ring when it has one.
pub fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    if !spins() {
        return file.read_at(buf, offset);
    }
    SPINNER.with(|s| {
        let Ok(mut slot) = s.try_borrow_mut() else { return file.read_at(buf, offset) };
        let Some(spinner) = slot.as_mut() else { return file.read_at(buf, offset) };
        match spinner.read(file, buf, offset) {
            Ok(res) => res,
            Err(failed) => {
                // The ring itself failed (nothing in flight): pread from now on. The ring
                // is left open, not dropped: a failure may mean the program closed its
                // descriptor and the number now names a file of the program's, which
                // closing would take from it.
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
    /// not take it (nothing submitted then).
    fn read(&mut self, file: &File, buf: &mut [u8], offset: u64) -> io::Result<io::Result<usize>> {
        let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let entry = opcode::Read::new(types::Fd(file.as_raw_fd()), buf.as_mut_ptr(), len).offset(offset).build();
        // SAFETY: the entry points into `buf` for `len` bytes; `buf` is borrowed mutably
        // until this function returns, and it returns only once the read's completion is
        // reaped (or the entry was never submitted: the ring is then given up unread).
        unsafe { self.ring.submission().push(&entry) }.map_err(|_| io::Error::other("the ring is full"))?;
        loop {
            match self.ring.submit() {
                Ok(n) if n >= 1 => break,
                Ok(_) => return Err(io::Error::other("the kernel took no entry")),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        let t0 = Instant::now();
        loop {
            if let Some(cqe) = self.ring.completion().next() {
                let res = cqe.result();
                return Ok(if res < 0 { Err(io::Error::from_raw_os_error(-res)) } else { Ok(res as usize) });
            }
            if self.ring.submission().taskrun() {
                // The completion's task work is pending: entering the kernel runs it.
                let _ = self.ring.submit();
                continue;
            }
            if t0.elapsed() >= self.spin {
                // Past the spin: sleep until the completion. A failed wait (a signal)
                // is retried: the read is in flight and owns the buffer.
                if self.ring.submit_and_wait(1).is_err() {
                    std::thread::yield_now();
                }
                continue;
            }
            std::hint::spin_loop();
        }
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
}
