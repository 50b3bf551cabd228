//! Grants: a forked child's own pager takes over, piece by piece, the memory it inherited.
//!
//! Thread mode, in a tree. A forked child's own pager (started at its first need) links to
//! the server of its parent's pager (events/fork.rs, `link_to_parent`). From then on the
//! server hands that pager the inherited memory the child takes in, a *piece* at a time (a
//! page-table chunk of a region in use at the fork: 2 MiB at most). A piece is due once the
//! fork-time pages the server still holds there are at most [`GRANT_PULL`] for each fault
//! the child took there, and one more, or at its first fault while what the child was given
//! and no pager counts passes half its share; pieces due at the link that the child never
//! touched go after the others, a few at a time ([`DEFERRED_RUN_PIECES`]). The server
//! installs the rest of the piece, unregisters it from the child's userfaultfd and sends
//! `[start, len]` (events/fork.rs, `grant`); the child's
//! `tierswap-adopt` thread ([`serve_grants`]) registers it with its own pager
//! (`Shared::adopt_inherited`), which counts, evicts and serves it from then on.
//!
//! Owns: [`Pieces`], a server's account of one child's pieces (the server thread's alone,
//! no lock); the pace of a server's installs ([`wait_for_child_room`]); the child's thread
//! that takes grants. Calls: the tree's ledger (a child's share), `mm` (`adopt_inherited`),
//! `sys` sockets.
//!
//! ```text
//!  grant (server → child, on the child's link): | start | len |   2 × u64
//! ```

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::mm::Shared;
use crate::page::PAGE_SIZE;
use crate::sys;
use crate::uffd;

/// A piece is granted once the fork-time pages the server still has there are at most
/// `GRANT_PULL` for each fault the child took there, and one more: taking the rest over
/// costs at most this many reads a fault, and a piece with a few left is granted without a
/// fault. A child reading in random order (a redis BGSAVE walks its dict) filled every
/// piece halfway before the first was due when a piece waited for half: it held 64 MiB
/// given and not granted against a share of 6. Python workers never faulted in pieces
/// where the server held 10–13 pages the program no longer used, but wrote (reference
/// counts) every page the parent had there: without the one more, 39 such pieces of each
/// worker stayed with the server, their copies counted nowhere.
pub(crate) const GRANT_PULL: usize = 32;

/// Pieces granted in one run at most (a region of the child's pager each run: 256 MiB).
pub(crate) const GRANT_MAX_PIECES: usize = 128;

/// Pieces due when the child links that it never faulted in (the parent's resident memory,
/// which the child shares copy-on-write) are granted later, in runs of at most this many
/// (16 MiB): the child's pager takes grants one at a time, in order, and taking over all of
/// them at once (283 MiB for a forking server's child of a parent holding 256 MiB) kept
/// the pieces the child was reading waiting behind them for 300 ms, their pages counted by
/// no pager while the child read 40 MiB.
pub(crate) const DEFERRED_RUN_PIECES: usize = 8;

/// A run of deferred pieces goes when the child's userfaultfd has been quiet this long, or
/// at most this long after the last run while it is busy.
pub(crate) const DEFERRED_QUIET: Duration = Duration::from_millis(10);

/// See [`DEFERRED_QUIET`].
pub(crate) const DEFERRED_BUSY: Duration = Duration::from_millis(50);

/// Longest a fault of a child with a pager of its own waits for that pager to make room.
const ROOM_WAIT: Duration = Duration::from_millis(5);

/// A server's account of the inherited memory of one child not granted yet.
#[derive(Clone, Default)]
pub(crate) struct Pieces {
    /// First address → each piece not granted (within one region and one page-table chunk
    /// of it; only chunks in use at the fork).
    spans: BTreeMap<usize, Piece>,
    /// Pages installed in all of them: resident in the child and counted by no pager of
    /// the tree until their grant.
    ungranted: usize,
}

/// One piece of [`Pieces`].
#[derive(Clone, Copy)]
struct Piece {
    end: usize,
    /// Faults served in it.
    faults: u32,
    /// Pages installed in it.
    installed: u32,
}

impl Pieces {
    /// A piece `[lo, hi)` of memory the child inherited, in use at the fork.
    pub(crate) fn add(&mut self, lo: usize, hi: usize) {
        self.spans.insert(lo, Piece { end: hi, faults: 0, installed: 0 });
    }

    /// The same pieces, with no fault or install counted (a grandchild's, at its fork).
    pub(crate) fn for_fork(&self) -> Pieces {
        let spans = self.spans.iter().map(|(&lo, p)| (lo, Piece { end: p.end, faults: 0, installed: 0 })).collect();
        Pieces { spans, ungranted: 0 }
    }

    /// The piece holding `addr`, if it is not granted yet.
    pub(crate) fn of(&self, addr: usize) -> Option<(usize, usize)> {
        self.spans.range(..=addr).next_back().filter(|(_, p)| p.end > addr).map(|(&lo, p)| (lo, p.end))
    }

    /// Every piece not granted yet, in address order.
    pub(crate) fn all(&self) -> Vec<(usize, usize)> {
        self.spans.iter().map(|(&lo, p)| (lo, p.end)).collect()
    }

    /// The child unmapped or moved `[start, end)`: no piece there is granted.
    pub(crate) fn cut(&mut self, start: usize, end: usize) {
        let hit: Vec<(usize, usize)> =
            self.spans.range(..end).rev().take_while(|(_, p)| p.end > start).map(|(&lo, p)| (lo, p.end)).collect();
        for (lo, hi) in hit {
            self.remove(lo);
            if lo < start {
                self.add(lo, start);
            }
            if hi > end {
                self.add(end, hi);
            }
        }
    }

    /// Piece `lo` is granted or gone: its counts go.
    pub(crate) fn remove(&mut self, lo: usize) {
        if let Some(p) = self.spans.remove(&lo) {
            self.ungranted -= p.installed as usize;
        }
    }

    /// A page was installed at `addr`: counted for its piece, if it is not granted yet.
    pub(crate) fn note_installed(&mut self, addr: usize) {
        if let Some((lo, _)) = self.of(addr) {
            if let Some(p) = self.spans.get_mut(&lo) {
                p.installed += 1;
                self.ungranted += 1;
            }
        }
    }

    /// A fault of the child's in piece `lo` was served.
    pub(crate) fn note_fault(&mut self, lo: usize) {
        if let Some(p) = self.spans.get_mut(&lo) {
            p.faults += 1;
        }
    }

    /// Whether the child faulted in piece `lo`, or was given a page there.
    pub(crate) fn touched(&self, lo: usize) -> bool {
        self.spans.get(&lo).is_some_and(|p| p.faults > 0 || p.installed > 0)
    }

    /// Bytes installed in pieces not granted yet.
    pub(crate) fn ungranted_bytes(&self) -> u64 {
        (self.ungranted * PAGE_SIZE) as u64
    }

    /// Whether piece `lo`, where the server still holds `left` fork-time pages, is due: at
    /// most [`GRANT_PULL`] of them left for each fault there, and one more.
    pub(crate) fn due(&self, lo: usize, left: usize) -> bool {
        left <= (self.spans.get(&lo).map_or(0, |p| p.faults) as usize + 1) * GRANT_PULL
    }
}

/// Before installing a page in child `pid` whose own pager takes over what it reads: while
/// that pager is half as much again over its share, counting the `ungranted` bytes the
/// child was given and no pager counts yet, waits (up to [`ROOM_WAIT`]) for it to evict, as
/// its own faults would wait for room. Children reading what they inherited at once (three
/// readers and a grandchild on two CPUs) otherwise outran their pagers' reclaim now and
/// then (the tree's PSS peaked at 47–50 MiB in 2 runs of 9 under 16 MiB, 33–37 in the
/// others). Waiting as soon as a child was over its share, and up to 20 ms, made a redis
/// BGSAVE (whose child sits at its share throughout) 3× slower for the same peaks.
pub(crate) fn wait_for_child_room(s: &Shared, pid: u32, ungranted: u64) {
    let Some(t) = &s.tree else { return };
    let start = Instant::now();
    while t.member(pid).is_some_and(|(footprint, target)| footprint + ungranted > target + target / 2)
        && start.elapsed() < ROOM_WAIT
    {
        s.counters.child_room_waits.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Whether what child `pid` was given and no pager counts (`ungranted` bytes) passes half
/// its share: a piece is then granted at its first fault.
pub(crate) fn crowded(s: &Shared, pid: u32, ungranted: u64) -> bool {
    s.tree.as_ref().and_then(|t| t.member(pid)).is_some_and(|(_, target)| ungranted > target / 2)
}

/// The grant message for `[lo, hi)`.
pub(crate) fn message(lo: usize, hi: usize) -> [u8; 16] {
    let mut msg = [0u8; 16];
    msg[..8].copy_from_slice(&(lo as u64).to_ne_bytes());
    msg[8..].copy_from_slice(&((hi - lo) as u64).to_ne_bytes());
    msg
}

/// In a forked child whose own pager `s` linked to its parent's server: takes over every
/// range the server grants, until the link closes (the parent's pager is gone) or the pager
/// stops. A grant it cannot take over (the program unmapped part of it meanwhile) stays
/// plain memory: the server has installed every page it held there.
pub(crate) fn serve_grants(s: &Shared, link: OwnedFd) {
    let mut buf = [0u8; 16];
    loop {
        if s.wake.shutdown.load(Ordering::Acquire) {
            return;
        }
        let ready = match uffd::poll_fds(&[link.as_raw_fd(), s.wake.stop_fd.as_raw_fd()], -1) {
            Ok(r) => r,
            Err(_) => return,
        };
        if ready & 0b10 != 0 {
            return;
        }
        if ready & 1 == 0 {
            continue;
        }
        match sys::recv_msg(link.as_raw_fd(), &mut buf, true) {
            Ok((16, _)) => {
                let start = u64::from_ne_bytes(buf[..8].try_into().unwrap_or([0; 8])) as usize;
                let len = u64::from_ne_bytes(buf[8..].try_into().unwrap_or([0; 8])) as usize;
                // Refused: counted, and the memory stays as it is (nothing to tell the
                // program: its pages are all there).
                if s.adopt_inherited(start, len).is_err() {
                    s.counters.adopt_refused.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok((0, _)) => return,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn cutting_keeps_the_outside_parts_and_drops_their_counts() {
        let mut p = Pieces::default();
        p.add(0, 2 * MIB);
        p.add(2 * MIB, 4 * MIB);
        p.add(8 * MIB, 9 * MIB);
        p.note_installed(MIB);
        p.note_installed(3 * MIB);
        p.note_installed(8 * MIB);
        p.note_fault(2 * MIB);
        assert_eq!(p.ungranted_bytes(), 3 * PAGE_SIZE as u64);
        // An unmap over the end of the first piece and the start of the second.
        p.cut(MIB + PAGE_SIZE, 3 * MIB);
        assert_eq!(p.all(), vec![(0, MIB + PAGE_SIZE), (3 * MIB, 4 * MIB), (8 * MIB, 9 * MIB)]);
        // The cut pieces' counts went with them; the untouched one keeps its own.
        assert_eq!(p.ungranted_bytes(), PAGE_SIZE as u64);
        assert_eq!(p.of(3 * MIB), Some((3 * MIB, 4 * MIB)));
        assert_eq!(p.of(2 * MIB), None);
        assert!(p.due(3 * MIB, GRANT_PULL) && !p.due(3 * MIB, GRANT_PULL + 1), "a fresh piece: a few left");
        p.remove(8 * MIB);
        assert_eq!(p.ungranted_bytes(), 0);
        assert_eq!(p.of(8 * MIB), None);
    }

    #[test]
    fn a_piece_is_due_once_its_faults_cover_a_share_of_what_is_left() {
        let mut p = Pieces::default();
        p.add(0, 2 * MIB);
        assert!(!p.due(0, 512));
        for _ in 0..14 {
            p.note_fault(0);
        }
        assert!(!p.due(0, 15 * GRANT_PULL + 1));
        p.note_fault(0);
        assert!(p.due(0, 16 * GRANT_PULL) && p.due(0, 500));
        let g = p.for_fork();
        assert_eq!(g.all(), p.all());
        assert!(!g.due(0, GRANT_PULL + 1), "a grandchild's pieces start with no fault counted");
    }

    #[test]
    fn a_piece_is_touched_once_the_child_faulted_or_was_given_a_page_there() {
        let mut p = Pieces::default();
        p.add(0, 2 * MIB);
        p.add(2 * MIB, 4 * MIB);
        p.add(4 * MIB, 6 * MIB);
        p.note_fault(0);
        p.note_installed(3 * MIB);
        assert!(p.touched(0) && p.touched(2 * MIB) && !p.touched(4 * MIB));
        assert!(!p.for_fork().touched(0), "a grandchild has touched nothing yet");
        p.remove(0);
        assert!(!p.touched(0), "granted: no piece there");
    }
}
