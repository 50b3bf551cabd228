//! The pager: regions handed to the program, the userfaultfd they are registered with,
//! the fault threads and the reclaim thread that keep the footprint under the budget.

use std::time::Duration;

use thiserror::Error;

use crate::config::{ConfigError, Hint, PagerConfig};
use crate::stats::Stats;

/// What can go wrong creating or using a pager.
#[derive(Debug, Error)]
pub enum Error {
    /// The configuration cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// userfaultfd is missing, forbidden, or lacks a feature we need.
    #[error(transparent)]
    Uffd(#[from] crate::uffd::Error),
    /// A system call on our own memory or files failed.
    #[error("{what}: {source}")]
    Io {
        /// What we were doing.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A region of zero bytes, or larger than the address space allows.
    #[error("cannot create a region of {len_bytes} bytes: give a length between 1 byte and 64 TiB")]
    RegionSize {
        /// The length asked for.
        len_bytes: usize,
    },
}

/// The pager's `Result`.
pub type Result<T> = std::result::Result<T, Error>;

/// A tierswap pager. See the crate documentation.
pub struct Pager {
    _todo: (),
}

/// Memory managed by a [`Pager`]: use it like any other memory; dropping it frees every
/// page and slot it holds.
pub struct Region {
    _todo: (),
}

impl Pager {
    /// Starts a pager: opens the userfaultfd, starts the fault and reclaim threads.
    pub fn new(config: PagerConfig) -> Result<Pager> {
        config.validate()?;
        todo!()
    }

    /// Maps `len_bytes` (rounded up to pages) of anonymous memory managed by this pager.
    pub fn region(&self, len_bytes: usize, hint: Hint) -> Result<Region> {
        let _ = (len_bytes, hint);
        todo!()
    }

    /// The configuration in force.
    pub fn config(&self) -> &PagerConfig {
        todo!()
    }

    /// Counters and gauges now.
    pub fn stats(&self) -> Stats {
        todo!()
    }

    /// The footprint now: present + staged pages, pool spans, file write buffers, metadata.
    pub fn footprint_bytes(&self) -> u64 {
        todo!()
    }

    /// Waits until reclaim has brought the footprint under the budget and stopped, or
    /// `timeout` passes; says whether it settled.
    pub fn settle(&self, timeout: Duration) -> bool {
        let _ = timeout;
        todo!()
    }
}

impl Region {
    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        todo!()
    }

    /// Length in bytes (a whole number of pages).
    pub fn len(&self) -> usize {
        todo!()
    }

    /// Whether the region is empty (never: regions have at least one page).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The region as a byte slice.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is ours, `len()` bytes long and lives as long as `self`;
        // `&mut self` makes this the only slice handed out through the region.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len()) }
    }
}
