//! The swap-in policies end to end on real userfaultfd: large swap-in and its admission,
//! mixed-backend ranges, fault-around, workingset detection and clean pages. Every byte
//! that comes back is compared with what was written; counters are checked against what
//! the test did.

mod common;

use common::{
    config, fill_page, filled_region, page_matches, page_matches_at, pager, start, stats_when, xorshift, PAGE,
};
use tierswap::{FaultMode, Hint, Pager, PagerConfig, SwapinPolicy};

/// A region of `n` counter pages with `hint`, every page evicted.
fn evicted_region(p: &Pager, n: usize, hint: Hint) -> tierswap::Region {
    let r = filled_region(p, n, hint, 0);
    p.evict_all();
    assert_eq!(r.page_states(), (0, 0, n), "every page evicted");
    r
}

fn read_all_in_order(r: &tierswap::Region, n: usize) {
    let mem = r.as_slice();
    for pg in 0..n {
        assert!(page_matches_at(mem, pg, 0), "page {pg}");
    }
}

#[test]
fn sequential_refault_earns_large_swapin_without_a_hint() {
    let n = 4096;
    let p = pager(64 << 20, "zero,pool", FaultMode::Thread, 1);
    let r = evicted_region(&p, n, Hint::Normal);
    let before = p.stats().counters;
    read_all_in_order(&r, n);
    let c = p.stats().counters;
    let faults = c.faults_swapped - before.faults_swapped;
    assert!(c.swpin_large >= (n / 16 - 2) as u64, "one large swap-in per 64 KiB: {c:?}");
    assert!(faults <= (n / 16 + 4) as u64, "{faults} faults for {n} pages");
    assert_eq!(c.zswpin, n as u64, "every page decompressed once");
    assert!(c.swpin_large_pages >= (n - 32) as u64);
}

#[test]
fn order0_policy_and_random_hint_never_go_large() {
    let n = 1024;
    for (policy, hint) in [(SwapinPolicy::Order0, Hint::Sequential), (SwapinPolicy::Locality, Hint::Random)] {
        let p = start(PagerConfig { swapin_policy: policy, ..config(64 << 20, "zero,pool", FaultMode::Thread, 1) });
        let r = evicted_region(&p, n, hint);
        read_all_in_order(&r, n);
        let c = p.stats().counters;
        assert_eq!(c.swpin_large, 0, "{policy:?} {hint:?}");
        assert_eq!(c.faults_swapped, n as u64, "{policy:?} {hint:?}: one fault per page");
    }
}

#[test]
fn sequential_hint_goes_large_from_the_first_fault_up_to_the_cap() {
    let n = 2048;
    let p = start(PagerConfig { swapin_max_pages: 128, ..config(64 << 20, "zero,pool", FaultMode::Thread, 1) });
    let r = evicted_region(&p, n, Hint::Sequential);
    read_all_in_order(&r, n);
    let c = p.stats().counters;
    assert_eq!(c.faults_swapped, (n / 128) as u64, "one fault per 512 KiB: {c:?}");
    assert_eq!(c.swpin_large, (n / 128) as u64);
}

#[test]
fn sparse_access_gets_no_large_swapin() {
    let n = 4096;
    // Admission alone: stride prefetch would take most of the walk's faults away (tested
    // below).
    let p = start(PagerConfig { stride_prefetch_max_pages: 0, ..config(64 << 20, "zero,pool", FaultMode::Thread, 1) });
    let r = evicted_region(&p, n, Hint::Normal);
    let mem = r.as_slice();
    // The first page of every 64 KiB block, in order (stride64_sparse)…
    for b in 0..n / 16 {
        assert!(page_matches_at(mem, b * 16, 0));
    }
    // …and one page of each block in a shuffled order (random64_sparse).
    for k in 0..n / 16 {
        let b = (k * 97) % (n / 16);
        assert!(page_matches_at(mem, b * 16 + 7, 0));
    }
    let c = p.stats().counters;
    assert_eq!(c.swpin_large, 0, "{c:?}");
    assert_eq!(c.zswpin, 2 * (n / 16) as u64, "only the touched pages came in");
    assert!(c.swpin_large_veto >= 2 * (n / 16) as u64 - 2);
}

/// The counters once `done` holds of them, or after 2 s.
fn settled(p: &Pager, done: impl Fn(&tierswap::stats::CounterSnapshot) -> bool) -> tierswap::stats::CounterSnapshot {
    stats_when(p, 2, |st| done(&st.counters)).counters
}

/// Reads the first page of every 64 KiB block of `r` in order (stride64_sparse), checking
/// every byte; returns the swapped-page faults it took.
fn stride_walk(p: &Pager, r: &tierswap::Region, n: usize, salt: u64) -> u64 {
    let before = p.stats().counters.faults_swapped;
    for b in 0..n / 16 {
        assert!(page_matches_at(r.as_slice(), b * 16, salt), "page {}", b * 16);
    }
    p.stats().counters.faults_swapped - before
}

#[test]
fn stride_faults_prefetch_the_pages_further_along() {
    let n = 4096;
    let blocks = (n / 16) as u64;
    let p = pager(64 << 20, "zero,pool", FaultMode::Thread, 1);
    let r = evicted_region(&p, n, Hint::Normal);
    let faults = stride_walk(&p, &r, n, 0);
    // The program runs on while its fault thread prefetches: the last pages it read may be
    // in place a moment before they are counted.
    let c = settled(&p, |c| c.swap_prefetch + faults >= blocks);
    // Three faults name the stride, then one per window: 2, 4, 8, 16, then 32 pages.
    assert!(faults <= 16, "{faults} faults for {blocks} pages on a stride: {c:?}");
    assert_eq!(c.swap_prefetch + faults, blocks, "each page came in once, by fault or prefetch: {c:?}");
    assert_eq!(c.zswpin, blocks, "no page off the stride came in: {c:?}");
    assert!(c.swap_prefetch_hit + 32 >= c.swap_prefetch, "prefetched pages were used: {c:?}");
    assert_eq!(c.swpin_large, 0, "{c:?}");
    // Prefetched pages come in clean: evicting them again costs no compression.
    p.evict_all();
    let c2 = p.stats().counters;
    assert_eq!(c2.swpout_clean - c.swpout_clean, blocks, "{c2:?}");
    assert_eq!(c2.zswpout, c.zswpout, "nothing compressed again: {c2:?}");
    // A shuffled walk keeps no stride: one fault a page, nothing prefetched.
    let before = p.stats().counters;
    for k in 0..n / 16 {
        let b = (k * 97) % (n / 16);
        assert!(page_matches_at(r.as_slice(), b * 16 + 5, 0));
    }
    let c = p.stats().counters;
    assert_eq!(c.swap_prefetch, before.swap_prefetch, "{c:?}");
    assert_eq!(c.faults_swapped - before.faults_swapped, blocks, "{c:?}");
}

#[test]
fn prefetched_pages_take_writes_and_come_back_from_the_file() {
    // Pages on the file tier, a stride walk that prefetches them, writes to prefetched
    // pages (clean pages give up their slot on the write), eviction, and every byte back.
    let n = 4096;
    let p =
        start(PagerConfig { pool_max_bytes: Some(1 << 20), ..config(8 << 20, "zero,pool,file", FaultMode::Thread, 1) });
    let mut r = evicted_region(&p, n, Hint::Normal);
    let st = stats_when(&p, 30, |st| st.file_pages >= (n / 2) as u64);
    assert!(st.file_pages >= (n / 2) as u64, "most pages on the file: {st:?}");
    let before = p.stats().counters;
    let faults = stride_walk(&p, &r, n, 0);
    let c = settled(&p, |c| c.swap_prefetch - before.swap_prefetch + faults >= (n / 16) as u64);
    assert!(c.swap_prefetch - before.swap_prefetch >= (n / 16) as u64 - 40, "{c:?}");
    assert!(faults <= 40, "{faults} faults: {c:?}");
    assert!(c.pswpin > before.pswpin, "prefetch read the file: {c:?}");
    let mem = r.as_mut_slice();
    for b in (0..n / 16).step_by(3) {
        fill_page(&mut mem[b * 16 * PAGE..(b * 16 + 1) * PAGE], b * 16, 9);
    }
    p.evict_all();
    for pg in 0..n {
        let salt = if pg % 16 == 0 && (pg / 16) % 3 == 0 { 9 } else { 0 };
        assert!(page_matches_at(r.as_slice(), pg, salt), "page {pg}");
    }
}

#[test]
fn stride_prefetch_off_or_in_signal_mode_prefetches_nothing() {
    let n = 1024;
    for (max, mode) in [(0, tierswap::FaultMode::Thread), (32, tierswap::FaultMode::Signal)] {
        let p = start(PagerConfig { stride_prefetch_max_pages: max, ..config(64 << 20, "zero,pool", mode, 1) });
        let r = evicted_region(&p, n, Hint::Normal);
        let faults = stride_walk(&p, &r, n, 0);
        let c = p.stats().counters;
        assert_eq!(c.swap_prefetch, 0, "{max} {mode:?}: {c:?}");
        assert_eq!(faults, (n / 16) as u64, "{max} {mode:?}: one fault a page");
    }
}

#[test]
fn mixed_ranges_are_served_across_backends() {
    // Per 64 KiB block: zero pages, same-filled pages, counter pages written back to the
    // file, and counter pages rewritten later that sit in the pool: every large swap-in
    // spans several backends.
    let n = 4096;
    // lz4: its ~2:1 on these pages overflows the 4 MiB pool for sure (zstd's ~4:1 fits
    // them, and whether any reach the file is then up to timing).
    let p = start(PagerConfig {
        pool_max_bytes: Some(4 << 20),
        compressor: tierswap::Compressor::Lz4,
        ..config(16 << 20, "zero,pool,file", FaultMode::Thread, 1)
    });
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    let mem = r.as_mut_slice();
    for pg in 0..n {
        let b = &mut mem[pg * PAGE..(pg + 1) * PAGE];
        match pg % 16 {
            0..=2 => b.fill(0),
            3..=4 => b.fill((pg % 251) as u8 + 1),
            _ => fill_page(b, pg, 0),
        }
    }
    p.evict_all();
    let wait_for_writeback = || stats_when(&p, 30, |st| st.pool_total_size <= 4 << 20);
    wait_for_writeback();
    // The pool pages: rewritten, so they are compressed again, into the pool.
    let mem = r.as_mut_slice();
    for pg in (0..n).filter(|pg| pg % 16 >= 11) {
        fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg, 5);
    }
    p.evict_all();
    wait_for_writeback();
    let s = p.stats();
    assert!(s.file_pages > 0 && s.pool_stored_pages > 0, "pages in both pool and file: {s:?}");
    let before = s.counters;
    let mem = r.as_slice();
    for pg in 0..n {
        let b = &mem[pg * PAGE..(pg + 1) * PAGE];
        let ok = match pg % 16 {
            0..=2 => b.iter().all(|&x| x == 0),
            3..=4 => b.iter().all(|&x| x == (pg % 251) as u8 + 1),
            11.. => page_matches_at(mem, pg, 5),
            _ => page_matches_at(mem, pg, 0),
        };
        assert!(ok, "page {pg}");
    }
    let c = p.stats().counters;
    assert!(c.swpin_large_mixed > 0, "large swap-ins spanned backends: {c:?}");
    assert!(c.pswpin > before.pswpin && c.zswpin > before.zswpin, "{before:?}\n{c:?}");
    assert!(c.faults_swapped - before.faults_swapped < (n / 4) as u64, "{c:?}");
}

/// First-touch faults of a program writing `n` pages in order: the first alone, then a
/// window of 16 pages doubling up to `max`.
fn first_touch_faults(n: usize, fault_around: bool, max: usize) -> usize {
    if !fault_around {
        return n;
    }
    let (mut faults, mut next, mut window) = (1, 1, 0);
    while next < n {
        faults += 1;
        window = (window * 2).clamp(16.min(max), max);
        next += window;
    }
    faults
}

#[test]
fn first_touch_in_order_maps_the_next_pages_in_the_same_fault() {
    use tierswap::FaultMode::{Signal, Thread};
    for (mode, on, max) in [(Thread, true, 64), (Signal, true, 64), (Thread, false, 64), (Thread, true, 16)] {
        let n = 1024;
        let p = start(PagerConfig {
            fault_around: on,
            fault_around_max_pages: max,
            ..config(64 << 20, "zero,pool", mode, 1)
        });
        // Written in order: the first fault is alone, the next maps 16 pages, and each one
        // after twice as many as the last, up to `max` (the 64 MiB budget allows 256).
        let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
        let mem = r.as_mut_slice();
        for pg in 0..n {
            fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg, 7);
        }
        let c = p.stats().counters;
        let want_faults = first_touch_faults(n, on, max as usize);
        assert_eq!(c.faults_first_touch, want_faults as u64, "{mode:?} on {on}: {c:?}");
        assert_eq!(c.faults_first_touch + c.fault_around_pages, n as u64, "every page mapped once: {c:?}");
        assert!((0..n).all(|pg| page_matches_at(r.as_slice(), pg, 7)), "{mode:?}: written bytes");
        // Read in order first: the zero page, then written over (the kernel's copy on
        // write; no fault of ours).
        let before = p.stats().counters;
        let mut z = p.region(n * PAGE, Hint::Normal).unwrap();
        assert!(z.as_slice().iter().all(|&b| b == 0), "untouched memory reads as zeros");
        let c = p.stats().counters;
        assert_eq!(c.faults_first_touch - before.faults_first_touch, want_faults as u64, "{c:?}");
        let mem = z.as_mut_slice();
        for pg in 0..n {
            fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg, 9);
        }
        assert_eq!(p.stats().counters.faults, c.faults, "writes over zero pages take no fault of ours");
        assert!((0..n).all(|pg| page_matches_at(z.as_slice(), pg, 9)), "{mode:?}: bytes written over zero pages");
        // One page per 64 KiB: no run, no fault-around.
        let before = p.stats().counters;
        let mut sparse = p.region(n * PAGE, Hint::Normal).unwrap();
        let mem = sparse.as_mut_slice();
        for pg in (0..n).step_by(16) {
            fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg, 11);
        }
        let c = p.stats().counters;
        assert_eq!(c.faults_first_touch - before.faults_first_touch, (n / 16) as u64, "{c:?}");
        assert_eq!(c.fault_around_pages, before.fault_around_pages, "{c:?}");
        assert!((0..n).step_by(16).all(|pg| page_matches_at(sparse.as_slice(), pg, 11)));
        // Evicted and read back: every byte.
        p.evict_all();
        assert!((0..n).all(|pg| page_matches_at(r.as_slice(), pg, 7)), "{mode:?}: after eviction");
        assert!((0..n).all(|pg| page_matches_at(z.as_slice(), pg, 9)), "{mode:?}: after eviction");
    }
}

/// Two fills taking turns in one region (a heap's size-class spans in one arena): each
/// breaks the region's last first touch for the other, so without `first_touch_follow` every
/// page is a fault of its own; with it a touch right after a present page maps the next
/// 64 KiB, and a fill takes a fault per 16 pages.
#[test]
fn fills_taking_turns_in_one_region_map_ahead_with_touch_follow() {
    for follow in [true, false] {
        let n = 1024;
        let p =
            start(PagerConfig { first_touch_follow: follow, ..config(64 << 20, "zero,pool", FaultMode::Thread, 1) });
        let mut r = p.region(2 * n * PAGE, Hint::Normal).unwrap();
        let mem = r.as_mut_slice();
        for k in 0..n {
            for pg in [k, n + k] {
                fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg, 3);
            }
        }
        let c = p.stats().counters;
        assert_eq!(c.faults_first_touch + c.fault_around_pages, 2 * n as u64, "every page mapped once: {c:?}");
        if follow {
            // Each fill: its first page alone, the second right after it, then a fault
            // every 16 pages (17 + 1 ahead of each).
            assert!(c.faults_first_touch <= (2 * n / 16 + 8) as u64, "{c:?}");
        } else {
            assert_eq!(c.faults_first_touch, 2 * n as u64, "{c:?}");
        }
        assert!((0..2 * n).all(|pg| page_matches_at(r.as_slice(), pg, 3)), "follow {follow}: written bytes");
        p.evict_all();
        assert!((0..2 * n).all(|pg| page_matches_at(r.as_slice(), pg, 3)), "follow {follow}: after eviction");
    }
}

#[test]
fn fault_around_maps_staged_neighbours_and_can_be_switched_off() {
    for on in [true, false] {
        let n = 1024;
        let p = start(PagerConfig { fault_around: on, ..config(64 << 20, "zero,pool", FaultMode::Thread, 1) });
        let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
        let mem = r.as_mut_slice();
        for pg in 0..n {
            fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg, 3);
        }
        // Stage every page (the inactive list) without evicting: deactivate through a
        // budget squeeze is timing-dependent, so use the test hook.
        let staged = p.stage_all();
        assert_eq!(staged, n, "every page staged");
        let mem = r.as_slice();
        for pg in 0..n {
            assert!(page_matches_at(mem, pg, 3), "page {pg}");
        }
        let c = p.stats().counters;
        if on {
            assert!(c.fault_around_pages >= (n - n / 16) as u64, "{c:?}");
            assert!(c.faults_staged <= (n / 16) as u64 + 2);
        } else {
            assert_eq!(c.fault_around_pages, 0);
            assert_eq!(c.faults_staged, n as u64);
        }
    }
}

#[test]
fn a_lone_touch_of_a_staged_page_leaves_its_neighbours_staged() {
    for adapt in [true, false] {
        let n = 1024;
        let blocks = n / 16;
        let p =
            start(PagerConfig { staged_around_adapt: adapt, ..config(64 << 20, "zero,pool", FaultMode::Thread, 1) });
        let r = filled_region(&p, n, Hint::Normal, 5);
        assert_eq!(p.stage_all(), n, "every page staged");
        let before = p.stats().counters;
        let mem = r.as_slice();
        // One page of each block, the blocks taken 37 apart: never a neighbour of the last.
        for k in 0..blocks {
            let pg = (k * 37 % blocks) * 16 + 5;
            assert!(page_matches_at(mem, pg, 5), "adapt {adapt}: page {pg}");
        }
        let lone = p.stats().counters;
        assert_eq!(lone.faults_staged - before.faults_staged, blocks as u64, "adapt {adapt}: {lone:?}");
        let neighbours = if adapt { 0 } else { (n - blocks) as u64 };
        assert_eq!(lone.fault_around_pages - before.fault_around_pages, neighbours, "adapt {adapt}: {lone:?}");
        assert_eq!(p.stats().staged_pages, (n - blocks) as u64 - neighbours, "adapt {adapt}");
        // Then every page in order: running along, blocks come back whole again after the
        // run's first fault (its second page faults once more, then each block once).
        for pg in 0..n {
            assert!(page_matches_at(mem, pg, 5), "adapt {adapt}: page {pg} in order");
        }
        let along = p.stats().counters;
        let faults = along.faults_staged - lone.faults_staged;
        if adapt {
            assert_eq!(faults, blocks as u64 + 1, "adapt {adapt}: {along:?}");
        } else {
            assert_eq!(faults, 0, "adapt {adapt}: the blocks came back whole with their first touch");
        }
        assert_eq!(p.stats().staged_pages, 0, "adapt {adapt}");
    }
}

/// Pages staged once 48 MiB were written through a 16 MiB budget with the inactive list at
/// half of it, filled (`stage_fill`) or not. Every page read back and checked after.
fn staged_after_fill(stage_fill: bool) -> u64 {
    let p = start(PagerConfig {
        stage_fill,
        inactive_pct: 50,
        inactive_thrash_shrink: false,
        ..config(16 << 20, "zero,pool", FaultMode::Thread, 1)
    });
    let n = 12_288;
    let r = filled_region(&p, n, Hint::Normal, 8);
    assert!(p.settle(std::time::Duration::from_secs(30)), "reclaim settles");
    let staged = p.stats().staged_pages;
    let mem = r.as_slice();
    for pg in 0..n {
        assert!(page_matches_at(mem, pg, 8), "stage_fill {stage_fill}: page {pg}");
    }
    staged
}

#[test]
fn the_inactive_list_fills_to_its_size_with_stage_fill() {
    // 4,096 pages of budget: half of them is 2,048 staged; steps of 256 pages. The last
    // steps' evictions (the reclaim thread's, and a fault thread's waiting for room) may
    // take up to three batches off the list after its last staging.
    let filled = staged_after_fill(true);
    assert!((2048 - 3 * 256..=2048 + 4 * 256).contains(&filled), "with stage-fill: {filled} staged");
    // Without, reclaim stages as it evicts: the 512-page reserve and a step or two.
    let one_for_one = staged_after_fill(false);
    assert!(one_for_one <= 1024, "without stage-fill: {one_for_one} staged");
}

#[test]
fn a_quick_refault_is_working_set_and_activated() {
    let n = 512;
    let p = start(PagerConfig {
        swapin_policy: SwapinPolicy::Order0,
        ..config(64 << 20, "zero,pool", FaultMode::Thread, 1)
    });
    let r = evicted_region(&p, n, Hint::Normal);
    read_all_in_order(&r, n);
    let c = p.stats().counters;
    // 512 evictions ago is well within a 64 MiB budget: every refault activates, and is
    // within the inactive list's reach (12 % of 16,384 pages).
    assert_eq!(c.workingset_refault, n as u64);
    assert_eq!(c.workingset_activate, n as u64);
    assert_eq!(c.workingset_refault_near, n as u64);

    let p = start(PagerConfig {
        swapin_policy: SwapinPolicy::Order0,
        workingset: false,
        ..config(64 << 20, "zero,pool", FaultMode::Thread, 1)
    });
    let r = evicted_region(&p, n, Hint::Normal);
    read_all_in_order(&r, n);
    assert_eq!(p.stats().counters.workingset_activate, 0);
}

#[test]
fn a_long_refault_distance_is_not_working_set() {
    // 8 MiB budget = 2048 pages; the first pages are refaulted after 8192 more evictions.
    // Every page is same-filled (its own word), so the swapped pages take no pool room and
    // the footprint is the present pages alone: with counter data the pool outgrew the
    // budget, reclaim evicted each page again while the check read it, and that page's
    // second refault was rightly working set (evicted an instant before).
    let n = 8192;
    let p = start(PagerConfig {
        swapin_policy: SwapinPolicy::Order0,
        ..config(8 << 20, "zero,pool", FaultMode::Thread, 1)
    });
    let mut r = p.region(2 * n * PAGE, Hint::Normal).unwrap();
    let mem = r.as_mut_slice();
    for pg in 0..2 * n {
        fill_own_word(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg);
        if pg == 63 {
            // Evict the first block early, then everything else much later.
            p.evict_all();
        }
    }
    p.evict_all();
    // (Reclaim may also have evicted pages between their first writes: those refaults
    // are not what this test measures.)
    let before = p.stats().counters;
    assert!(before.swpout_samefill >= 2 * n as u64, "every page left same-filled: {before:?}");
    let mem = r.as_slice();
    for pg in 0..64 {
        assert!(own_word_matches(mem, pg), "page {pg} came back wrong");
    }
    let c = p.stats().counters;
    assert_eq!(c.swpout_samefill, before.swpout_samefill, "nothing evicted while checking");
    assert!(c.workingset_refault - before.workingset_refault >= 64);
    assert_eq!(
        c.workingset_activate - before.workingset_activate,
        0,
        "evicted {} pages ago: not working set",
        2 * n - 64
    );
    assert_eq!(c.workingset_refault_near - before.workingset_refault_near, 0, "nor within the inactive list's reach");
}

/// Page `pg`'s word: every page same-filled with its own word, so the swapped pages take no
/// pool room and the footprint is the present pages alone.
fn own_word(pg: usize) -> [u8; 8] {
    ((pg as u64 + 1) * 0x9e37_79b9).to_le_bytes()
}

/// A region of `n` pages under an 8 MiB budget (2,048 pages) with `protect_selective_pct`
/// at `pct`, its first `filled` pages filled with [`own_word`].
fn own_words(pct: u32, n: usize, filled: usize) -> (Pager, tierswap::Region) {
    let p = start(PagerConfig {
        swapin_policy: SwapinPolicy::Order0,
        protect_selective_pct: pct,
        ..config(8 << 20, "zero,pool", FaultMode::Thread, 1)
    });
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    for (pg, page) in r.as_mut_slice().chunks_exact_mut(PAGE).enumerate().take(filled) {
        fill_own_word(page, pg);
    }
    (p, r)
}

fn fill_own_word(page: &mut [u8], pg: usize) {
    for w in page.chunks_exact_mut(8) {
        w.copy_from_slice(&own_word(pg));
    }
}

fn own_word_matches(mem: &[u8], pg: usize) -> bool {
    mem[pg * PAGE..(pg + 1) * PAGE].chunks_exact(8).all(|w| w == own_word(pg))
}

#[test]
fn protection_is_suspended_while_nearly_every_eviction_comes_back_as_working_set() {
    // Reads at random over 1.5 budgets: every evicted page comes back about half a budget
    // of evictions later, working set, so activations run at about one an eviction and
    // "active" singles nothing out. The running rate passes 70 % after ~10 windows of
    // 4,096 evictions; 200,000 reads make ~65,000 faults.
    let n = 3072;
    let run = |pct: u32| {
        let (p, r) = own_words(pct, n, n);
        let mem = r.as_slice();
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..200_000 {
            x = xorshift(x);
            let pg = (x % n as u64) as usize;
            assert!(own_word_matches(mem, pg), "page {pg} came back wrong");
        }
        let c = p.stats().counters;
        assert!(
            c.workingset_activate * 10 >= c.pgsteal * 8,
            "activations {} of {} evictions",
            c.workingset_activate,
            c.pgsteal
        );
        c.protect_suspended
    };
    let suspended = run(70);
    assert!(suspended > 0, "protection never suspended at 70 %");
    assert_eq!(run(0), 0, "the setting at 0 never suspends it");
}

#[test]
fn a_hot_set_beside_a_cold_stream_keeps_its_protection() {
    // A server's shape: 1,024 hot pages, two read at random after each write of a fresh cold page,
    // 8 budgets of them, each written once. The refaults are the hot pages', nearly all
    // activated (as while a server loads: few refaults, each working set), but the
    // evictions are the stream's, so activations stay far under 70 % of the evictions:
    // weighed against refaults instead, protection would go off.
    let (hot, cold) = (1024, 16_384);
    let (p, mut r) = own_words(70, hot + cold, hot);
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    for i in 0..cold {
        let pg = hot + i;
        fill_own_word(&mut r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE], pg);
        for _ in 0..2 {
            x = xorshift(x);
            let h = (x % hot as u64) as usize;
            assert!(own_word_matches(r.as_slice(), h), "hot page {h} came back wrong");
        }
    }
    let c = p.stats().counters;
    assert!(c.pgsteal >= (cold / 2) as u64, "the stream was evicted: {} evictions", c.pgsteal);
    assert!(
        c.workingset_refault >= 256 && c.workingset_activate * 10 >= c.workingset_refault * 7,
        "the hot pages' refaults are working set: {} activated of {}",
        c.workingset_activate,
        c.workingset_refault
    );
    assert_eq!(c.protect_suspended, 0, "{} activations of {} evictions", c.workingset_activate, c.pgsteal);
    let mem = r.as_slice();
    for pg in 0..hot + cold {
        assert!(own_word_matches(mem, pg), "page {pg} came back wrong");
    }
}

#[test]
fn clean_pages_are_evicted_again_without_compression_and_writes_are_never_lost() {
    let n = 2048;
    let p = pager(64 << 20, "zero,pool,file", FaultMode::Thread, 1);
    let r = evicted_region(&p, n, Hint::Normal);
    let first = p.stats().counters;
    assert_eq!(first.zswpout, n as u64);

    // Read everything back: pages come in clean, keeping their slots.
    read_all_in_order(&r, n);
    assert_eq!(p.evict_all(), n);
    let c = p.stats().counters;
    assert_eq!(c.swpout_clean, n as u64, "every page was clean: {c:?}");
    assert_eq!(c.zswpout, first.zswpout, "no page compressed again");

    // Read again, then write every third page: those lose their slot and are compressed
    // again; their new bytes, never the old slot's, come back.
    read_all_in_order(&r, n);
    let ptr = r.as_ptr();
    for pg in (0..n).step_by(3) {
        // SAFETY: pg < n, within the region, which this test owns; no other reference to
        // these bytes is alive while writing.
        let page = unsafe { std::slice::from_raw_parts_mut(ptr.add(pg * PAGE), PAGE) };
        fill_page(page, pg, 99);
    }
    let written = n.div_ceil(3) as u64;
    assert!(p.stats().counters.faults_wp > 0, "writes to clean pages fault");
    let before = p.stats().counters;
    assert_eq!(p.evict_all(), n);
    let c = p.stats().counters;
    let recompressed = c.zswpout - before.zswpout;
    // A write gives up the slots of its whole 64 KiB block, so unwritten neighbours of a
    // written page are compressed again too; pages of untouched blocks stay clean.
    assert!(recompressed >= written, "written pages compressed again: {recompressed}");
    assert_eq!(recompressed + (c.swpout_clean - before.swpout_clean), n as u64);
    let mem = r.as_slice();
    for pg in 0..n {
        let salt = if pg % 3 == 0 { 99 } else { 0 };
        assert!(page_matches_at(mem, pg, salt), "page {pg} has its latest bytes");
    }
    drop(r);
    assert_eq!(p.stats().swap_slots, 0, "kept slots are freed with the region");
}

/// Page `pg` of `r`.
fn page_mut(r: &mut tierswap::Region, pg: usize) -> &mut [u8] {
    &mut r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE]
}

/// A pager whose read faults bring one page each (Random regions, no stride prefetch), with
/// the two settings for writes to clean pages as given.
fn writes_pager(wp_block_adapt: bool, write_predict: bool) -> Pager {
    start(PagerConfig {
        wp_block_adapt,
        write_predict,
        stride_prefetch_max_pages: 0,
        ..config(64 << 20, "zero,pool", FaultMode::Thread, 1)
    })
}

#[test]
fn where_reads_are_written_at_once_pages_come_in_writable() {
    // memcached's way: read an item, then mark it (a write to the page just read). After
    // 32 such pairs read faults install pages writable, one in 8 still clean to measure.
    let n = 2048;
    for predict in [false, true] {
        let p = writes_pager(true, predict);
        let mut r = evicted_region(&p, n, Hint::Random);
        let before = p.stats().counters;
        for k in 0..n {
            let pg = (k * 37) % n;
            assert!(page_matches(page_mut(&mut r, pg), pg, 0), "{predict}: page {pg}");
            fill_page(page_mut(&mut r, pg), pg, 7);
        }
        let c = p.stats().counters;
        let (faults, wp) = (c.faults_swapped - before.faults_swapped, c.faults_wp - before.faults_wp);
        assert_eq!(faults, n as u64, "{predict}: one read fault a page (no neighbours with Random)");
        if predict {
            assert!(wp <= (32 + n / 8 + 8) as u64, "predicted: {wp} write faults for {n} pages");
        } else {
            assert_eq!(wp, n as u64, "each written page faulted once");
        }
        // Written pages go out compressed; their new bytes come back.
        let before = p.stats().counters;
        assert_eq!(p.evict_all(), n);
        let c = p.stats().counters;
        assert_eq!((c.swpout_clean - before.swpout_clean, c.zswpout - before.zswpout), (0, n as u64), "{predict}");
        for pg in 0..n {
            assert!(page_matches(page_mut(&mut r, pg), pg, 7), "{predict}: page {pg} has its latest bytes");
        }
    }
}

#[test]
fn a_scattered_write_leaves_its_neighbours_clean() {
    // In each 64 KiB block, read page 1, then read and write page 0, blocks far apart: with
    // `wp_block_adapt` the write gives up only page 0's slot, and page 1 leaves again for
    // free; without it, the write takes the block and page 1 is compressed again.
    let n = 4096;
    let blocks = n / 16;
    for adapt in [false, true] {
        let p = writes_pager(adapt, false);
        let mut r = evicted_region(&p, n, Hint::Random);
        for k in 0..blocks {
            let b = (k * 37) % blocks;
            assert!(page_matches(page_mut(&mut r, 16 * b + 1), 16 * b + 1, 0));
            assert!(page_matches(page_mut(&mut r, 16 * b), 16 * b, 0));
            fill_page(page_mut(&mut r, 16 * b), 16 * b, 5);
        }
        let before = p.stats().counters;
        assert_eq!(p.evict_all(), 2 * blocks);
        let c = p.stats().counters;
        let (clean, compressed) = (c.swpout_clean - before.swpout_clean, c.zswpout - before.zswpout);
        if adapt {
            assert_eq!((clean, compressed), (blocks as u64, blocks as u64), "only written pages compressed");
        } else {
            assert_eq!((clean, compressed), (0, 2 * blocks as u64), "the whole block given up");
        }
        for pg in 0..n {
            let salt = if pg % 16 == 0 { 5 } else { 0 };
            assert!(page_matches(page_mut(&mut r, pg), pg, salt), "{adapt}: page {pg}");
        }
    }
}

#[test]
fn clean_tracking_can_be_switched_off() {
    let n = 512;
    let p = start(PagerConfig { keep_clean: false, ..config(64 << 20, "zero,pool", FaultMode::Thread, 1) });
    let r = evicted_region(&p, n, Hint::Normal);
    read_all_in_order(&r, n);
    assert_eq!(p.evict_all(), n);
    let c = p.stats().counters;
    assert_eq!((c.swpout_clean, c.zswpout), (0, 2 * n as u64));
    read_all_in_order(&r, n);
}

#[test]
fn threads_writing_and_reading_clean_and_large_pages_lose_nothing() {
    let n = 4096;
    let p = std::sync::Arc::new(pager(8 << 20, "zero,pool,file", FaultMode::Thread, 1));
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    let mem = r.as_mut_slice();
    for pg in 0..n {
        fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg, 0);
    }
    let base = r.as_ptr() as usize;
    let threads: Vec<_> = (0..3usize)
        .map(|t| {
            std::thread::spawn(move || {
                // Thread t owns pages with pg % 3 == t: reads them in order, rewrites every
                // other pass, and checks the latest version each time.
                let mut salt = 0u64;
                for pass in 0..4u64 {
                    for pg in (t..n).step_by(3) {
                        // SAFETY: only thread t touches these pages; the region outlives
                        // the threads (joined below).
                        let page = unsafe { std::slice::from_raw_parts_mut((base + pg * PAGE) as *mut u8, PAGE) };
                        assert!(page_matches(page, pg, salt), "thread {t} pass {pass} page {pg}");
                        if pass % 2 == 1 {
                            fill_page(page, pg, pass);
                        }
                    }
                    if pass % 2 == 1 {
                        salt = pass;
                    }
                }
            })
        })
        .collect();
    for h in threads {
        h.join().unwrap();
    }
    let c = p.stats().counters;
    assert!(c.faults_swapped > 0 && c.zswpin > 0, "{c:?}");
}

#[test]
fn a_write_into_a_large_zero_range_lands_and_the_rest_stays_zero() {
    let n = 64;
    let p = pager(64 << 20, "zero,pool", FaultMode::Thread, 1);
    let mut r = p.region(n * PAGE, Hint::Sequential).unwrap();
    r.as_mut_slice().fill(0);
    p.evict_all();
    assert_eq!(r.page_states(), (0, 0, n));
    // A write fault in the middle of a 64 KiB run of zero pages: that page gets a zeroed
    // copy, its neighbours the zero page, all in one swap-in.
    r.as_mut_slice()[5 * PAGE + 17] = 0xab;
    let c = p.stats().counters;
    assert_eq!((c.swpin_large, c.swpin_zero), (1, 16), "{c:?}");
    let mem = r.as_slice();
    for (i, &b) in mem.iter().enumerate() {
        assert_eq!(b, if i == 5 * PAGE + 17 { 0xab } else { 0 }, "byte {i}");
    }
}

/// Pages on the file read back twice, evicted after each read: the first read keeps the file
/// slot (the eviction after it is clean, no compression); with `reread_to_pool` the second
/// read gives the slot up, so the eviction after it compresses the pages into the pool.
/// Without it they go back to their file slots clean again. Every byte is checked each time.
#[test]
fn pages_read_back_from_the_file_twice_go_to_the_pool_with_reread_to_pool() {
    let n = 512;
    for reread in [false, true] {
        let p = start(PagerConfig {
            pool_max_bytes: Some(256 << 10),
            compressor: tierswap::Compressor::Lz4,
            reread_to_pool: reread,
            ..config(64 << 20, "zero,pool,file", FaultMode::Thread, 1)
        });
        let r = evicted_region(&p, n, Hint::Normal);
        // The writeback thread stops once the pool is under its limit, which may leave a
        // few pages in it: write those back here.
        let st = stats_when(&p, 30, |st| {
            st.file_pages >= n as u64 || {
                p.writeback_now();
                false
            }
        });
        assert_eq!(st.file_pages, n as u64, "{reread}: every page on the file: {st:?}");
        // First read back and eviction: clean, to the same file slots, either way.
        let c0 = p.stats().counters;
        read_all_in_order(&r, n);
        p.evict_all();
        let c1 = p.stats().counters;
        assert_eq!(c1.pswpin - c0.pswpin, n as u64, "{reread}: every page read from the file: {c1:?}");
        assert_eq!(c1.swpout_clean - c0.swpout_clean, n as u64, "{reread}: the first eviction is clean: {c1:?}");
        assert_eq!(c1.zswpout, c0.zswpout, "{reread}: nothing compressed: {c1:?}");
        // Second read back and eviction: into the pool only with reread_to_pool.
        read_all_in_order(&r, n);
        p.evict_all();
        let c2 = p.stats().counters;
        assert_eq!(c2.pswpin - c1.pswpin, n as u64, "{reread}: read from the file again: {c2:?}");
        let (clean, compressed) = (c2.swpout_clean - c1.swpout_clean, c2.zswpout - c1.zswpout);
        if reread {
            assert_eq!((clean, compressed), (0, n as u64), "{reread}: compressed into the pool: {c2:?}");
        } else {
            assert_eq!((clean, compressed), (n as u64, 0), "{reread}: back to the file clean: {c2:?}");
        }
        // And the bytes are still right wherever they are now.
        read_all_in_order(&r, n);
    }
}
