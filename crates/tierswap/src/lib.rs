//! tierswap: a userspace swap stack for application memory, on userfaultfd.
//!
//! A [`Pager`] hands out [`Region`]s: ordinary anonymous memory that tierswap keeps under a
//! memory budget by moving cold pages to tiers (zero / same-filled, a compressed in-memory
//! pool, a disk file whose records are encrypted and authenticated, a Redis/Valkey cluster)
//! and bringing them back on the next touch.
//!
//! The engine is built in layers; a module imports only modules of the layers below it
//! (and, within a layer, only the few edges tests/layers.rs lists):
//!
//! ```text
//!  L5  `pager` (Pager, Region, the threads)   `control` (tierswap stat)   `sigbus` (signal mode)
//!        │
//!  L4  `fault` (thread loop, swap-in, staged, first touch, write-protect, readahead,
//!        │      prefetch, signal mode)  ──calls──▶  `reclaim` (staging, eviction, direct
//!        │      reclaim, waiting for room), `events` (madvise / munmap / mremap / fork)
//!        │     `writeback` (pool → file / remote, drain)
//!        │
//!  L3  `mm`: the memory manager's state (Shared in named parts), regions and their map,
//!        │    slot release, reading an entry back, teardown, the children's state
//!        │
//!  L2  `policy`: pure decisions (admission, readahead, stride, pool share), no syscalls
//!        │
//!  L1  `pagetable` (a Pte word per page)   `swap` (the virtual swap space: slots, entries)
//!        │   `backend` (zero / same-filled, pool, file, remote)
//!        │
//!  L0  `page` `sys` `uffd` `ioring` `stats` `inject` `trail` `config` `forkgate` `sync` `tree`
//! ```
//!
//! docs/design.md describes each layer, the data structures with their bit layouts, the
//! lock order, and the fault and reclaim paths step by step.
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod backend;
pub mod config;
pub mod control;
pub(crate) mod events;
pub(crate) mod fault;
pub(crate) mod forkgate;
pub mod inject;
pub mod ioring;
pub(crate) mod mm;
pub mod page;
pub mod pager;
pub mod pagetable;
pub mod policy;
pub(crate) mod reclaim;
pub mod sigbus;
pub mod stats;
pub mod swap;
pub(crate) mod sync;
pub mod sys;
pub(crate) mod trail;
pub mod tree;
pub mod uffd;
pub(crate) mod writeback;

pub use config::{
    parse_size, parse_tiers, Compressor, FaultMode, Hint, PagerConfig, RemoteConfig, SwapinPolicy, Tiers,
};
pub use mm::{Error, Result};
pub use pager::{Pager, ParentLink, Region, Tier};
pub use stats::Stats;
pub use writeback::DrainReport;
