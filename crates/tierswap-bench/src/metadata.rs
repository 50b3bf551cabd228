//! `tierswap bench metadata`: bytes of engine metadata per swapped page, measured, beside
//! the kernel's figures for the same number of pages (computed from the reference threads).

use tierswap::backend::pool::Pool;
use tierswap::swap::SwapSpace;
use tierswap::{Hint, Pager, PagerConfig};

use crate::progress::Progress;
use crate::workload::{self, Mem, WorkloadKind};

/// What one measurement found.
#[derive(Debug, serde::Serialize)]
pub struct MetadataReport {
    /// Pages swapped out.
    pub swapped_pages: u64,
    /// Measured breakdown.
    pub breakdown: tierswap::pager::MetadataBreakdown,
    /// Bytes of pool spans not holding object bytes (class rounding, free slots).
    pub pool_fragmentation_bytes: u64,
    /// Bytes of an empty swap space of 1 TiB (2^28 slots) before any use.
    pub static_1tib_bytes: u64,
    /// Bytes of an empty pool's class tables.
    pub static_pool_bytes: u64,
}

impl MetadataReport {
    /// Metadata per swapped page beyond the pte.
    pub fn per_page_beyond_pte(&self) -> f64 {
        (self.breakdown.total() - self.breakdown.pte_bytes) as f64 / self.swapped_pages.max(1) as f64
    }

    /// The report as text.
    pub fn text(&self) -> String {
        let n = self.swapped_pages.max(1) as f64;
        let b = &self.breakdown;
        let row = |name: &str, bytes: u64| format!("  {name:<34} {bytes:>14} B {:>8.3} B/page\n", bytes as f64 / n);
        let mut s = format!(
            "tierswap metadata for {} swapped pages ({} MiB):\n",
            self.swapped_pages,
            (self.swapped_pages * 4096) >> 20
        );
        s += &row("ptes (8 B per region page)", b.pte_bytes);
        s += &row("swap table (8 B per slot)", b.swap_table_bytes);
        s += &row("cluster headers", b.cluster_header_bytes);
        s += &row("slot allocator lists", b.allocator_bytes);
        s += &row("pool span headers + class tables", b.pool_header_bytes);
        s += &row("file unit index", b.file_index_bytes);
        s += &format!("  {:<34} {:>14.3} B/page   (goal ≤ 10)\n", "total beyond the pte", self.per_page_beyond_pte());
        s += &row("pool fragmentation (not metadata)", self.pool_fragmentation_bytes);
        s += &format!(
            "static: an empty 1 TiB virtual swap space costs {} B; an empty pool {} B\n",
            self.static_1tib_bytes, self.static_pool_bytes
        );
        s += "\nthe kernel for the same pages (figures from the reference threads, per swapped page):\n";
        let kernel = [
            (
                "swapfile + zswap today",
                2.0 + 8.0 + 56.0,
                "~2 B/slot static (swap_map, swap_cgroup) + 8 B swap cache/table + 56 B zswap_entry",
            ),
            ("virtual swap (vswap v5)", 24.0 + 56.0, "24 B swp_desc per entry + 56 B zswap_entry"),
            (
                "swap table phase IV + zswap",
                8.0 + 48.0 / 512.0 + 56.0,
                "8 B/slot + 48 B/cluster (0.09 B/slot) + 56 B zswap_entry",
            ),
        ];
        for (name, per_page, how) in kernel {
            s += &format!("  {name:<34} {:>14.0} B {per_page:>8.2} B/page  ({how})\n", per_page * n);
        }
        s
    }
}

/// Swaps out `swapped_bytes` of counter-filled pages through every tier and measures.
pub fn measure(swapped_bytes: u64, progress: bool) -> Result<MetadataReport, String> {
    let pager = Pager::new(PagerConfig { budget_bytes: 64 << 20, ..Default::default() }).map_err(|e| e.to_string())?;
    let mut region = pager.region(swapped_bytes as usize, Hint::Normal).map_err(|e| e.to_string())?;
    let mem = Mem { ptr: region.as_mut_slice().as_mut_ptr(), len: region.len() };
    let bar = Progress::new(progress, (region.len() / 4096) as u64, "metadata fill");
    workload::fill(WorkloadKind::Seq64, mem, 1, &|n| bar.set(n));
    bar.finish();
    pager.settle(std::time::Duration::from_secs(60));
    pager.evict_all();
    let stats = pager.stats();
    let breakdown = pager.metadata();
    let space = SwapSpace::new(1 << 28, 1).map_err(|e| e.to_string())?;
    let pool = Pool::new(1 << 30).map_err(|e| e.to_string())?;
    Ok(MetadataReport {
        swapped_pages: stats.swap_slots,
        breakdown,
        pool_fragmentation_bytes: stats.pool_total_size.saturating_sub(stats.pool_stored_bytes),
        static_1tib_bytes: space.table_bytes() + space.header_bytes() + space.allocator_bytes(),
        static_pool_bytes: pool.metadata_bytes(),
    })
}
