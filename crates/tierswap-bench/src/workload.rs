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
    /// In-order refault while the file tier is drained ("swapoff"); tierswap only.
    Drain,
    /// The seq refault (docs/design.md, Workloads and data) kept under the budget: read every page in order, three passes,
    /// so pages come in and go out again unwritten (clean-page reuse).
    Thrash,
    /// Pages of mixed content in every 64K block (zero, same-filled, compressible,
    /// incompressible), so a large swap-in meets a range spread over tiers.
    Mixed,
    /// A hot set beside cold data: after the fill, the first 3/64 of the range is read in
    /// order [`HOTSET_PASSES`] times (with 2 GiB under 256 MiB: 96 MiB, over the present
    /// share a pool at three quarters of the budget leaves, under the one at half).
    Hotset,
}

/// Passes of the `hotset` workload over its hot set.
pub const HOTSET_PASSES: usize = 8;

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
    /// Every workload, in report order.
    pub const ALL: [WorkloadKind; 15] = [
        WorkloadKind::Usama1g,
        WorkloadKind::Seq64,
        WorkloadKind::Seq64Hint,
        WorkloadKind::Stride64Sparse,
        WorkloadKind::Random64Sparse,
        WorkloadKind::Random64Full,
        WorkloadKind::Zero,
        WorkloadKind::Samefill,
        WorkloadKind::Random,
        WorkloadKind::Usemem,
        WorkloadKind::Concurrent,
        WorkloadKind::Drain,
        WorkloadKind::Thrash,
        WorkloadKind::Mixed,
        WorkloadKind::Hotset,
    ];

    /// The seed suite of the reference threads (everything but `random`).
    pub const SEED_SUITE: [WorkloadKind; 10] = [
        WorkloadKind::Usama1g,
        WorkloadKind::Seq64,
        WorkloadKind::Seq64Hint,
        WorkloadKind::Stride64Sparse,
        WorkloadKind::Random64Sparse,
        WorkloadKind::Random64Full,
        WorkloadKind::Samefill,
        WorkloadKind::Zero,
        WorkloadKind::Usemem,
        WorkloadKind::Concurrent,
    ];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Usama1g => "usama_1g",
            WorkloadKind::Seq64 => "seq64",
            WorkloadKind::Seq64Hint => "seq64_hint",
            WorkloadKind::Stride64Sparse => "stride64_sparse",
            WorkloadKind::Random64Sparse => "random64_sparse",
            WorkloadKind::Random64Full => "random64_full",
            WorkloadKind::Zero => "zero",
            WorkloadKind::Samefill => "samefill",
            WorkloadKind::Random => "random",
            WorkloadKind::Usemem => "usemem",
            WorkloadKind::Concurrent => "concurrent",
            WorkloadKind::Drain => "drain",
            WorkloadKind::Thrash => "thrash",
            WorkloadKind::Mixed => "mixed",
            WorkloadKind::Hotset => "hotset",
        }
    }

    /// One line on what it does, for `--help`.
    pub fn describe(self) -> &'static str {
        match self {
            WorkloadKind::Usama1g => "fill every page with compressible per-page data, refault all in order, verify",
            WorkloadKind::Seq64 => "refault every page in order, no hint",
            WorkloadKind::Seq64Hint => "refault every page in order, sequential hint",
            WorkloadKind::Stride64Sparse => "refault the first page of each 64K block, in order",
            WorkloadKind::Random64Sparse => "refault one page of each 64K block, blocks shuffled",
            WorkloadKind::Random64Full => "refault every page, 64K blocks shuffled",
            WorkloadKind::Zero => "zero-filled pages",
            WorkloadKind::Samefill => "0xff-filled pages (memhog)",
            WorkloadKind::Random => "incompressible pages",
            WorkloadKind::Usemem => "threads write and read back their own ranges, then free",
            WorkloadKind::Concurrent => "in-order refault, one thread per CPU on its own range",
            WorkloadKind::Drain => {
                "in-order refault while tierswap drains its file tier into the pool (swapoff); tierswap only"
            }
            WorkloadKind::Thrash => {
                "read every page in order 3 times under the budget (pages go out again unwritten), verify each pass"
            }
            WorkloadKind::Mixed => {
                "every 64K block mixes zero, same-filled, compressible and incompressible pages; refault in order \
                 (a small --pool-max splits blocks between pool and file)"
            }
            WorkloadKind::Hotset => {
                "read the first 3/64 of the range in order 8 times beside the cold rest (a hot set; try --size 2G: 96 MiB hot under a 256 MiB budget)"
            }
        }
    }

    /// The tierswap region hint this workload asks for.
    pub fn hint(self) -> tierswap::Hint {
        match self {
            WorkloadKind::Seq64Hint => tierswap::Hint::Sequential,
            _ => tierswap::Hint::Normal,
        }
    }

    /// The `madvise` advice the kernel engines apply to the same memory, if any.
    pub fn madvise_advice(self) -> Option<i32> {
        match self {
            WorkloadKind::Seq64Hint => Some(libc::MADV_SEQUENTIAL),
            _ => None,
        }
    }

    /// Whether the workload runs one thread per CPU (or `--threads`).
    pub fn is_threaded(self) -> bool {
        matches!(self, WorkloadKind::Usemem | WorkloadKind::Concurrent)
    }

    fn data(self) -> Data {
        match self {
            WorkloadKind::Zero => Data::Zero,
            WorkloadKind::Samefill => Data::Fill(0xff),
            WorkloadKind::Random => Data::Random,
            WorkloadKind::Mixed => Data::Mixed,
            _ => Data::Counter,
        }
    }
}

impl std::str::FromStr for WorkloadKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        WorkloadKind::ALL.into_iter().find(|w| w.name() == s).ok_or_else(|| {
            let names: Vec<_> = WorkloadKind::ALL.iter().map(|w| w.name()).collect();
            format!("unknown workload '{s}': workloads are {}, or stress (alone)", names.join(", "))
        })
    }
}

/// What a page holds.
#[derive(Clone, Copy)]
enum Data {
    Zero,
    Fill(u8),
    /// 512 little-endian u64 per page, word i of page p = p * 512 + i (docs/design.md, Workloads and data: data:
    /// lz4 ~2:1, lzo ~2.6:1).
    Counter,
    /// xorshift bytes seeded by the page index: incompressible.
    Random,
    /// Each page one of the above, chosen by [`mixed_kind`]: every 64K block holds all four.
    Mixed,
}

/// Which data page `p` of the `mixed` workload holds. Within a 64K block of 16 pages: 3 zero,
/// 3 same-filled (a byte that varies by page, never 0), 8 counter, 2 random; the pattern is
/// rotated by the block number so that no page offset always holds the same kind.
fn mixed_kind(p: usize) -> Data {
    let slot = (p % BLOCK_PAGES + p / BLOCK_PAGES) % BLOCK_PAGES;
    match slot {
        0..=2 => Data::Zero,
        3..=5 => Data::Fill((p % 255) as u8 + 1),
        6..=13 => Data::Counter,
        _ => Data::Random,
    }
}

const PAGE: usize = 4096;
const BLOCK_PAGES: usize = 16;

/// Writes page `p`'s content into `out`.
fn page_content(data: Data, p: usize, out: &mut [u8]) {
    match data {
        Data::Zero => out.fill(0),
        Data::Fill(b) => out.fill(b),
        Data::Counter => {
            let base = p as u64 * 512;
            for (i, w) in out.chunks_exact_mut(8).enumerate() {
                w.copy_from_slice(&(base + i as u64).to_le_bytes());
            }
        }
        Data::Mixed => page_content(mixed_kind(p), p, out),
        Data::Random => {
            let mut x = (p as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for w in out.chunks_exact_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                w.copy_from_slice(&x.to_le_bytes());
            }
        }
    }
}

fn n_threads(threads: usize) -> usize {
    if threads == 0 {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    } else {
        threads
    }
}

/// A deterministic shuffle of `0..n` (fixed seed: every engine sees the same order).
fn shuffled(n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

/// Passes of the `thrash` workload over its range.
pub const THRASH_PASSES: usize = 3;

/// The pages the refault phase touches, in order, for a range of `n_pages` pages. A page
/// may come more than once (`thrash`); each touch is verified.
pub fn refault_order(kind: WorkloadKind, n_pages: usize) -> Vec<usize> {
    let n_blocks = n_pages.div_ceil(BLOCK_PAGES);
    match kind {
        WorkloadKind::Stride64Sparse => (0..n_blocks).map(|b| b * BLOCK_PAGES).collect(),
        WorkloadKind::Random64Sparse => {
            // One page per block, at a varying offset, blocks shuffled.
            shuffled(n_blocks).into_iter().map(|b| (b * BLOCK_PAGES + (b * 7) % BLOCK_PAGES).min(n_pages - 1)).collect()
        }
        WorkloadKind::Random64Full => shuffled(n_blocks)
            .into_iter()
            .flat_map(|b| (b * BLOCK_PAGES)..((b + 1) * BLOCK_PAGES).min(n_pages))
            .collect(),
        WorkloadKind::Thrash => (0..THRASH_PASSES).flat_map(|_| 0..n_pages).collect(),
        WorkloadKind::Hotset => (0..HOTSET_PASSES).flat_map(|_| 0..(n_pages * 3 / 64).max(1)).collect(),
        _ => (0..n_pages).collect(),
    }
}

/// Splits `mem` into `t` page-aligned contiguous parts.
fn split(mem: Mem, t: usize) -> Vec<(usize, usize)> {
    let n_pages = mem.len / PAGE;
    let per = n_pages.div_ceil(t);
    (0..t).map(|i| (i * per, ((i + 1) * per).min(n_pages))).filter(|(a, b)| a < b).collect()
}

/// Writes every page's content. `threads` 0 means one per CPU (threaded workloads only;
/// the others fill from one thread); `progress` is called with pages done so far.
pub fn fill(kind: WorkloadKind, mem: Mem, threads: usize, progress: &(dyn Fn(u64) + Sync)) {
    let data = kind.data();
    let t = if kind.is_threaded() { n_threads(threads) } else { 1 };
    let done = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|sc| {
        for (from, to) in split(mem, t) {
            let done = &done;
            sc.spawn(move || {
                let mem: Mem = mem; // the whole Mem (Send), not its raw pointer field
                for p in from..to {
                    // SAFETY: page p lies in mem, and only this thread writes it.
                    let page = unsafe { std::slice::from_raw_parts_mut(mem.ptr.add(p * PAGE), PAGE) };
                    page_content(data, p, page);
                    if p % 1024 == 1023 {
                        progress(done.fetch_add(1024, std::sync::atomic::Ordering::Relaxed) + 1024);
                    }
                }
            });
        }
    });
    progress((mem.len / PAGE) as u64);
}

/// Touches pages in the workload's refault order, comparing every byte of each touched
/// page with what [`fill`] wrote. `threads` as in [`fill`].
pub fn refault(kind: WorkloadKind, mem: Mem, threads: usize, progress: &(dyn Fn(u64) + Sync)) -> Verify {
    let data = kind.data();
    let n_pages = mem.len / PAGE;
    let t = if kind.is_threaded() { n_threads(threads) } else { 1 };
    let done = std::sync::atomic::AtomicU64::new(0);
    let parts: Vec<Vec<usize>> = if t == 1 {
        vec![refault_order(kind, n_pages)]
    } else {
        split(mem, t).into_iter().map(|(a, b)| (a..b).collect()).collect()
    };
    let results: Vec<Verify> = std::thread::scope(|sc| {
        let handles: Vec<_> = parts
            .iter()
            .map(|order| {
                let done = &done;
                sc.spawn(move || {
                    let mem: Mem = mem; // the whole Mem (Send), not its raw pointer field
                    let mut expect = vec![0u8; PAGE];
                    let mut v = Verify::default();
                    for (k, &p) in order.iter().enumerate() {
                        // SAFETY: page p lies in mem; refault only reads.
                        let page = unsafe { std::slice::from_raw_parts(mem.ptr.add(p * PAGE), PAGE) };
                        page_content(data, p, &mut expect);
                        v.pages_touched += 1;
                        v.pages_verified += 1;
                        if page != &expect[..] {
                            v.mismatches += 1;
                        }
                        if k % 1024 == 1023 {
                            progress(done.fetch_add(1024, std::sync::atomic::Ordering::Relaxed) + 1024);
                        }
                    }
                    v
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_default()).collect()
    });
    let total = results.iter().fold(Verify::default(), |a, b| Verify {
        pages_touched: a.pages_touched + b.pages_touched,
        pages_verified: a.pages_verified + b.pages_verified,
        mismatches: a.mismatches + b.mismatches,
    });
    progress(total.pages_touched);
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(len: usize) -> Vec<u8> {
        vec![0u8; len]
    }

    #[test]
    fn fill_then_refault_verifies_every_workload() {
        for kind in WorkloadKind::ALL {
            let mut buf = buffer(4 << 20);
            let mem = Mem { ptr: buf.as_mut_ptr(), len: buf.len() };
            fill(kind, mem, 2, &|_| {});
            let v = refault(kind, mem, 2, &|_| {});
            assert_eq!(v.mismatches, 0, "{}", kind.name());
            let want = refault_order(kind, 1024).len() as u64;
            let want = if kind.is_threaded() { 1024 } else { want };
            assert_eq!(v.pages_verified, want, "{}", kind.name());
            // One flipped byte is one mismatching page each time that page is touched.
            let order = refault_order(kind, 1024);
            let p = order[3];
            let touches = if kind.is_threaded() { 1 } else { order.iter().filter(|&&q| q == p).count() as u64 };
            buf[p * PAGE + 100] ^= 1;
            let mem = Mem { ptr: buf.as_mut_ptr(), len: buf.len() };
            assert_eq!(refault(kind, mem, 2, &|_| {}).mismatches, touches, "{}", kind.name());
        }
    }

    #[test]
    fn orders_touch_the_right_pages() {
        let n = 1000;
        let sparse = refault_order(WorkloadKind::Random64Sparse, n);
        let blocks: std::collections::HashSet<_> = sparse.iter().map(|p| p / BLOCK_PAGES).collect();
        assert_eq!(sparse.len(), n.div_ceil(BLOCK_PAGES));
        assert_eq!(blocks.len(), sparse.len(), "one page per block, each block once");
        assert_ne!(
            sparse,
            {
                let mut s = sparse.clone();
                s.sort();
                s
            },
            "shuffled"
        );
        let full = refault_order(WorkloadKind::Random64Full, n);
        let mut sorted = full.clone();
        sorted.sort();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "every page once");
        assert_eq!(refault_order(WorkloadKind::Stride64Sparse, n)[1], BLOCK_PAGES);
        assert_eq!(refault_order(WorkloadKind::Seq64, n), (0..n).collect::<Vec<_>>());
        let thrash = refault_order(WorkloadKind::Thrash, n);
        assert_eq!(thrash.len(), THRASH_PASSES * n);
        for pass in thrash.chunks(n) {
            assert_eq!(pass, (0..n).collect::<Vec<_>>(), "each pass reads every page in order");
        }
        assert_eq!(refault_order(WorkloadKind::Mixed, n), (0..n).collect::<Vec<_>>());
    }

    #[test]
    fn mixed_blocks_hold_every_kind() {
        let mut page = vec![0u8; PAGE];
        let mut zero_at = std::collections::HashSet::new();
        for b in 0..64 {
            let (mut zero, mut same, mut counter, mut random) = (0, 0, 0, 0);
            for p in b * BLOCK_PAGES..(b + 1) * BLOCK_PAGES {
                page_content(Data::Mixed, p, &mut page);
                let first = page[0];
                if page.iter().all(|&x| x == 0) {
                    zero += 1;
                    zero_at.insert(p % BLOCK_PAGES);
                } else if page.iter().all(|&x| x == first) {
                    same += 1;
                } else if lz4_flex::block::compress_prepend_size(&page).len() < PAGE * 3 / 4 {
                    counter += 1;
                } else {
                    random += 1;
                }
            }
            assert_eq!((zero, same, counter, random), (3, 3, 8, 2), "block {b}");
        }
        assert_eq!(zero_at.len(), BLOCK_PAGES, "the pattern moves from block to block");
    }

    #[test]
    fn data_kinds() {
        let mut page = vec![0u8; PAGE];
        page_content(Data::Counter, 3, &mut page);
        assert_eq!(u64::from_le_bytes(page[8..16].try_into().unwrap()), 3 * 512 + 1);
        let c = lz4_flex::block::compress_prepend_size(&page);
        assert!(c.len() < PAGE * 3 / 4, "counter pages compress");
        page_content(Data::Random, 3, &mut page);
        let r = lz4_flex::block::compress_prepend_size(&page);
        assert!(r.len() > PAGE, "random pages do not");
        assert_eq!("usama_1g".parse::<WorkloadKind>(), Ok(WorkloadKind::Usama1g));
        assert!("nope".parse::<WorkloadKind>().unwrap_err().contains("usama_1g"));
    }
}
