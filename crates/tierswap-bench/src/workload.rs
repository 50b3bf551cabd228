//! The workloads: what data each page holds and in which order pages are touched.
//! The same code runs under every engine.

use serde::{Deserialize, Serialize};

/// A seed workload (see shared/reference/000 and 001 for where each comes from).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadKind {
    /// Fill every page with compressible per-page data, force it out, refault all, verify.
    Usama1g,
    /// Sequential refault of every page, no hint.
    Seq64,
    /// Sequential refault of every page, with a sequential hint.
    Seq64Hint,
    /// One 4K page per 64K block, blocks in ascending order.
    Stride64Sparse,
    /// One 4K page per 64K block, blocks in random order.
    Random64Sparse,
    /// Every page of each 64K block, blocks in random order.
    Random64Full,
    /// Zero-filled pages.
    Zero,
    /// 0xff-filled pages (memhog-like).
    Samefill,
    /// Incompressible random pages.
    Random,
    /// usemem-like: threads write their own ranges sequentially, then free.
    Usemem,
    /// seq refault with one thread per core on disjoint ranges.
    Concurrent,
}
