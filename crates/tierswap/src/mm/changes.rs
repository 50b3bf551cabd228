//! How the map follows the program's mremaps while their events are on the way: the old
//! ranges whose trailing UNMAP is still to come ([`RemappedFrom`]) and the stale extents a
//! REMAP's new range displaced ([`Displaced`]). events/mod.rs has the ordering rules.
//!
//! Owns: those two lists. Calls: the region map, teardown.

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::region::{Piece, RegionInner};
use super::teardown::teardown;
use super::Shared;
use crate::page::{pages_to_bytes, PAGE_SIZE};

/// The old ranges of mremaps whose trailing UNMAP is not handled yet. The kernel follows a
/// REMAP with an UNMAP of the range the mapping left, queued once the REMAP is read: a
/// region entered there in between would be cut by it (`Shared::claim_range` waits).
#[derive(Debug, Default)]
pub(crate) struct RemappedFrom(Mutex<Vec<(usize, usize, Instant)>>);

impl RemappedFrom {
    /// How long a range waits for its UNMAP. None comes for MREMAP_DONTUNMAP, whose old
    /// range stays mapped (so no new mapping can be made there anyway).
    pub(crate) const WAIT: Duration = Duration::from_secs(5);

    /// An mremap moved `[start, end)` away (its REMAP is being handled).
    pub(crate) fn moved(&self, start: usize, end: usize, now: Instant) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push((start, end, now));
    }

    /// `[start, end)` was unmapped: the old ranges it overlaps have had their UNMAP.
    /// Returns them: nothing the map holds there now is the old mapping's (a REMAP's new
    /// range may have taken the address since), so the UNMAP cuts nothing there.
    pub(crate) fn unmapped(&self, start: usize, end: usize) -> Vec<(usize, usize)> {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut gone: Vec<(usize, usize)> =
            v.iter().filter(|&&(a, b, _)| a < end && start < b).map(|&(a, b, _)| (a, b)).collect();
        v.retain(|&(a, b, _)| b <= start || end <= a);
        gone.sort_unstable();
        gone
    }

    /// Whether `[start, end)` overlaps an old range still waiting for its UNMAP.
    pub(crate) fn pending(&self, start: usize, end: usize, now: Instant) -> bool {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|&(_, _, t)| now.saturating_duration_since(t) < Self::WAIT);
        v.iter().any(|&(a, b, _)| a < end && start < b)
    }
}

/// Pieces of regions a REMAP's new range displaced from the map before their own UNMAP /
/// REMAP came (events/mod.rs, ordering rules). A piece keeps its ptes (its slots and staged
/// pages are still the old region's) and one `leaving` mark on its region, so nothing is
/// installed for it at addresses the new region holds now, until that event takes it.
#[derive(Default)]
pub(crate) struct Displaced(Mutex<Vec<DisplacedPiece>>);

pub(crate) struct DisplacedPiece {
    /// The program address of page `piece.lo`.
    pub(crate) start: usize,
    pub(crate) piece: Piece,
}

impl DisplacedPiece {
    pub(crate) fn end(&self) -> usize {
        self.start + pages_to_bytes(self.piece.hi - self.piece.lo)
    }
}

impl Displaced {
    /// Displaces `piece` (cut from the map at `start`): its region stays leaving.
    pub(crate) fn push(&self, start: usize, piece: Piece) {
        piece.region.leaving.fetch_add(1, Ordering::AcqRel);
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(DisplacedPiece { start, piece });
    }

    /// Takes the parts of displaced pieces within `[start, end)`, in address order; the
    /// parts outside stay displaced. Each part taken carries a `leaving` mark the caller
    /// gives back ([`Displaced::done`]) once it has dealt with the pages.
    pub(crate) fn take(&self, start: usize, end: usize) -> Vec<DisplacedPiece> {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut taken = Vec::new();
        let mut i = 0;
        while i < v.len() {
            if v[i].end() <= start || end <= v[i].start {
                i += 1;
                continue;
            }
            let d = v.swap_remove(i);
            let (a, b) = (d.start.max(start), d.end().min(end));
            let page = |addr: usize| d.piece.lo + (addr - d.start) / PAGE_SIZE;
            let part = |from: usize, to: usize| DisplacedPiece {
                start: from,
                piece: Piece { region: d.piece.region.clone(), lo: page(from), hi: page(to) },
            };
            for (from, to) in [(d.start, a), (b, d.end())] {
                if from < to {
                    d.piece.region.leaving.fetch_add(1, Ordering::AcqRel);
                    v.push(part(from, to));
                }
            }
            // The taken part carries the mark `d` held.
            taken.push(part(a, b));
        }
        taken.sort_by_key(|d| d.start);
        taken
    }

    /// Whether a piece of `r` is still displaced (its region must not be torn down yet).
    pub(crate) fn holds(&self, r: &RegionInner) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|d| d.piece.region.id == r.id)
    }

    /// A taken part is dealt with: its region is no longer leaving on its account, and is
    /// torn down if nothing of it is left.
    pub(crate) fn done(&self, s: &Shared, d: DisplacedPiece) {
        let r = &d.piece.region;
        r.leaving.fetch_sub(1, Ordering::AcqRel);
        if r.extents.load(Ordering::Acquire) == 0 && !self.holds(r) {
            teardown(s, r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RemappedFrom;
    use std::time::{Duration, Instant};

    #[test]
    fn a_moved_range_is_pending_until_an_unmap_over_it_or_the_wait_ends() {
        let t0 = Instant::now();
        let r = RemappedFrom::default();
        r.moved(0x10000, 0x20000, t0);
        r.moved(0x50000, 0x60000, t0);
        assert!(r.pending(0x1f000, 0x30000, t0), "overlaps the first");
        assert!(!r.pending(0x20000, 0x50000, t0), "between the two: touches neither");
        assert_eq!(r.unmapped(0x18000, 0x19000), vec![(0x10000, 0x20000)], "the whole old range is the UNMAP's");
        assert!(!r.pending(0x10000, 0x20000, t0), "an UNMAP over part of it ends the wait");
        assert!(r.pending(0x50000, 0x51000, t0), "the other still waits");
        assert!(r.pending(0x50000, 0x51000, t0 + RemappedFrom::WAIT - Duration::from_millis(1)));
        assert!(!r.pending(0x50000, 0x51000, t0 + RemappedFrom::WAIT), "no UNMAP came: forgotten");
        assert!(!r.pending(0x50000, 0x51000, t0), "and gone for good");
    }
}
