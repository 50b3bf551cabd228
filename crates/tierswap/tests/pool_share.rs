//! The pool's share of the budget following the workload (`PagerConfig::pool_adapt`), end
//! to end on real userfaultfd: the pool starts at five eighths of the budget and keeps
//! what a half-budget pool spills to the file; a hot set that does not fit beside it takes
//! the room back. Every byte that comes back is compared with what was written. (The
//! limit's decisions themselves are unit-tested in `policy/pool_share.rs`.)

mod common;

use std::time::{Duration, Instant};

use common::{config, counter_word, filled_region, start, stats_when, PAGE};
use tierswap::{Compressor, FaultMode, Hint, Pager, PagerConfig, Region};

const BUDGET: u64 = 16 << 20;
/// The pool limit a pager starts with: half the budget.
const BASE: u64 = BUDGET / 2;
/// Pages of the region: 32 MiB, twice the budget; lz4 packs the counter pages ~2:1, so
/// about half of what is evicted spills past an 8 MiB pool to the file.
const N: usize = 8192;

/// Asserts that page `p` of `r` holds counter page `p` for salt 7, word by word.
fn check(r: &Region, p: usize) {
    let page = &r.as_slice()[p * PAGE..(p + 1) * PAGE];
    for (i, w) in page.chunks_exact(8).enumerate() {
        assert_eq!(w, counter_word(p, i, 7).to_le_bytes(), "page {p} word {i}");
    }
}

/// The whole region evicted, and writeback done with the pool's overflow: about half the
/// pages are on the file, the newest records last written.
fn spilled_region(p: &Pager) -> Region {
    let r = filled_region(p, N, Hint::Normal, 7);
    p.evict_all();
    let st = stats_when(p, 10, |st| st.pool_total_size <= st.pool_limit && st.file_pages > 0);
    assert!(st.file_pages as usize > N / 8, "the pool spilled to the file: {st:?}");
    r
}

/// Reads the first `hot` pages of `r` in order, every page checked, pass after pass until
/// one (after the first) takes at most one fault in 20 pages, or `secs` seconds have passed.
/// Returns the last pass's swapped faults and the passes made.
fn read_hot_set(p: &Pager, r: &Region, hot: usize, secs: u64) -> (u64, usize) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut last_faults = u64::MAX;
    let mut passes = 0;
    while Instant::now() < deadline {
        let before = p.stats().counters.faults_swapped;
        for pg in 0..hot {
            check(r, pg);
        }
        passes += 1;
        last_faults = p.stats().counters.faults_swapped - before;
        if passes > 1 && last_faults <= (hot / 20) as u64 {
            break;
        }
    }
    (last_faults, passes)
}

/// Sixteen passes of random64_sparse: pass k reads page k of every 64 KiB block, the
/// blocks in a shuffled order; every page checked.
fn sparse_passes(r: &Region) {
    let blocks = N / 16;
    let mut order: Vec<usize> = (0..blocks).collect();
    let mut x = 0x9e37_79b9_u64;
    for i in (1..blocks).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    for k in 0..16 {
        for &b in &order {
            check(r, b * 16 + k);
        }
    }
}

#[test]
fn a_pool_at_five_eighths_keeps_what_half_the_budget_spills() {
    // (adaptive, file pages after the spill, pages read back from the file)
    let mut seen = Vec::new();
    for adapt in [true, false] {
        // The classic signals (short refaults, near misses), not the weighed share.
        let p = start(PagerConfig {
            compressor: Compressor::Lz4,
            pool_adapt: adapt,
            pool_weigh: false,
            ..config(BUDGET, "zero,pool,file", FaultMode::Thread, 1)
        });
        assert_eq!(p.stats().pool_limit, if adapt { BUDGET / 8 * 5 } else { BASE });
        let r = spilled_region(&p);
        let spilled = p.stats().file_pages;
        let before = p.stats().counters;
        sparse_passes(&r);
        let st = p.stats();
        let c = &st.counters;
        if !adapt {
            assert_eq!(
                (c.pool_limit_grow, c.pool_limit_shrink, st.pool_limit),
                (0, 0, BASE),
                "a fixed share never moves"
            );
        }
        seen.push((adapt, spilled, c.pswpin - before.pswpin));
        // Every page still holds what was written.
        for pg in 0..N {
            check(&r, pg);
        }
        let st = p.stats();
        assert!(st.footprint <= BUDGET + BUDGET / 20, "footprint {} over the budget", st.footprint);
    }
    let ((_, spilled_adapt, read_adapt), (_, spilled_fixed, read_fixed)) = (seen[0], seen[1]);
    assert!(spilled_adapt < spilled_fixed, "the bigger pool spilled less: {seen:?}");
    assert!(read_adapt < read_fixed, "and read fewer pages from the file: {seen:?}");
}

#[test]
fn a_hot_set_squeezed_by_the_pool_gets_the_room_back() {
    // Short refaults alone (active protection off, the classic signals): they take the
    // limit down to half and no further; a crowded active list may go below
    // (policy/pool_share.rs's unit tests).
    let p = start(PagerConfig {
        compressor: Compressor::Lz4,
        pool_adapt: true,
        pool_weigh: false,
        active_protect_pct: 0,
        ..config(BUDGET, "zero,pool,file", FaultMode::Thread, 1)
    });
    let r = spilled_region(&p);
    let top = p.stats().pool_limit;
    assert_eq!(top, BUDGET / 8 * 5);
    // A 6.5 MiB hot set: fits beside a pool at half the budget (8 MiB for pages and the
    // buffers), not beside one at 10 MiB. Read it in order until a pass no longer faults.
    let hot = (13 << 19) / PAGE;
    let (last_faults, passes) = read_hot_set(&p, &r, hot, 20);
    let st = p.stats();
    assert!(st.counters.pool_limit_shrink > 0, "short refaults shrank the limit: {:?}", st.counters);
    assert!(st.pool_limit < top && st.pool_limit >= BASE, "limit {} between half and its top {top}", st.pool_limit);
    assert!(
        last_faults <= (hot / 20) as u64,
        "the hot set stays resident once the pool gave way: {last_faults} faults in pass {passes}"
    );
    for pg in 0..N {
        check(&r, pg);
    }
}

#[test]
fn weighed_a_hot_set_squeezed_by_the_pool_gets_the_room_back_below_half() {
    // The weighed share with page stamps: the hot set's refaults from the pool cost more
    // than the pool saves, and the limit goes below half, toward the floor, until it fits.
    let p = start(PagerConfig {
        compressor: Compressor::Lz4,
        pool_adapt: true,
        pool_weigh: true,
        workingset_page_stamp: true,
        ..config(BUDGET, "zero,pool,file", FaultMode::Thread, 1)
    });
    let r = spilled_region(&p);
    let top = p.stats().pool_limit;
    assert_eq!(top, BUDGET / 8 * 5);
    // A 10 MiB hot set: does not fit beside a pool at half the budget.
    let hot = (10 << 20) / PAGE;
    let (last_faults, passes) = read_hot_set(&p, &r, hot, 30);
    let st = p.stats();
    assert!(st.counters.pool_limit_shrink > 0, "the hot refaults shrank the limit: {:?}", st.counters);
    assert!(st.pool_limit < BASE, "limit {} below half ({BASE})", st.pool_limit);
    assert!(
        last_faults <= (hot / 20) as u64,
        "the hot set stays resident once the pool gave way: {last_faults} faults in pass {passes}"
    );
    for pg in 0..N {
        check(&r, pg);
    }
    assert!(p.stats().footprint <= BUDGET + BUDGET / 20, "over the budget: {:?}", p.stats());
}

#[test]
fn weighed_against_its_room_a_pool_keeps_what_compresses_well_instead_of_the_file() {
    // 24 MiB read in a cycle under 16 MiB: each page comes back from the pool some 2,500
    // evictions after it left. Within the budget's pages (4,096), so weighed against the
    // budget every such refault counts against the pool, as if the pool's room would have
    // kept it resident, and the limit falls toward its floor, sending the cycle to the file.
    // But zstd packs these pages ~7:1: the room the pool takes holds a few hundred pages
    // uncompressed, and every one of these refaults is a file read the pool saved.
    const CYCLE: usize = 6 * 1024;
    // (room rule, limit shrink steps, limit, file pages read in the last pass, passes)
    let mut seen = Vec::new();
    for room in [true, false] {
        let p = start(PagerConfig {
            pool_adapt: true,
            pool_weigh: true,
            pool_weigh_room: room,
            workingset_page_stamp: true,
            ..config(BUDGET, "zero,pool,file", FaultMode::Thread, 1)
        });
        let r = filled_region(&p, CYCLE, Hint::Normal, 7);
        // Passes for 3 s, or until the budget's rule took the limit under a quarter and
        // the pool's overflow is read from the file.
        let deadline = Instant::now() + Duration::from_secs(if room { 3 } else { 20 });
        let (mut passes, mut last_read) = (0, 0);
        while Instant::now() < deadline {
            let before = p.stats().counters.pswpin;
            for pg in 0..CYCLE {
                check(&r, pg);
            }
            passes += 1;
            let st = p.stats();
            last_read = st.counters.pswpin - before;
            if !room && passes > 2 && st.pool_limit < BUDGET / 4 && last_read > 0 {
                break;
            }
        }
        let st = p.stats();
        seen.push((room, st.counters.pool_limit_shrink, st.pool_limit, last_read, passes));
        for pg in 0..CYCLE {
            check(&r, pg);
        }
        assert!(p.stats().footprint <= BUDGET + BUDGET / 20, "over the budget: {:?}", p.stats());
    }
    let ((_, _, limit_room, read_room, _), (_, shrink_budget, limit_budget, read_budget, _)) = (seen[0], seen[1]);
    assert!(limit_room >= BUDGET / 4, "weighed against its room, the pool keeps its share: {seen:?}");
    assert!(read_room <= (CYCLE / 50) as u64, "and the cycle comes back from the pool, not the file: {seen:?}");
    assert!(shrink_budget > 0 && limit_budget < BUDGET / 4, "weighed against the budget, the limit falls: {seen:?}");
    assert!(read_budget > 0, "and the cycle is read from the file: {seen:?}");
}
