//! tierswap: a userspace swap stack for application memory, on userfaultfd.
//!
//! A [`Pager`] hands out [`Region`]s: ordinary anonymous memory that tierswap keeps
//! under a memory budget by moving cold pages to tiers (zero / same-filled, a compressed
//! in-memory pool, a disk file whose records are encrypted and authenticated) and bringing them back on the next touch.
//!
//! Layers, top to bottom (each knows only the one below it):
//! - [`pager`]: regions, the fault threads ([`fault`]) and the reclaim thread ([`reclaim`]);
//!   the program's own madvise / munmap / mremap of managed memory in [`events`];
//! - [`pagetable`]: one [`pagetable::Pte`] word per 4 KiB page of a region;
//! - [`swap`]: the virtual swap space: slots in clusters of 512, one
//!   [`swap::SwapEntry`] word per slot saying which backend holds the bytes;
//! - [`backend`]: zero / same-filled (no storage), the compressed pool, the file;
//! - [`policy`]: pure decisions over the state above (aging, admission), no syscalls;
//! - [`uffd`]: the userfaultfd calls, safe wrappers, no decisions.
#![deny(missing_docs)]

pub mod backend;
pub mod config;
pub mod control;
pub mod events;
pub mod fault;
pub(crate) mod forkgate;
pub mod inject;
pub(crate) mod mm;
pub mod page;
pub mod pager;
pub mod pagetable;
pub mod policy;
pub mod reclaim;
pub mod sigbus;
pub mod stats;
pub mod swap;
mod sync;
pub mod sys;
mod trail;
pub mod uffd;
pub mod writeback;

pub use config::{
    parse_size, parse_tiers, Compressor, FaultMode, Hint, PagerConfig, RemoteConfig, SwapinPolicy, Tiers,
};
pub use mm::{Error, Result};
pub use pager::{Pager, Region, Tier};
pub use stats::Stats;
pub use writeback::DrainReport;
