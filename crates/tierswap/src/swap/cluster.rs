//! Clusters: 512 consecutive slots, the unit of slot allocation and of per-cluster
//! metadata. A header of 80 bytes per cluster (0.16 B per slot) holds the use count, the
//! cluster's place in the allocator, its fill sequence (its age for writeback) and a bitmap
//! of which slots are in an in-memory backend, so "is this 64K range all in memory?" is a
//! few word operations.

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// Slots per cluster.
pub const SLOTS_PER_CLUSTER: usize = 512;

/// Where a cluster is in the allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ClusterState {
    /// Not in use; its swap table page is released.
    Free = 0,
    /// Some lane allocates from it.
    Current = 1,
    /// Has free slots, not current.
    Nonfull = 2,
    /// Every slot allocated.
    Full = 3,
}

impl ClusterState {
    pub(crate) fn from_u8(v: u8) -> ClusterState {
        match v {
            1 => ClusterState::Current,
            2 => ClusterState::Nonfull,
            3 => ClusterState::Full,
            _ => ClusterState::Free,
        }
    }
}

/// Per-cluster metadata. All fields are atomics so that the fault path reads them without
/// the allocator lock; list moves happen under it.
#[repr(C, align(16))]
pub struct ClusterHeader {
    /// Allocated slots.
    pub used: AtomicU16,
    /// A [`ClusterState`].
    pub state: AtomicU8,
    _pad: u8,
    /// Owner (memcg analogue); 0 = none.
    pub tenant: AtomicU16,
    _pad2: u16,
    /// Fill sequence: when it last stopped being current (its age for writeback).
    pub seq: AtomicU32,
    /// The swap space's eviction clock when a slot was last allocated here (workingset:
    /// the eviction time of the cluster's newest page; 0 = never).
    pub evict_stamp: AtomicU32,
    /// Bit `i` set: slot `i` is in an in-memory backend (zero, same-filled, pool).
    pub in_memory: [AtomicU64; SLOTS_PER_CLUSTER / 64],
}

/// Bytes of one cluster header.
pub const CLUSTER_HEADER_BYTES: usize = std::mem::size_of::<ClusterHeader>();
const _: () = assert!(
    CLUSTER_HEADER_BYTES <= 128,
    "≤ 128 B per cluster header (docs/design.md, Clusters and the virtual swap space)"
);

impl ClusterHeader {
    /// The allocator state.
    pub fn state(&self) -> ClusterState {
        ClusterState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn set_state(&self, s: ClusterState) {
        self.state.store(s as u8, Ordering::Release);
    }

    /// Marks slot `off` in memory or not.
    pub fn set_in_memory(&self, off: usize, in_memory: bool) {
        let (w, b) = (off / 64, off % 64);
        if in_memory {
            self.in_memory[w].fetch_or(1 << b, Ordering::Relaxed);
        } else {
            self.in_memory[w].fetch_and(!(1 << b), Ordering::Relaxed);
        }
    }

    /// Whether slots `off .. off + n` (within the cluster) are all in memory.
    pub fn all_in_memory(&self, off: usize, n: usize) -> bool {
        debug_assert!(off + n <= SLOTS_PER_CLUSTER);
        let mut i = off;
        let end = off + n;
        while i < end {
            let (w, b) = (i / 64, i % 64);
            let take = (64 - b).min(end - i);
            let mask = if take == 64 { u64::MAX } else { ((1u64 << take) - 1) << b };
            if self.in_memory[w].load(Ordering::Relaxed) & mask != mask {
                return false;
            }
            i += take;
        }
        true
    }

    pub(crate) fn reset(&self) {
        self.used.store(0, Ordering::Relaxed);
        self.tenant.store(0, Ordering::Relaxed);
        self.seq.store(0, Ordering::Relaxed);
        self.evict_stamp.store(0, Ordering::Relaxed);
        for w in &self.in_memory {
            w.store(0, Ordering::Relaxed);
        }
        self.set_state(ClusterState::Free);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_fits_and_bitmap_ranges() {
        const { assert!(CLUSTER_HEADER_BYTES <= 128) };
        // SAFETY: all-zero is a valid header (atomics and padding).
        let h: ClusterHeader = unsafe { std::mem::zeroed() };
        assert!(!h.all_in_memory(0, 1));
        for i in 60..80 {
            h.set_in_memory(i, true);
        }
        assert!(h.all_in_memory(60, 20));
        assert!(h.all_in_memory(64, 16));
        assert!(!h.all_in_memory(59, 2));
        assert!(!h.all_in_memory(70, 11));
        h.set_in_memory(70, false);
        assert!(!h.all_in_memory(64, 16));
        for i in 0..SLOTS_PER_CLUSTER {
            h.set_in_memory(i, true);
        }
        assert!(h.all_in_memory(0, SLOTS_PER_CLUSTER));
        h.reset();
        assert!(!h.all_in_memory(0, 1));
        assert_eq!(h.state(), ClusterState::Free);
    }
}
