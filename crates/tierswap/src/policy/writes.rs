//! What a region does with the pages it reads back clean: whether writes follow them
//! (`write_predict`: read faults then install pages writable, as the kernel maps a
//! swapped-in page writable, so the write costs no fault), and whether its write faults run
//! along the address space (`wp_block_adapt`: a write fault then takes its whole block).
//!
//! A clean page is one that came back from a slot still holding its bytes, mapped
//! write-protected so that a write is seen before the slot is trusted again. Each such
//! write is a fault served by a fault thread, a hand-off of 10–20 µs on this machine kind
//! (docs/design.md, "Measured costs"). memcached marks every item it serves (its last
//! access time) and sqlite's page cache its page headers: about one write fault a request
//! there, right after the read fault that brought the page in.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Relaxed};

/// The score at and above which read faults install pages writable.
const PREDICT_AT: u32 = 32;
/// The score's ceiling: how much evidence a change of behaviour has to outweigh.
const SCORE_MAX: u32 = 64;
/// While predicting, one read fault in this many still comes in clean, to keep measuring.
const SAMPLE_EVERY: u32 = 8;

/// The pager's record of the program's writes to clean pages: two words, relaxed atomics
/// (a lost update makes one decision a little off, never a wrong byte: a page installed
/// writable simply has no kept slot). One for the whole program, not one per region: a
/// server's data lies in many regions (memcached's slabs are 1 MiB mappings of their
/// own), each faulting too rarely to learn alone.
#[derive(Debug, Default)]
pub struct Writes {
    /// Rises by 2 for each write fault on a clean page, falls by 1 for each page a read
    /// fault brought in clean: it climbs while more than every second such page is written.
    score: AtomicU32,
    /// Read faults decided while predicting, for sampling.
    decided: AtomicU32,
}

impl Writes {
    /// Whether the read fault about to swap a page in should install it writable (no kept
    /// slot). A fault that returns false is counted as a page read in clean
    /// ([`Writes::note_clean_read`] is the caller's, once it knows the page kept its slot).
    pub fn predict_write(&self) -> bool {
        if self.score.load(Relaxed) < PREDICT_AT {
            return false;
        }
        !self.decided.fetch_add(1, Relaxed).is_multiple_of(SAMPLE_EVERY)
    }

    /// A read fault brought a page in clean (it kept its slot).
    pub fn note_clean_read(&self) {
        let _ = self.score.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(1)));
    }

    /// A write fault on a clean page of block `block` of a region whose last such fault
    /// was in block `last_block` (`usize::MAX`: none; set to `block`); returns whether the
    /// write should take the whole block: the last one was in this block or a neighbour.
    pub fn note_write_fault(&self, last_block: &AtomicUsize, block: usize) -> bool {
        let _ = self.score.fetch_update(Relaxed, Relaxed, |v| Some((v + 2).min(SCORE_MAX)));
        let last = last_block.swap(block, Relaxed);
        last != usize::MAX && last.abs_diff(block) <= 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `rounds` read faults, each followed by a write fault with probability
    /// `written_per_8 / 8` (deterministically spread); returns how many of the last 64 read
    /// faults were predicted writes.
    fn run(w: &Writes, rounds: u32, written_per_8: u32) -> u32 {
        let mut predicted = 0;
        for k in 0..rounds {
            let write = k % 8 < written_per_8;
            let p = w.predict_write();
            if k >= rounds - 64 && p {
                predicted += 1;
            }
            if !p {
                w.note_clean_read();
                if write {
                    w.note_write_fault(&AtomicUsize::new(usize::MAX), k as usize * 7);
                }
            }
        }
        predicted
    }

    #[test]
    fn predicts_writes_only_where_most_clean_reads_are_written() {
        let w = Writes::default();
        assert_eq!(run(&w, 400, 2), 0, "a quarter written: never predicted");
        let w = Writes::default();
        assert_eq!(run(&w, 400, 4), 0, "half written: the score does not climb");
        let w = Writes::default();
        let p = run(&w, 400, 8);
        assert_eq!(p, 64 - 64 / SAMPLE_EVERY, "every page written: all but the samples predicted");
        // The program stops writing: the samples bring the score down and prediction ends.
        let p = run(&w, 8 * 2 * SCORE_MAX, 0);
        assert_eq!(p, 0, "no writes any more: prediction stops");
    }

    #[test]
    fn a_write_takes_its_block_only_after_a_write_nearby() {
        let w = Writes::default();
        let (a, b) = (AtomicUsize::new(usize::MAX), AtomicUsize::new(usize::MAX));
        assert!(!w.note_write_fault(&a, 10), "the first write fault: its page alone");
        assert!(w.note_write_fault(&a, 10), "the same block again");
        assert!(w.note_write_fault(&a, 11), "the next block");
        assert!(w.note_write_fault(&a, 10), "the block before");
        assert!(!w.note_write_fault(&b, 11), "another region's first");
        assert!(!w.note_write_fault(&a, 500), "far away");
        assert!(!w.note_write_fault(&a, 3), "far away again");
    }
}
