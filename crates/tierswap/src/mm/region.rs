//! Regions: one managed range and its mirror ([`RegionInner`]) and the map from addresses
//! to regions ([`RegionMap`]).
//!
//! Owns: regions and their map. Calls: the page table, the policies' per-region state.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::Shared;
use crate::config::Hint;
use crate::page::{pages_to_bytes, PAGE_SIZE};
use crate::pagetable::PageTable;
use crate::policy::admission::Locality;
use crate::policy::readahead::Readahead;

/// One managed range and its mirror.
pub(crate) struct RegionInner {
    pub(crate) id: u64,
    /// First byte of the program's range.
    pub(crate) start: usize,
    /// First byte of the mirror (staging) range.
    pub(crate) mirror: usize,
    pub(crate) n_pages: usize,
    pub(crate) hint: Hint,
    pub(crate) ptes: PageTable,
    /// CLOCK hand, in 64 KiB blocks.
    pub(crate) clock_block: AtomicUsize,
    /// Set when the region is being torn down: reclaim leaves it alone.
    pub(crate) dead: AtomicBool,
    /// Read-held by each evictor (the reclaim thread, a direct reclaimer) while it changes
    /// the region, which the pte locks keep apart page by page; write-held by teardown and
    /// by the forced whole-region passes (`evict_all`, `stage_all`).
    pub(crate) reclaim_lock: RwLock<()>,
    /// The readahead window of disk faults in this region.
    pub(crate) ra: Readahead,
    /// Recent swap-in streams: the evidence for large swap-in.
    pub(crate) locality: Locality,
    /// The stride of lone faults, for stride prefetch.
    pub(crate) stride: Mutex<crate::policy::stride::Stride>,
    /// Where a first-touch fault would continue the last one's run (first-touch
    /// fault-around; `usize::MAX`: none yet).
    pub(crate) first_touch_next: AtomicUsize,
    /// First-touch fault-around's window, in pages (0: none yet).
    pub(crate) first_touch_window: AtomicUsize,
    /// Registered for write-protect faults: pages may come back clean, keeping their slot.
    pub(crate) clean_tracking: bool,
    /// The 64 KiB block of the region's last write fault on a clean page (`usize::MAX`:
    /// none yet), for `wp_block_adapt` ([`crate::policy::writes::Writes::note_write_fault`]).
    pub(crate) wp_last_block: AtomicUsize,
    /// Where the region's last fault on a staged page left off: the page it brought back
    /// last (`usize::MAX`: none yet), for `staged_around_adapt` (`fault/staged.rs`).
    pub(crate) staged_last_page: AtomicUsize,
    /// Owned by the program (munmap tears it down), not by a [`Region`] handle.
    #[allow(dead_code)]
    pub(crate) detached: bool,
    /// Live extents of the program's range in the [`RegionMap`] (map lock held to change).
    pub(crate) extents: AtomicUsize,
    /// Torn down: its mirror is gone and nothing may touch it any more.
    pub(crate) gone: AtomicBool,
    /// Holds on this range besides the events in hand (`marked_in`): one for each piece
    /// an mremap displaced until it is settled, and one for good once its [`Region`] is
    /// dropped. While either says so ([`Shared::is_leaving`]), nothing is installed in the
    /// program's range and nothing is moved out of it.
    pub(crate) leaving: AtomicU32,
    /// The batch of events ([`Gates::event_batch`](super::Gates::event_batch)) whose read marked this range leaving
    /// too, until that batch is handled; 0: none.
    pub(crate) marked_in: AtomicU64,
    /// Pages the program made other than plain read-write (see [`super::protect`]).
    pub(crate) protections: super::protect::Protections,
    /// Inherited memory only: resident pages still shared copy-on-write with the parent
    /// when last looked at (None in `ptes`, counted in the parent), which become this
    /// process's alone once the parent writes or drops its copy
    /// ([`Shared::take_unshared_inherited`](super::Shared::take_unshared_inherited)).
    pub(crate) shared_inherited: AtomicUsize,
}

impl RegionInner {
    pub(crate) fn len_bytes(&self) -> usize {
        pages_to_bytes(self.n_pages)
    }

    pub(crate) fn page_addr(&self, idx_page: usize) -> usize {
        self.start + pages_to_bytes(idx_page)
    }

    pub(crate) fn mirror_addr(&self, idx_page: usize) -> usize {
        self.mirror + pages_to_bytes(idx_page)
    }
}

/// Where a faulting address is.
pub(crate) enum Lookup {
    /// In a region's program range, at this page.
    Region(Arc<RegionInner>, usize),
    /// Nowhere we manage (a region already gone).
    Unknown,
}

/// The live program ranges, by address and by region id.
///
/// An extent is a run of a region's program range that is still mapped: a region starts
/// as one extent; a partial munmap shrinks or splits it; a region whose last extent goes
/// is torn down. Extents never overlap, so the one holding an address is the last one
/// starting at or below it.
#[derive(Default)]
pub(crate) struct RegionMap {
    /// First byte → (end byte, region).
    extents: BTreeMap<usize, (usize, Arc<RegionInner>)>,
    pub(crate) by_id: HashMap<u64, Arc<RegionInner>>,
}

/// A piece of a region cut out of the map: pages `[lo, hi)` of `region`.
pub(crate) struct Piece {
    pub(crate) region: Arc<RegionInner>,
    pub(crate) lo: usize,
    pub(crate) hi: usize,
}

impl RegionMap {
    /// The regions with a live extent overlapping `[start, end)`, from the highest address
    /// down (a region once per extent). Allocates nothing: used while a fork may hold
    /// malloc's locks (`Shared::read_program_events`).
    pub(crate) fn regions_overlapping(&self, start: usize, end: usize) -> impl Iterator<Item = &RegionInner> {
        self.extents.range(..end).rev().take_while(move |(_, (e, _))| *e > start).map(|(_, (_, r))| &**r)
    }

    /// The region whose live extent holds `addr`.
    pub(crate) fn find(&self, addr: usize) -> Option<Arc<RegionInner>> {
        let (_, (end, r)) = self.extents.range(..=addr).next_back()?;
        (addr < *end).then(|| r.clone())
    }

    /// Adds a region as one extent covering its whole program range. The caller has made
    /// sure nothing overlaps it (`Shared::claim_range`, the REMAP handler's displacement):
    /// an overlap would hide one region behind the other, so it is reported.
    pub(crate) fn insert(&mut self, r: Arc<RegionInner>) {
        let (start, end) = (r.start, r.start + r.len_bytes());
        for p in self.overlapping(start, end) {
            eprintln!(
                "tierswap: internal error: the new region {} at {start:#x}..{end:#x} overlaps pages {}..{} of region {} in the map",
                r.id, p.lo, p.hi, p.region.id
            );
        }
        self.insert_extent(start, end, &r);
        self.by_id.insert(r.id, r);
    }

    fn insert_extent(&mut self, start: usize, end: usize, r: &Arc<RegionInner>) {
        r.extents.fetch_add(1, Ordering::Relaxed);
        self.extents.insert(start, (end, r.clone()));
    }

    /// Cuts `[start, end)` out of every extent it overlaps; returns the pieces cut, in
    /// address order, and drops regions left without an extent from `by_id` (the caller
    /// tears those down: `piece.region.extents` is 0).
    pub(crate) fn cut(&mut self, start: usize, end: usize) -> Vec<Piece> {
        let mut hit = Vec::new();
        for (&s, &(e, ref r)) in self.extents.range(..end).rev() {
            if e <= start {
                break;
            }
            hit.push((s, e, r.clone()));
        }
        hit.reverse();
        let mut pieces = Vec::with_capacity(hit.len());
        for (s, e, r) in hit {
            self.extents.remove(&s);
            r.extents.fetch_sub(1, Ordering::Relaxed);
            if s < start {
                self.insert_extent(s, start, &r);
            }
            if e > end {
                self.insert_extent(end, e, &r);
            }
            let (cs, ce) = (s.max(start), e.min(end));
            pieces.push(Piece { lo: (cs - r.start) / PAGE_SIZE, hi: (ce - r.start) / PAGE_SIZE, region: r.clone() });
            if r.extents.load(Ordering::Relaxed) == 0 {
                self.by_id.remove(&r.id);
            }
        }
        pieces
    }

    /// The pieces of live extents overlapping `[start, end)`, in address order (the map
    /// unchanged).
    pub(crate) fn overlapping(&self, start: usize, end: usize) -> Vec<Piece> {
        let mut pieces: Vec<Piece> = self
            .extents
            .range(..end)
            .rev()
            .take_while(|(_, (e, _))| *e > start)
            .map(|(&s, &(e, ref r))| Piece {
                lo: (s.max(start) - r.start) / PAGE_SIZE,
                hi: (e.min(end) - r.start) / PAGE_SIZE,
                region: r.clone(),
            })
            .collect();
        pieces.reverse();
        pieces
    }

    /// The live extents of region `id`, as (first byte, end byte).
    pub(crate) fn extents_of(&self, r: &RegionInner) -> Vec<(usize, usize)> {
        self.extents
            .range(r.start..r.start + r.len_bytes())
            .filter(|(_, (_, x))| x.id == r.id)
            .map(|(&s, &(e, _))| (s, e))
            .collect()
    }
}

impl Shared {}
