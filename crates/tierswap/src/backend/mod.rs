//! Backends: where a swapped page's bytes live. Zero and same-filled pages need no storage
//! (the swap entry says it all); the pool keeps compressed objects in memory; the file
//! keeps compressed records on disk.

pub mod compress;
pub mod file;
pub mod pool;
pub mod remote;
pub mod resp;
pub mod zero;

/// Bits of a backend's address for a page: a pool handle, a file offset / 16, a remote
/// version. A swap entry carries exactly this many (`swap::entry`).
pub const ADDR_BITS: u32 = 38;

/// A backend, as the user names it (`--tiers`, `drain`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Backend {
    /// Zero pages.
    Zero,
    /// Pages of one repeated 8-byte pattern.
    SameFilled,
    /// The compressed in-memory pool.
    Pool,
    /// The disk file.
    File,
    /// A remote store (a Redis / Valkey cluster).
    Remote,
}
