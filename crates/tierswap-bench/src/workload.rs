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

/// A span of memory a workload runs on: a raw pointer so that threads can share it
/// (each workload thread touches its own pages, or only reads).
#[derive(Clone, Copy, Debug)]
pub struct Mem {
    /// First byte (page-aligned).
    pub ptr: *mut u8,
    /// Length in bytes (a whole number of pages).
    pub len: usize,
}

// SAFETY: `Mem` is a plain address range; the workload functions split the pages between
// threads so no two threads write the same page.
unsafe impl Send for Mem {}
// SAFETY: as above.
unsafe impl Sync for Mem {}

/// What a refault phase saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verify {
    /// Pages touched by the refault phase.
    pub pages_touched: u64,
    /// Pages whose every byte was compared with the expected content.
    pub pages_verified: u64,
    /// Pages that differed.
    pub mismatches: u64,
}

impl WorkloadKind {
    /// The tierswap region hint this workload asks for.
    pub fn hint(self) -> tierswap::Hint {
        todo!()
    }

    /// The `madvise` advice the kernel engines apply to the same memory, if any.
    pub fn madvise_advice(self) -> Option<i32> {
        todo!()
    }
}

/// Writes every page's content. `threads` 0 means one per CPU; `progress` is called with
/// pages done so far (from any thread, roughly every 1024 pages).
pub fn fill(kind: WorkloadKind, mem: Mem, threads: usize, progress: &(dyn Fn(u64) + Sync)) {
    let _ = (kind, mem, threads, progress);
    todo!()
}

/// Touches pages in the workload's refault order, comparing every byte of each touched
/// page with what [`fill`] wrote. `threads` as in [`fill`].
pub fn refault(kind: WorkloadKind, mem: Mem, threads: usize, progress: &(dyn Fn(u64) + Sync)) -> Verify {
    let _ = (kind, mem, threads, progress);
    todo!()
}
