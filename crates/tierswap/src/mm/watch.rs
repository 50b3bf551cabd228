//! Which fault threads wait on the userfaultfd (`PagerConfig::fault_follow`).
//!
//! A fault wakes every thread polling the userfaultfd. With a fault thread pinned to each
//! CPU (`PagerConfig::fault_pin`), the one on the faulting CPU serves the fault: it runs as
//! soon as the faulting thread sleeps. Waking the others serves nothing, and costs the
//! faulting thread a cross-CPU wake-up per fault (~5 µs in `__wake_up` on the lab's VM) and
//! each other CPU a switch away from what it was running, often the reclaim thread.
//!
//! So while one program thread faults at a time, one fault thread polls: the leader. The
//! others sleep on their bell, an eventfd of their own. The leader follows the program: at
//! most every [`SAMPLE`], after serving, it reads the CPU the thread it served is on
//! (`/proc/self/task/TID/stat`) and, when another fault thread is pinned there, makes that
//! one the leader, rings its bell and steps back. When faults of two program threads come
//! within [`WINDOW_NS`] of each other, every fault thread polls again ([`ALL`]) until
//! [`QUIET_NS`] passes with faults of one thread only; the fault thread that reads the next
//! fault then leads. A leader about to sleep for room hands back to [`ALL`] first, so that
//! its sleep never holds up another program thread's fault. Followers wait on the mirrors'
//! userfaultfd too (a fault there is the pager's own, rare): the leader may be the one
//! that took it.
//!
//! ```text
//!           ALL ──(one program thread faulting for QUIET_NS)──▶ leader = the reader
//!            ▲                                                     │
//!            └──(two program threads within WINDOW_NS, ◀───────────┤
//!                or the leader sleeps for room)                    │
//!                                     leader = the fault thread on the program's CPU
//! ```

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::sys;
use crate::uffd::{self, Event};

/// `leader` when every fault thread polls.
const ALL: usize = usize::MAX;
/// A CPU without a fault thread.
const NONE: usize = usize::MAX;
/// How often a leader looks where the program thread it serves runs.
const SAMPLE: Duration = Duration::from_millis(1);
/// Faults of two program threads this close together: they fault side by side.
const WINDOW_NS: u64 = 10_000_000;
/// How long faults come from one program thread before one fault thread leads.
const QUIET_NS: u64 = 50_000_000;

/// The fault threads' shared state for following the program (see the module doc).
pub(crate) struct Watch {
    /// Following is on (`PagerConfig::fault_follow`, with more than one fault thread).
    on: bool,
    /// The one fault thread polling the userfaultfd, or [`ALL`].
    leader: AtomicUsize,
    /// One eventfd per fault thread: a follower sleeps on its own.
    bells: Vec<OwnedFd>,
    /// The fault thread that runs on each CPU, by CPU number, or [`NONE`].
    by_cpu: Vec<AtomicUsize>,
    /// The program thread of the last fault read, 0 before any.
    last_tid: AtomicU32,
    /// When it was read, in ns since `epoch`.
    last_tid_ns: AtomicU64,
    /// When faults of two program threads last came within `WINDOW_NS`, in ns since `epoch`.
    multi_ns: AtomicU64,
    epoch: Instant,
}

impl Watch {
    /// The state for `threads` fault threads; following only when `follow` and there is
    /// more than one thread to choose from.
    pub(crate) fn new(threads: usize, follow: bool) -> io::Result<Watch> {
        let on = follow && threads > 1;
        let (bells, by_cpu) = if on {
            // CPU numbers may run past the count of CPUs (a sparse set); a CPU past these is
            // one the lead never moves to.
            let cpus = sys::allowed_cpus().ok().and_then(|c| c.last().map(|&c| c + 1)).unwrap_or(sys::online_cpus());
            let bells = (0..threads).map(|_| sys::eventfd()).collect::<io::Result<Vec<_>>>()?;
            (bells, (0..cpus).map(|_| AtomicUsize::new(NONE)).collect())
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(Watch {
            on,
            leader: AtomicUsize::new(ALL),
            bells,
            by_cpu,
            last_tid: AtomicU32::new(0),
            last_tid_ns: AtomicU64::new(0),
            multi_ns: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    /// Records that fault thread `index` runs on the CPU it is on now (called once it is
    /// pinned). The first thread on a CPU is the one that CPU's faults follow.
    pub(crate) fn register(&self, index: usize) {
        if let Some(slot) = sys::current_cpu().and_then(|cpu| self.by_cpu.get(cpu)) {
            let _ = slot.compare_exchange(NONE, index, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Whether fault thread `index` polls the userfaultfd now.
    pub(crate) fn polls(&self, index: usize) -> bool {
        let leader = self.leader.load(Ordering::Acquire);
        leader == ALL || leader == index
    }

    /// Sleeps fault thread `index`, a follower, until its bell rings, `stop` is readable or
    /// the mirrors' userfaultfd `mirror` has a fault to serve (or a while passes: the caller
    /// looks again either way). Says whether `mirror` is readable.
    pub(crate) fn sleep(&self, index: usize, mirror: RawFd, stop: RawFd) -> bool {
        let bell = self.bells[index].as_fd();
        let ready = uffd::poll_fds(&[bell.as_raw_fd(), mirror, stop], 200).unwrap_or(0);
        sys::eventfd_drain(bell);
        ready & 0b010 != 0
    }

    /// Notes the events fault thread `index` has just read: a second program thread's
    /// fault puts every fault thread back on the userfaultfd (returns true when that
    /// happened now); a quiet spell lets `index` lead.
    pub(crate) fn note(&self, index: usize, events: &[Event]) -> bool {
        if !self.on {
            return false;
        }
        let mut released = false;
        let now = self.epoch.elapsed().as_nanos() as u64;
        let mut faults = false;
        for ev in events {
            let Event::PageFault { tid, .. } = *ev else { continue };
            if tid == 0 {
                // No THREAD_ID: nothing to follow, every fault thread polls.
                return false;
            }
            faults = true;
            let last = self.last_tid.swap(tid, Ordering::Relaxed);
            let last_ns = self.last_tid_ns.swap(now, Ordering::Relaxed);
            if last != tid && last != 0 && now.saturating_sub(last_ns) < WINDOW_NS {
                self.multi_ns.store(now, Ordering::Relaxed);
                released |= self.release_all();
            }
        }
        if faults && now.saturating_sub(self.multi_ns.load(Ordering::Relaxed)) > QUIET_NS {
            let _ = self.leader.compare_exchange(ALL, index, Ordering::AcqRel, Ordering::Relaxed);
        }
        released
    }

    /// After fault thread `index` served program thread `tid`: if `index` leads and it is
    /// past `next_look` (the thread's own, moved on by [`SAMPLE`]), hands the lead to the
    /// fault thread on the CPU `tid` is on. Says whether the lead moved.
    pub(crate) fn follow(&self, index: usize, tid: u32, next_look: &mut Instant) -> bool {
        if !self.on || tid == 0 || self.leader.load(Ordering::Relaxed) != index {
            return false;
        }
        let now = Instant::now();
        if now < *next_look {
            return false;
        }
        *next_look = now + SAMPLE;
        let Some(to) = cpu_of(tid).and_then(|cpu| self.by_cpu.get(cpu)).map(|t| t.load(Ordering::Relaxed)) else {
            return false;
        };
        let moved = to != NONE
            && to != index
            && self.leader.compare_exchange(index, to, Ordering::AcqRel, Ordering::Relaxed).is_ok();
        if moved {
            sys::eventfd_ring(self.bells[to].as_fd());
        }
        moved
    }

    /// Every fault thread polls the userfaultfd again. Says whether one led until now.
    pub(crate) fn release_all(&self) -> bool {
        if !self.on {
            return false;
        }
        let was = self.leader.swap(ALL, Ordering::AcqRel);
        if was != ALL {
            for (i, bell) in self.bells.iter().enumerate() {
                if i != was {
                    sys::eventfd_ring(bell.as_fd());
                }
            }
        }
        was != ALL
    }

    /// The fault thread leading now, or `None` when every one polls.
    #[cfg(test)]
    fn leader(&self) -> Option<usize> {
        Some(self.leader.load(Ordering::Acquire)).filter(|&l| l != ALL)
    }
}

/// The CPU program thread `tid` runs on, or last ran on. The file is opened each time (~3 µs,
/// once a millisecond at most): a descriptor kept open could be closed by the program (a
/// daemon closing every descriptor) and its number reused for a file of the program's, which
/// this would then read.
fn cpu_of(tid: u32) -> Option<usize> {
    let f = File::open(format!("/proc/self/task/{tid}/stat")).ok()?;
    // The kernel writes the whole line, ~300 bytes.
    let mut buf = [0u8; 1024];
    let n = f.read_at(&mut buf, 0).ok()?;
    sys::stat_cpu(std::str::from_utf8(&buf[..n]).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(tid: u32) -> Event {
        Event::PageFault { addr: 0x1000, write: false, wp: false, minor: false, tid }
    }

    #[test]
    fn one_program_thread_gets_one_leader_and_a_second_puts_everyone_back() {
        let w = Watch::new(2, true).expect("eventfds");
        assert!(w.polls(0) && w.polls(1) && w.leader().is_none(), "every thread polls at first");
        // Within the first QUIET_NS nothing changes; after it, the reader of a fault leads.
        w.note(1, &[fault(7)]);
        assert!(w.leader().is_none());
        std::thread::sleep(Duration::from_nanos(QUIET_NS + 1_000_000));
        w.note(1, &[fault(7)]);
        assert_eq!(w.leader(), Some(1));
        assert!(w.polls(1) && !w.polls(0));
        // Thread 0's bell is quiet: it would sleep until rung.
        assert_eq!(uffd::poll_fds(&[w.bells[0].as_raw_fd()], 0).unwrap(), 0);
        // The same program thread again: nothing changes.
        assert!(!w.note(1, &[fault(7), fault(7)]));
        assert_eq!(w.leader(), Some(1));
        // Another program thread right after: everyone polls, and thread 0's bell rang.
        assert!(w.note(1, &[fault(8)]));
        assert!(w.leader().is_none());
        assert_eq!(uffd::poll_fds(&[w.bells[0].as_raw_fd()], 0).unwrap(), 1);
        // And it stays so for QUIET_NS, however long one thread faults alone.
        w.note(0, &[fault(8)]);
        assert!(w.leader().is_none());
    }

    #[test]
    fn without_thread_ids_or_with_one_fault_thread_nobody_leads() {
        let mut w = Watch::new(2, true).expect("eventfds");
        w.epoch = Instant::now() - Duration::from_secs(1);
        w.note(0, &[fault(0)]);
        assert!(w.leader().is_none(), "faults without a thread id cannot be followed");
        w.note(0, &[]);
        assert!(w.leader().is_none(), "no fault read: nothing learned");
        let one = Watch::new(1, true).expect("eventfds");
        assert!(!one.note(0, &[fault(7)]));
        assert!(!one.release_all());
        assert!(one.leader().is_none() && one.polls(0));
    }

    #[test]
    fn the_leader_hands_the_lead_to_the_thread_on_the_programs_cpu() {
        let cpus = sys::allowed_cpus().expect("sched_getaffinity");
        let w = Watch::new(2, true).expect("eventfds");
        // Fault thread 1 runs on the last CPU; thread 0 leads.
        let last = *cpus.last().unwrap();
        w.by_cpu[last].store(1, Ordering::Relaxed);
        w.leader.store(0, Ordering::Relaxed);
        // A program thread pinned to that CPU, parked until told to finish.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let program = std::thread::spawn(move || {
            sys::pin_thread(last).expect("sched_setaffinity");
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() } as u32).unwrap();
            rx.recv().unwrap();
        });
        let tid = tid_rx.recv().unwrap();
        let mut look = Instant::now();
        assert!(!w.follow(1, tid, &mut look));
        assert_eq!(w.leader(), Some(0), "only the leader looks");
        assert!(w.follow(0, tid, &mut look));
        assert_eq!(w.leader(), Some(1));
        assert_eq!(uffd::poll_fds(&[w.bells[1].as_raw_fd()], 0).unwrap(), 1, "thread 1 was rung");
        // Thread 1 is on the program's CPU already: it keeps the lead.
        assert!(!w.follow(1, tid, &mut Instant::now()));
        assert_eq!(w.leader(), Some(1));
        tx.send(()).unwrap();
        program.join().unwrap();
        // A leader going to sleep hands back to everyone, and rings the others.
        sys::eventfd_drain(w.bells[0].as_fd());
        assert!(w.release_all());
        assert!(w.leader().is_none());
        assert!(!w.release_all(), "nobody led");
        assert_eq!(uffd::poll_fds(&[w.bells[0].as_raw_fd()], 0).unwrap(), 1);
    }
}
