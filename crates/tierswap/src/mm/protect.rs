//! Pages of a region the program made other than plain read-write: `mprotect` to read-only,
//! none or executable, or a fixed mapping of `PROT_NONE` over part of a reservation (the
//! shim turns that into `MADV_DONTNEED` + `mprotect`, see the preload crate). The kernel
//! keeps the userfaultfd registration across `mprotect`, so such pages stay the region's,
//! but two of the pager's own moves do not fit them:
//! - `UFFDIO_MOVE` wants the source and the mirror to have the same protection: staging a
//!   page there fails with EINVAL, so reclaim leaves it present (quietly);
//! - `UFFDIO_COPY` / `UFFDIO_ZEROPAGE` into a `PROT_NONE` range succeed, so first-touch
//!   fault-around would fill the uncommitted part of a reservation with pages nobody can
//!   touch and reclaim cannot stage: the window stops at the first such page.
//!
//! Swapped-out pages under any protection keep their slots; a later access the protection
//! allows faults and is served as anywhere else (a read into a read-only range is a
//! `UFFDIO_COPY` the kernel installs read-only).
//!
//! Owns: each region's ranges of such pages. Locks: the ranges' mutex (a leaf).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// A region's pages that are not plain read-write, as ranges of page indices.
#[derive(Default)]
pub(crate) struct Protections {
    /// Some range is recorded: a region the program never `mprotect`ed answers without the
    /// lock.
    any: AtomicBool,
    /// First page → end page (exclusive) of each range; ranges neither overlap nor touch.
    /// Guarded by its mutex, taken by the shim's `mprotect` and by reclaim and fault-around
    /// only when `any` is set.
    ranges: Mutex<BTreeMap<usize, usize>>,
}

impl Protections {
    /// Records pages `[from, to)` as plain read-write (`rw`) or not.
    pub(crate) fn set(&self, from: usize, to: usize, rw: bool) {
        if from >= to || (rw && !self.any.load(Ordering::Acquire)) {
            return;
        }
        let mut m = self.ranges.lock().unwrap_or_else(|e| e.into_inner());
        // Cut [from, to) out of every range it overlaps or touches, keeping the outside parts.
        let mut lo = from;
        let mut hi = to;
        let touching: Vec<(usize, usize)> =
            m.range(..=to).rev().take_while(|(_, &e)| e >= from).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in touching {
            m.remove(&s);
            if rw {
                if s < from {
                    m.insert(s, from);
                }
                if e > to {
                    m.insert(to, e);
                }
            } else {
                lo = lo.min(s);
                hi = hi.max(e);
            }
        }
        if !rw {
            m.insert(lo, hi);
        }
        self.any.store(!m.is_empty(), Ordering::Release);
    }

    /// The first page in `[from, to)` that is not plain read-write, if any.
    pub(crate) fn first_in(&self, from: usize, to: usize) -> Option<usize> {
        if from >= to || !self.any.load(Ordering::Acquire) {
            return None;
        }
        let m = self.ranges.lock().unwrap_or_else(|e| e.into_inner());
        // A range starting before `from` that reaches past it, else the first one starting
        // inside.
        if let Some((_, &e)) = m.range(..=from).next_back() {
            if e > from {
                return Some(from);
            }
        }
        m.range(from..to).next().map(|(&s, _)| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(p: &Protections) -> Vec<(usize, usize)> {
        p.ranges.lock().unwrap().iter().map(|(&s, &e)| (s, e)).collect()
    }

    #[test]
    fn ranges_merge_split_and_answer() {
        let p = Protections::default();
        assert_eq!(p.first_in(0, 100), None);
        p.set(10, 20, true); // read-write on nothing recorded: nothing
        assert!(!p.any.load(Ordering::Relaxed));
        p.set(10, 20, false);
        p.set(30, 40, false);
        assert_eq!(ranges(&p), vec![(10, 20), (30, 40)]);
        p.set(20, 30, false); // touching both: one range
        assert_eq!(ranges(&p), vec![(10, 40)]);
        p.set(15, 25, true); // a hole
        assert_eq!(ranges(&p), vec![(10, 15), (25, 40)]);
        assert_eq!(p.first_in(0, 10), None);
        assert_eq!(p.first_in(0, 11), Some(10));
        assert_eq!(p.first_in(12, 100), Some(12));
        assert_eq!(p.first_in(15, 25), None);
        assert_eq!(p.first_in(15, 26), Some(25));
        assert_eq!(p.first_in(39, 50), Some(39));
        assert_eq!(p.first_in(40, 50), None);
        p.set(5, 50, false); // covering all
        assert_eq!(ranges(&p), vec![(5, 50)]);
        p.set(0, 100, true);
        assert_eq!(ranges(&p), vec![]);
        assert!(!p.any.load(Ordering::Relaxed));
        assert_eq!(p.first_in(0, 100), None);
    }

    /// Against a plain array of flags, over many random sets.
    #[test]
    fn ranges_match_a_page_by_page_model() {
        let p = Protections::default();
        let mut model = [true; 64];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let a = (x % 64) as usize;
            let b = ((x >> 8) % 65) as usize;
            let rw = (x >> 20) & 1 == 1;
            let (from, to) = (a.min(b), a.max(b));
            p.set(from, to, rw);
            model[from..to].iter_mut().for_each(|f| *f = rw);
            let c = (x >> 24) as usize % 64;
            let d = c + (x >> 32) as usize % (65 - c);
            let want = (c..d).find(|&i| !model[i]);
            assert_eq!(p.first_in(c, d), want, "first_in({c}, {d}) after set({from}, {to}, {rw})");
            let rs = ranges(&p);
            assert!(rs.windows(2).all(|w| w[0].1 < w[1].0), "ranges overlap or touch: {rs:?}");
        }
    }
}
