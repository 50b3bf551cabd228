//! Fork safety: the program's `fork()` must never wait on a pager thread stuck in malloc.
//!
//! glibc's `fork()` takes malloc's locks, then enters the kernel, and the kernel holds the
//! fork until the `UFFD_EVENT_FORK` message of every userfaultfd of the process is *read*.
//! A fault thread that calls malloc in that window (handling an event, a fault, or just
//! starting up) blocks on malloc's lock, the message stays unread, and the process hangs.
//! It did: a signal-mode test forked while its pager's fault thread was still in its
//! first allocation.
//!
//! The gate closes that window. `pthread_atfork`'s prepare handler (which runs before
//! glibc takes malloc's locks) closes it and waits until no *busy* section is running;
//! the parent and child handlers open it again.
//!
//! - Busy sections are whatever may allocate while the fork message is waiting to be read.
//!   They are a fault thread's iteration after the poll, a program thread's own work
//!   under the event lock (creating or dropping a region), and a fault served in the
//!   faulting thread.
//! - While the gate is closed, a fault thread holds the event lock and only polls and
//!   reads messages into room it already has (`fault::fork_wait`), marking the regions
//!   they concern without allocating (a no-alloc section, `inject::no_alloc`, which
//!   tests/fork_safety.rs checks with a counting allocator). Once the gate opens it handles
//!   them in order, the fork snapshot first.
//! - The forking thread itself may fault on managed memory while the gate is closed: fork
//!   handlers registered before ours run after our prepare handler, and before our parent
//!   handler (a jemalloc's, its locks in managed memory). malloc is free whenever that
//!   thread runs in user space (glibc holds malloc's locks only inside the fork system
//!   call), so its faults are served at once. In thread mode the reader first handles the
//!   messages it holds, the fork snapshot included. In signal mode the thread serves
//!   itself, once any snapshot is taken. Its tid is in [`forker`].
//! - A fork started without glibc's `fork()` (a raw `clone`) runs no handlers. It takes no
//!   malloc lock either, so it cannot hang this way.
//!
//! ```text
//!  state word (u32)
//!   31        30        29 .. 0
//!  +---------+---------+-----------------------------+
//!  | CLOSING | CLOSED  | busy sections running       |
//!  +---------+---------+-----------------------------+
//!  open:    both flags clear; anyone enters
//!  CLOSING: prepare waits for the count to reach 0; only `enter_unless_closed` enters
//!  CLOSED:  count is 0 and stays 0 until the parent/child handler clears the word
//! ```

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::Once;

const CLOSING: u32 = 1 << 31;
const CLOSED: u32 = 1 << 30;
const COUNT: u32 = CLOSED - 1;

/// The gate's state word (see the module comment).
struct Gate(AtomicU32);

/// The process's gate: fork is process-wide, so every pager shares it.
static GATE: Gate = Gate(AtomicU32::new(0));

const OPEN: fn(u32) -> bool = |v| v & (CLOSING | CLOSED) == 0;
const NOT_CLOSED: fn(u32) -> bool = |v| v & CLOSED == 0;
static INSTALL: Once = Once::new();
/// The thread in glibc's fork between our prepare and parent handlers, else 0.
static FORKER: AtomicI32 = AtomicI32::new(0);

/// A busy section: the gate stays open (or closing, not closed) until it drops.
#[must_use]
pub(crate) struct Busy(Option<&'static Gate>);

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(g) = self.0 {
            g.leave();
        }
    }
}

/// Registers the fork handlers, once per process.
pub(crate) fn install() {
    INSTALL.call_once(|| {
        // SAFETY: the handlers are plain extern "C" fns touching only GATE and its futex.
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if rc != 0 {
            eprintln!("tierswap: cannot register fork handlers (error {rc}); a fork may hang while a fault is served");
        }
    });
}

/// Enters a busy section if the gate is open; `None` while a fork closes or holds it.
pub(crate) fn try_enter() -> Option<Busy> {
    GATE.try_enter()
}

/// Enters unless the gate is closed: a section already holding what a busy section of
/// another thread may wait for (the event lock, a fault served in its own thread) must not
/// wait for a fork that waits for that section. Prepare waits for it to end.
pub(crate) fn enter_unless_closed() -> Option<Busy> {
    GATE.enter_unless_closed()
}

/// Enters a busy section, waiting while a fork closes or holds the gate. For program
/// threads that hold nothing of the pager's yet. The forking thread itself (creating or
/// dropping a region in a fork handler) goes ahead uncounted: malloc is free while it runs.
pub(crate) fn enter() -> Busy {
    if GATE.enter(is_forker) {
        Busy(Some(&GATE))
    } else {
        Busy(None)
    }
}

/// Whether a fork holds the gate (every busy section has ended).
pub(crate) fn is_closed() -> bool {
    GATE.0.load(Ordering::Acquire) & CLOSED != 0
}

/// Waits while a fork waits for busy sections to end (until it holds the gate, or the
/// gate is open again).
pub(crate) fn wait_while_closing() {
    loop {
        let v = GATE.0.load(Ordering::Acquire);
        if v & CLOSING == 0 {
            return;
        }
        GATE.wait(v);
    }
}

/// The thread forking now (between our prepare and parent handlers), or 0.
pub(crate) fn forker() -> i32 {
    FORKER.load(Ordering::Acquire)
}

/// Whether the calling thread is the one forking now.
pub(crate) fn is_forker() -> bool {
    let f = forker();
    f != 0 && f == gettid()
}

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// Before glibc locks malloc: close the gate and wait for the busy sections to end.
extern "C" fn prepare() {
    FORKER.store(gettid(), Ordering::Release);
    GATE.close();
}

/// After the fork, in the parent: open the gate.
extern "C" fn parent() {
    FORKER.store(0, Ordering::Release);
    GATE.open();
}

/// In the child: no pager thread exists here; the gate starts open.
extern "C" fn child() {
    FORKER.store(0, Ordering::Release);
    GATE.0.store(0, Ordering::Release);
}

impl Gate {
    fn try_enter(&'static self) -> Option<Busy> {
        self.enter_if(OPEN).then(|| Busy(Some(self)))
    }

    fn enter_unless_closed(&'static self) -> Option<Busy> {
        self.enter_if(NOT_CLOSED).then(|| Busy(Some(self)))
    }

    fn enter_if(&self, ok: impl Fn(u32) -> bool) -> bool {
        let mut v = self.0.load(Ordering::Acquire);
        loop {
            if !ok(v) {
                return false;
            }
            match self.0.compare_exchange_weak(v, v + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => v = now,
            }
        }
    }

    /// Waits for the gate to open and enters (true), or returns false at once if the gate
    /// is shut and `exempt()` says the caller is the forking thread.
    fn enter(&self, exempt: impl Fn() -> bool) -> bool {
        while !self.enter_if(OPEN) {
            let v = self.0.load(Ordering::Acquire);
            if v & (CLOSING | CLOSED) != 0 {
                if exempt() {
                    return false;
                }
                self.wait(v);
            }
        }
        true
    }

    fn leave(&self) {
        let before = self.0.fetch_sub(1, Ordering::AcqRel);
        if before & CLOSING != 0 && before & COUNT == 1 {
            self.wake();
        }
    }

    fn close(&self) {
        self.0.fetch_or(CLOSING, Ordering::AcqRel);
        loop {
            match self.0.compare_exchange(CLOSING, CLOSED, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(v) => self.wait(v),
            }
        }
        self.wake();
    }

    fn open(&self) {
        self.0.store(0, Ordering::Release);
        self.wake();
    }

    /// Sleeps while the word is `v`, at most 10 ms (a wake-up lost to a race costs that
    /// much, never a hang).
    fn wait(&self, v: u32) {
        let ts = libc::timespec { tv_sec: 0, tv_nsec: 10_000_000 };
        // SAFETY: FUTEX_WAIT on our own word with a valid timeout; it only sleeps.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.0.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                v,
                &ts as *const libc::timespec,
            );
        }
    }

    fn wake(&self) {
        // SAFETY: FUTEX_WAKE on our own word wakes its waiters, nothing else.
        unsafe {
            libc::syscall(libc::SYS_futex, self.0.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, i32::MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_gate_closes_only_when_busy_sections_end_and_readers_may_enter_while_it_closes() {
        static G: Gate = Gate(AtomicU32::new(0));
        assert!(G.enter_if(OPEN) && G.enter_if(NOT_CLOSED));
        assert_eq!(G.0.load(Ordering::Relaxed), 2);
        let closer = std::thread::spawn(|| G.close());
        while G.0.load(Ordering::Acquire) & CLOSING == 0 {
            std::thread::yield_now();
        }
        assert!(!G.enter_if(OPEN), "closing: new sections wait");
        assert!(G.enter_if(NOT_CLOSED), "closing: a reader may still enter");
        G.leave();
        G.leave();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(G.0.load(Ordering::Acquire), CLOSING | 1, "one section still runs, so the fork waits");
        G.leave();
        closer.join().unwrap();
        assert_eq!(G.0.load(Ordering::Acquire), CLOSED);
        assert!(!G.enter_if(NOT_CLOSED) && !G.enter_if(OPEN), "closed: nobody enters");
        assert!(!G.enter(|| true), "closed: the forking thread goes ahead uncounted");
        assert_eq!(G.0.load(Ordering::Acquire), CLOSED);
        let opener = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            G.open();
        });
        assert!(G.enter(|| false));
        opener.join().unwrap();
        assert_eq!(G.0.load(Ordering::Relaxed), 1, "entered once the fork was done");
        G.leave();
        assert_eq!(G.0.load(Ordering::Relaxed), 0);
    }

    /// A refused entry leaves the count alone, and a guard leaves exactly once.
    #[test]
    fn guards_count_only_the_sections_that_entered() {
        static G: Gate = Gate(AtomicU32::new(0));
        let a = G.try_enter().expect("open");
        let b = G.enter_unless_closed().expect("open");
        assert_eq!(G.0.load(Ordering::Relaxed), 2);
        drop((a, b));
        G.0.store(CLOSED, Ordering::Relaxed);
        for _ in 0..3 {
            assert!(G.try_enter().is_none() && G.enter_unless_closed().is_none());
        }
        assert_eq!(G.0.load(Ordering::Relaxed), CLOSED, "refusals changed nothing");
        G.0.store(CLOSING, Ordering::Relaxed);
        assert!(G.try_enter().is_none());
        let c = G.enter_unless_closed().expect("closing lets a reader in");
        assert_eq!(G.0.load(Ordering::Relaxed), CLOSING | 1);
        drop(c);
        assert_eq!(G.0.load(Ordering::Relaxed), CLOSING);
    }
}
