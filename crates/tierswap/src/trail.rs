//! The trail: the last changes to the region map and the program events behind them, kept
//! in a fixed ring for a hang report. A program that faults forever on an address it still
//! has mapped means the map lost that address's region; the trail says which event cut,
//! moved or displaced what was there, and when ([`crate::Pager::trail_near`]).
//!
//! Owns: the ring. Calls: nothing. Marking takes a mutex and copies a few words into room
//! reserved up front: no allocation, so it is safe on the fault and event paths (docs/design.md, No allocation where a fork waits).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Instant;

/// Marks kept: older ones are dropped.
const TRAIL_LEN: usize = 2048;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum What {
    /// An UNMAP event of `[start, end)` was read.
    Unmap,
    /// A REMAP event of `[start, end)` to `to` was read.
    Remap,
    /// A REMOVE event of `[start, end)` was read.
    Remove,
    /// Region `region` entered the map at `[start, end)`.
    Enter,
    /// `[start, end)` of region `region` was cut from the map (an UNMAP, or a stale extent).
    Cut,
    /// `[start, end)` of region `region` left the map for a REMAP's new range (displaced).
    Displace,
    /// An UNMAP cut nothing in `[start, end)`: an mremap's old range, or a displaced piece.
    Held,
    /// Region `region` was torn down.
    Teardown,
    /// A fault at `start` found no region and no mapping holding one (only woken).
    Stale,
    /// An mremap to `start` could not be followed (its region could not be made).
    RemapFailed,
}

/// One mark.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark {
    at_us: u64,
    what: What,
    start: usize,
    end: usize,
    to: usize,
    region: u64,
}

/// The ring of marks.
pub(crate) struct Trail {
    epoch: Instant,
    ring: Mutex<VecDeque<Mark>>,
}

impl Default for Trail {
    fn default() -> Trail {
        Trail { epoch: Instant::now(), ring: Mutex::new(VecDeque::with_capacity(TRAIL_LEN)) }
    }
}

impl Trail {
    /// Records `what` over `[start, end)` (`to`: a REMAP's destination; `region`: the
    /// region concerned, or 0).
    pub(crate) fn mark(&self, what: What, start: usize, end: usize, to: usize, region: u64) {
        let at_us = self.epoch.elapsed().as_micros() as u64;
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if what == What::Stale {
            // A thread faulting forever on one address would flush the ring: once is enough.
            if ring.iter().rev().take(8).any(|m| m.what == What::Stale && m.start == start) {
                return;
            }
        }
        if ring.len() == TRAIL_LEN {
            ring.pop_front();
        }
        ring.push_back(Mark { at_us, what, start, end, to, region });
    }

    /// The marks touching `[addr - radius, addr + radius)` (a REMAP by either end), oldest
    /// first, one line each.
    pub(crate) fn near(&self, addr: usize, radius: usize) -> Vec<String> {
        let (lo, hi) = (addr.saturating_sub(radius), addr.saturating_add(radius));
        let touches = |a: usize, b: usize| a < hi && lo < b.max(a + 1);
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        ring.iter()
            .filter(|m| touches(m.start, m.end) || (m.what == What::Remap && touches(m.to, m.to + (m.end - m.start))))
            .map(|m| m.describe())
            .collect()
    }
}

impl Mark {
    fn describe(&self) -> String {
        let t = format!("{:>10.3} ms", self.at_us as f64 / 1000.0);
        let range = format!("{:#x}..{:#x}", self.start, self.end);
        match self.what {
            What::Unmap => format!("{t} UNMAP read {range}"),
            What::Remap => format!("{t} REMAP read {range} -> {:#x}", self.to),
            What::Remove => format!("{t} REMOVE read {range}"),
            What::Enter => format!("{t} region {} entered at {range}", self.region),
            What::Cut => format!("{t} region {} cut at {range}", self.region),
            What::Displace => format!("{t} region {} displaced at {range}", self.region),
            What::Held => format!("{t} UNMAP of {range} cut nothing (an mremap's old range or a displaced piece)"),
            What::Teardown => format!("{t} region {} torn down (was at {range})", self.region),
            What::Stale => format!("{t} stale fault at {:#x}: no region, no mapping holding one", self.start),
            What::RemapFailed => format!("{t} mremap to {range} not followed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_finds_what_touched_an_address_and_keeps_the_last_marks() {
        let t = Trail::default();
        t.mark(What::Enter, 0x10000, 0x20000, 0, 7);
        t.mark(What::Remap, 0x10000, 0x20000, 0x90000, 0);
        t.mark(What::Cut, 0x50000, 0x60000, 0, 8);
        let near = t.near(0x98000, 0x1000);
        assert_eq!(near.len(), 1, "{near:?}");
        assert!(near[0].contains("REMAP read 0x10000..0x20000 -> 0x90000"), "{near:?}");
        assert_eq!(t.near(0x15000, 0x1000).len(), 2);
        for i in 0..TRAIL_LEN {
            t.mark(What::Stale, 0x1000_0000 + i * 0x1000, 0, 0, 0);
        }
        assert!(t.near(0x15000, 0x1000).is_empty(), "old marks dropped");
        // A fault repeating on one address is marked once.
        t.mark(What::Stale, 0x7000_0000, 0, 0, 0);
        t.mark(What::Stale, 0x7000_0000, 0, 0, 0);
        assert_eq!(t.near(0x7000_0000, 0x1000).len(), 1);
    }
}
