//! Model test: random reads, writes and evictions on a region, compared byte for byte with a
//! plain Vec of pages.

mod common;

use common::{pager, PAGE};
use proptest::prelude::*;
use tierswap::{FaultMode, Hint};

const PAGES: usize = 96;

#[derive(Clone, Debug)]
enum Op {
    /// Write a page with content of a kind: 0 zero, 1 same-filled, 2 compressible, 3 random.
    Write { page: usize, kind: u8, seed: u64 },
    /// Write a few bytes somewhere in a page.
    Poke { page: usize, offset: usize, byte: u8 },
    /// Read a page and compare.
    Read { page: usize },
    /// Evict everything now.
    EvictAll,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..PAGES, 0u8..4, any::<u64>()).prop_map(|(page, kind, seed)| Op::Write { page, kind, seed }),
        2 => (0..PAGES, 0..PAGE, any::<u8>()).prop_map(|(page, offset, byte)| Op::Poke { page, offset, byte }),
        4 => (0..PAGES).prop_map(|page| Op::Read { page }),
        1 => Just(Op::EvictAll),
    ]
}

fn content(kind: u8, seed: u64, out: &mut [u8]) {
    match kind {
        0 => out.fill(0),
        1 => {
            for w in out.chunks_exact_mut(8) {
                w.copy_from_slice(&seed.to_le_bytes());
            }
        }
        2 => {
            for (i, w) in out.chunks_exact_mut(8).enumerate() {
                w.copy_from_slice(&(seed.wrapping_add(i as u64 / 4)).to_le_bytes());
            }
        }
        _ => {
            let mut x = seed | 1;
            for w in out.chunks_exact_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                w.copy_from_slice(&x.to_le_bytes());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn region_behaves_like_a_vec(ops in proptest::collection::vec(op(), 1..120), tiers in 0usize..3) {
        let tiers = ["zero,pool,file", "zero,pool", "pool,file"][tiers];
        let p = pager(4 << 20, tiers, FaultMode::Thread, 2);
        let mut r = p.region(PAGES * PAGE, Hint::Normal).unwrap();
        let mut model = vec![0u8; PAGES * PAGE];
        let mut buf = vec![0u8; PAGE];
        for op in &ops {
            let mem = r.as_mut_slice();
            match *op {
                Op::Write { page, kind, seed } => {
                    content(kind, seed, &mut buf);
                    mem[page * PAGE..(page + 1) * PAGE].copy_from_slice(&buf);
                    model[page * PAGE..(page + 1) * PAGE].copy_from_slice(&buf);
                }
                Op::Poke { page, offset, byte } => {
                    mem[page * PAGE + offset] = byte;
                    model[page * PAGE + offset] = byte;
                }
                Op::Read { page } => {
                    prop_assert_eq!(&mem[page * PAGE..(page + 1) * PAGE], &model[page * PAGE..(page + 1) * PAGE], "page {}", page);
                }
                Op::EvictAll => {
                    p.evict_all();
                }
            }
        }
        p.evict_all();
        prop_assert!(r.as_mut_slice() == &model[..], "final contents differ");
        drop(r);
        prop_assert_eq!(p.stats().swap_slots, 0);
    }
}
