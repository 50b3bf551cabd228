//! The pager end to end, on real userfaultfd: every byte that comes back is compared with
//! what was written, and counters are checked against what the test did.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{config, fill_page, noise_page, page_matches, pager, start, PAGE};
use tierswap::{FaultMode, Hint, Pager, PagerConfig};

#[test]
fn roundtrip_through_every_tier_under_budget() {
    let p = pager(8 << 20, "zero,pool,file", FaultMode::Thread, 2);
    let n = 8192; // 32 MiB through an 8 MiB budget
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    let mem = r.as_mut_slice();
    for pg in 0..n {
        let b = &mut mem[pg * PAGE..(pg + 1) * PAGE];
        match pg % 8 {
            0 => b.fill(0),
            1 => b.fill(0xff),
            2 => noise_page(b, pg as u64),
            _ => fill_page(b, pg, 7),
        }
    }
    p.evict_all();
    let st = p.stats();
    assert_eq!(st.present_pages + st.staged_pages, 0, "everything evicted");
    assert_eq!(st.counters.swpout_zero, (n / 8) as u64);
    assert_eq!(st.counters.swpout_samefill, (n / 8) as u64);
    assert!(st.counters.zswpout >= (n / 8 * 5) as u64 - 1);
    assert_eq!(st.counters.pool_reject_incompressible, (n / 8) as u64);
    let mut expect = vec![0u8; PAGE];
    let mut bad = 0;
    for pg in 0..n {
        match pg % 8 {
            0 => expect.fill(0),
            1 => expect.fill(0xff),
            2 => noise_page(&mut expect, pg as u64),
            _ => fill_page(&mut expect, pg, 7),
        }
        if mem[pg * PAGE..(pg + 1) * PAGE] != expect[..] {
            bad += 1;
        }
    }
    assert_eq!(bad, 0, "pages differ after the round trip");
    let st = p.stats();
    assert_eq!(st.counters.swpin_zero, (n / 8) as u64);
    assert_eq!(st.counters.swpin_samefill, (n / 8) as u64);
    assert!(st.counters.pswpin >= (n / 8) as u64, "incompressible pages came back from the file");
    assert!(st.counters.footprint_max <= (8 << 20) * 105 / 100, "footprint {} over budget", st.counters.footprint_max);
}

#[test]
fn region_drop_frees_every_slot() {
    let p = pager(4 << 20, "zero,pool,file", FaultMode::Thread, 2);
    {
        let mut r = p.region(16 << 20, Hint::Normal).unwrap();
        let mem = r.as_mut_slice();
        for pg in 0..(16 << 20) / PAGE {
            if pg % 3 == 0 {
                noise_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg as u64);
            } else {
                fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg, 1);
            }
        }
        p.evict_all();
        let st = p.stats();
        assert!(st.swap_slots > 0);
        assert!(st.pool_stored_bytes > 0);
        assert!(st.file_bytes > 0);
    }
    let st = p.stats();
    assert_eq!(st.swap_slots, 0);
    assert_eq!(st.pool_stored_bytes, 0);
    assert_eq!(st.pool_total_size, 0);
    assert_eq!(st.file_bytes, 0);
    assert_eq!(st.file_blocks, 0);
    assert_eq!(st.present_pages, 0);
    assert_eq!(st.staged_pages, 0);
}

#[test]
fn threads_touch_the_same_pages_while_reclaim_runs() {
    let p = Arc::new(pager(4 << 20, "zero,pool,file", FaultMode::Thread, 2));
    let n = 4096; // 16 MiB, 4x the budget
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    let mem = r.as_mut_slice();
    for pg in 0..n {
        fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg, 3);
    }
    let base = mem.as_ptr() as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let evicter = {
        let (p, stop) = (p.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                p.evict_all();
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let readers: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let mut bad = 0;
                for round in 0..3 {
                    for k in 0..n {
                        // Every thread reads the same pages, in interleaved orders.
                        let pg = (k * 7 + t * 13 + round) % n;
                        // SAFETY: the region is n pages long and outlives the threads.
                        let page = unsafe { std::slice::from_raw_parts((base + pg * PAGE) as *const u8, PAGE) };
                        if !page_matches(page, pg, 3) {
                            bad += 1;
                        }
                    }
                }
                bad
            })
        })
        .collect();
    let bad: usize = readers.into_iter().map(|h| h.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    evicter.join().unwrap();
    assert_eq!(bad, 0);
    let st = p.stats();
    assert!(st.counters.faults_swapped + st.counters.faults_staged > 0);
}

/// Direct reclaim: fault threads that wait for room evict staged blocks themselves, beside
/// the reclaim thread, so two or three evictors work on one region at once, from an
/// inactive list the reclaim thread stages ahead (`stage_ahead`) or not. Writers on four
/// threads rewrite and check their pages through a budget an eighth of the data.
#[test]
fn direct_reclaim_evicts_beside_the_reclaim_thread_and_loses_nothing() {
    for (direct, ahead) in [(true, true), (true, false), (false, true)] {
        let p = start(PagerConfig {
            direct_reclaim: direct,
            stage_ahead: ahead,
            ..config(4 << 20, "zero,pool,file", FaultMode::Thread, 2)
        });
        let n = 8192; // 32 MiB
        let r = p.region(n * PAGE, Hint::Normal).unwrap();
        let base = r.as_ptr() as usize;
        let writers: Vec<_> = (0..4usize)
            .map(|t| {
                std::thread::spawn(move || {
                    let mut bad = 0u64;
                    for gen in 1..=4u64 {
                        for pg in (t..n).step_by(4) {
                            // SAFETY: this thread alone writes page pg; the region outlives it.
                            let page = unsafe { std::slice::from_raw_parts_mut((base + pg * PAGE) as *mut u8, PAGE) };
                            if gen > 1 && !page_matches(page, pg, gen - 1) {
                                bad += 1;
                            }
                            fill_page(page, pg, gen);
                        }
                    }
                    bad
                })
            })
            .collect();
        let bad: u64 = writers.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(
            bad, 0,
            "direct reclaim {direct}, staging ahead {ahead}: a page came back with an older generation or torn"
        );
        let mem = r.as_slice();
        let wrong = (0..n).filter(|&pg| !page_matches(&mem[pg * PAGE..(pg + 1) * PAGE], pg, 4)).count();
        assert_eq!(wrong, 0, "direct reclaim {direct}, staging ahead {ahead}: pages wrong after the writers");
        let c = p.stats().counters;
        assert!(c.pgsteal >= (n as u64) * 3, "the data went through eviction: {c:?}");
        assert!(c.pgscan_direct_throttle <= c.throttled_faults, "{c:?}");
        if direct {
            assert!(c.pgsteal_direct > 0 && c.pgsteal_direct < c.pgsteal, "both evicted: {c:?}");
        } else {
            assert_eq!(c.pgsteal_direct, 0, "{c:?}");
            assert_eq!(
                c.pgscan_direct_throttle, c.throttled_faults,
                "without direct reclaim every waiting fault sleeps: {c:?}"
            );
        }
        drop(r);
        assert_eq!(p.stats().swap_slots, 0, "direct reclaim {direct}, staging ahead {ahead}: every slot freed");
    }
}

/// Reads every page of `[from, to)` again and again, checking each against `salt`, until
/// `for_how_long` has passed; the pages read and the mismatches.
fn read_for(base: usize, (from, to): (usize, usize), salt: u64, for_how_long: Duration) -> (u64, u64) {
    let t0 = std::time::Instant::now();
    let (mut read, mut bad) = (0u64, 0u64);
    while t0.elapsed() < for_how_long {
        for pg in from..to {
            // SAFETY: the region outlives the readers, and nobody writes it while they read.
            let page = unsafe { std::slice::from_raw_parts((base + pg * PAGE) as *const u8, PAGE) };
            read += 1;
            bad += u64::from(!page_matches(page, pg, salt));
        }
    }
    (read, bad)
}

/// With following on, one fault thread polls while one program thread faults, and the lead
/// moves with the program from CPU to CPU; two program threads faulting side by side put
/// every fault thread back on the userfaultfd. Every page read is checked, and without
/// following neither counter moves.
#[test]
fn the_fault_thread_on_the_programs_cpu_serves_it_and_every_page_comes_back() {
    let cpus = tierswap::sys::allowed_cpus().expect("sched_getaffinity");
    let (first, last) = (cpus[0], *cpus.last().unwrap());
    for follow in [true, false] {
        let p = start(PagerConfig { fault_follow: follow, ..config(8 << 20, "zero,pool", FaultMode::Thread, 2) });
        let n = 8192; // 32 MiB through 8 MiB: every pass faults throughout
        let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
        let mem = r.as_mut_slice();
        for pg in 0..n {
            fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg, 3);
        }
        let base = r.as_ptr() as usize;
        // One program thread on the first CPU, long enough for a fault thread to take the
        // lead (50 ms of one thread's faults), then on the last.
        let (read, bad) = std::thread::spawn(move || {
            tierswap::sys::pin_thread(first).expect("sched_setaffinity");
            let a = read_for(base, (0, n), 3, Duration::from_millis(300));
            tierswap::sys::pin_thread(last).expect("sched_setaffinity");
            let b = read_for(base, (0, n), 3, Duration::from_millis(300));
            (a.0 + b.0, a.1 + b.1)
        })
        .join()
        .unwrap();
        assert_eq!(bad, 0, "follow {follow}: {bad} of {read} pages read back wrong");
        let one = p.stats().counters;
        assert!(one.zswpin > 2 * n as u64, "follow {follow}: the passes faulted their pages in: {one:?}");
        // Two program threads side by side, one on each end of the CPU list.
        let readers: Vec<_> = [(first, 0, n / 2), (last, n / 2, n)]
            .into_iter()
            .map(|(cpu, from, to)| {
                std::thread::spawn(move || {
                    tierswap::sys::pin_thread(cpu).expect("sched_setaffinity");
                    read_for(base, (from, to), 3, Duration::from_millis(200))
                })
            })
            .collect();
        for h in readers {
            let (read, bad) = h.join().unwrap();
            assert_eq!(bad, 0, "follow {follow}, two threads: {bad} of {read} pages read back wrong");
        }
        let c = p.stats().counters;
        if !follow {
            assert_eq!((c.fault_follow_moves, c.fault_follow_all), (0, 0), "{c:?}");
        } else if first != last {
            assert!(one.fault_follow_moves >= 1, "the lead followed the program to the last CPU: {one:?}");
            assert!(c.fault_follow_all > one.fault_follow_all, "two threads: everyone polls again: {c:?}");
        } else {
            assert_eq!(c.fault_follow_moves, 0, "one CPU: nowhere to move the lead to: {c:?}");
        }
        drop(r);
        assert_eq!(p.stats().swap_slots, 0, "follow {follow}: every slot freed");
    }
}

/// Reclaim evicts down to its low watermark (1/12 of the budget under it) while the program
/// faults pages in, for headroom; once the program stops faulting it stops at the high
/// watermark (1/32 under), leaving what the program may touch next in memory.
#[test]
fn reclaim_stops_at_the_high_watermark_once_the_program_stops_faulting() {
    let budget = 64u64 << 20;
    let p = pager(budget, "zero,pool,file", FaultMode::Thread, 2);
    let n = 2 * budget as usize / PAGE;
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    let mem = r.as_mut_slice();
    for pg in 0..n {
        fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg, 7);
    }
    assert!(p.settle(Duration::from_secs(30)), "reclaim settles: {:?}", p.stats());
    let st = p.stats();
    let (low, high) = (budget - budget / 12, budget - budget / 32);
    assert!(st.counters.pgsteal > 0, "the fill went through eviction: {st:?}");
    assert!(
        st.footprint > low && st.footprint <= high,
        "the footprint {} B stays between the low ({low}) and high ({high}) watermarks: {st:?}",
        st.footprint
    );
    let mem = r.as_slice();
    let wrong = (0..n).filter(|&pg| !page_matches(&mem[pg * PAGE..(pg + 1) * PAGE], pg, 7)).count();
    assert_eq!(wrong, 0, "every page reads back");
}

/// A program faulting pages in more slowly than reclaim evicts never waits for room: with
/// `throttle_headroom` reclaim then stops at its high watermark instead of evicting on to
/// the low one (pages the program may touch next, evicted for nothing); without it, any
/// fault during a batch sends it down to the low watermark.
#[test]
fn reclaim_keeps_to_the_high_watermark_while_no_fault_waits_for_room() {
    let budget = 64u64 << 20;
    let (low, high) = (budget - budget / 12, budget - budget / 32);
    for headroom in [true, false] {
        let p = Arc::new(start(PagerConfig {
            throttle_headroom: headroom,
            ..config(budget, "zero,pool", FaultMode::Thread, 2)
        }));
        let n = 3 * budget as usize / PAGE;
        let mut r = p.region(n * PAGE, Hint::Random).unwrap();
        let mem = r.as_mut_slice();
        for pg in 0..n {
            fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg, 5);
        }
        assert!(p.settle(Duration::from_secs(30)), "reclaim settles: {:?}", p.stats());
        let before = p.stats().counters;
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (p, stop) = (p.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut lowest = u64::MAX;
                while !stop.load(Ordering::Relaxed) {
                    lowest = lowest.min(p.stats().footprint);
                    std::thread::sleep(Duration::from_micros(500));
                }
                lowest
            })
        };
        // One page of each of the first 3,000 8-page blocks (swapped out first), slowly.
        let mem = r.as_slice();
        let mut wrong = 0;
        for b in 0..3000 {
            let pg = b * 8 + b % 8;
            wrong += usize::from(!page_matches(&mem[pg * PAGE..(pg + 1) * PAGE], pg, 5));
            std::thread::sleep(Duration::from_micros(150));
        }
        stop.store(true, Ordering::Relaxed);
        let lowest = sampler.join().unwrap();
        let c = p.stats().counters;
        assert_eq!(wrong, 0, "headroom {headroom}: every page reads back");
        assert!(c.zswpin - before.zswpin >= 2900, "headroom {headroom}: the reads faulted pages in: {c:?}");
        assert!(c.pgsteal - before.pgsteal >= 1024, "headroom {headroom}: and reclaim evicted for them: {c:?}");
        assert_eq!(c.throttled_faults, before.throttled_faults, "headroom {headroom}: no read waited for room");
        if headroom {
            assert!(lowest > low, "the footprint stayed over the low watermark {low}: lowest {lowest} (high {high})");
        } else {
            assert!(lowest <= low, "without: reclaim went down to the low watermark {low}: lowest {lowest}");
        }
    }
}

#[test]
fn writes_racing_eviction_are_never_lost() {
    let p = Arc::new(pager(4 << 20, "zero,pool,file", FaultMode::Thread, 2));
    let n = 2048;
    let r = p.region(n * PAGE, Hint::Normal).unwrap();
    let base = r.as_ptr() as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let evicter = {
        let (p, stop) = (p.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                p.evict_all();
            }
        })
    };
    // Each writer owns the pages pg % 2 == t: it writes a generation number into a page and
    // reads it back at once and later; any lost write shows up as an older generation.
    let writers: Vec<_> = (0..2usize)
        .map(|t| {
            std::thread::spawn(move || {
                let mut bad = 0u64;
                for gen in 1..=20u64 {
                    for pg in (t..n).step_by(2) {
                        // SAFETY: this thread alone writes page pg; the region outlives it.
                        let page = unsafe { std::slice::from_raw_parts_mut((base + pg * PAGE) as *mut u8, PAGE) };
                        fill_page(page, pg, gen);
                        if !page_matches(page, pg, gen) {
                            bad += 1;
                        }
                    }
                    for pg in (t..n).step_by(2) {
                        // SAFETY: as above.
                        let page = unsafe { std::slice::from_raw_parts((base + pg * PAGE) as *const u8, PAGE) };
                        if !page_matches(page, pg, gen) {
                            bad += 1;
                        }
                    }
                }
                bad
            })
        })
        .collect();
    let bad: u64 = writers.into_iter().map(|h| h.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    evicter.join().unwrap();
    assert_eq!(bad, 0, "a write was lost or torn by eviction");
    let st = p.stats();
    assert!(st.counters.pgsteal > 0, "eviction ran");
    assert!(st.counters.faults_swapped > 0, "pages came back from slots");
    drop(r);
    assert_eq!(p.stats().swap_slots, 0);
}

#[test]
fn pool_only_keeps_incompressible_pages_raw_and_counts_them() {
    let p = pager(8 << 20, "zero,pool", FaultMode::Thread, 2);
    let n = 256;
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    let mem = r.as_mut_slice();
    for pg in 0..n {
        noise_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg as u64);
    }
    p.evict_all();
    assert_eq!(r.page_states(), (0, 0, n), "every page evicted");
    let mem = r.as_slice();
    let st = p.stats();
    assert_eq!(st.counters.pool_reject_incompressible, n as u64);
    assert_eq!(st.counters.pool_stored_raw, n as u64);
    assert_eq!(st.counters.pswpout, 0);
    let mut expect = vec![0u8; PAGE];
    for pg in 0..n {
        noise_page(&mut expect, pg as u64);
        assert_eq!(&mem[pg * PAGE..(pg + 1) * PAGE], &expect[..], "page {pg}");
    }
}

/// A page of lowercase words (2 to 9 letters, spaces between) for `seed`: text a fast zstd
/// level leaves raw.
fn words_page(page: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut i = 0;
    while i < page.len() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let word = 2 + (x % 8) as usize;
        for k in 0..word.min(page.len() - i) {
            page[i + k] = b'a' + ((x >> (8 + 5 * k)) % 26) as u8;
        }
        i += word;
        if i < page.len() {
            page[i] = b' ';
            i += 1;
        }
    }
}

#[test]
fn text_goes_to_the_pool_compressed_with_the_literal_retry() {
    let n = 256;
    for retry in [false, true] {
        let p = start(PagerConfig { literal_retry: retry, ..config(8 << 20, "zero,pool", FaultMode::Thread, 2) });
        let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
        let mem = r.as_mut_slice();
        for pg in 0..n {
            words_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg as u64);
        }
        p.evict_all();
        assert_eq!(r.page_states(), (0, 0, n), "every page evicted");
        let st = p.stats();
        if retry {
            assert_eq!(st.counters.pool_reject_incompressible, 0);
            assert_eq!(st.counters.zswpout, n as u64);
            assert!(st.pool_stored_bytes < (n * PAGE * 70 / 100) as u64, "{} bytes stored", st.pool_stored_bytes);
        } else {
            assert_eq!(st.counters.pool_reject_incompressible, n as u64);
            assert_eq!(st.counters.pool_stored_raw, n as u64);
        }
        let mem = r.as_slice();
        let mut expect = vec![0u8; PAGE];
        for pg in 0..n {
            words_page(&mut expect, pg as u64);
            assert_eq!(&mem[pg * PAGE..(pg + 1) * PAGE], &expect[..], "page {pg}, retry {retry}");
        }
        assert_eq!(p.stats().counters.zswpin, n as u64, "every page read back from the pool");
    }
}

#[test]
fn first_touch_reads_zero_and_bad_sizes_are_refused() {
    let p = pager(8 << 20, "zero,pool", FaultMode::Thread, 2);
    let r = p.region(10 * PAGE + 1, Hint::Random).unwrap();
    assert_eq!(r.len(), 11 * PAGE);
    // SAFETY: the region is 11 pages long.
    let s = unsafe { std::slice::from_raw_parts(r.as_ptr(), r.len()) };
    assert!(s.iter().all(|&b| b == 0));
    assert!(p.region(0, Hint::Normal).is_err());
    assert!(Pager::new(PagerConfig { budget_bytes: 1 << 20, ..Default::default() }).is_err());
}

#[test]
fn pages_the_program_drops_read_back_as_zeros() {
    let p = pager(8 << 20, "zero,pool,file", FaultMode::Thread, 2);
    let n = 64;
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    let mem = r.as_mut_slice();
    for pg in 0..n {
        fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg, 9);
    }
    // The program discards pages 8..24 (MADV_DONTNEED means: contents thrown away).
    // SAFETY: a range of our own region.
    assert_eq!(
        unsafe { libc::madvise(mem.as_mut_ptr().add(8 * PAGE) as *mut libc::c_void, 16 * PAGE, libc::MADV_DONTNEED) },
        0
    );
    p.evict_all();
    for pg in 0..n {
        let page = &mem[pg * PAGE..(pg + 1) * PAGE];
        if (8..24).contains(&pg) {
            assert!(page.iter().all(|&b| b == 0), "dropped page {pg} reads zeros");
        } else {
            assert!(page_matches(page, pg, 9), "page {pg} intact");
        }
    }
    drop(r);
    let st = p.stats();
    assert_eq!((st.swap_slots, st.present_pages, st.staged_pages), (0, 0, 0));
}
