//! Zero and same-filled pages: recognised on the way out, recreated on the way in, stored
//! nowhere (the swap entry holds the pattern).

use crate::page::PAGE_SIZE;

/// What a page is filled with, if it is one repeated 8-byte word.
#[inline]
pub fn same_filled_pattern(page: &[u8]) -> Option<u64> {
    debug_assert_eq!(page.len(), PAGE_SIZE);
    let (head, words, tail) = {
        // SAFETY: u64 has no invalid bit patterns; align_to only yields aligned words.
        unsafe { page.align_to::<u64>() }
    };
    if !head.is_empty() || !tail.is_empty() {
        // Unaligned buffer: compare bytewise with the first 8 bytes.
        let first: [u8; 8] = page[..8].try_into().ok()?;
        return page.chunks_exact(8).all(|c| c == first).then(|| u64::from_ne_bytes(first));
    }
    let first = words[0];
    // Check the last word first: most pages that are not same-filled differ there.
    if words[words.len() - 1] != first {
        return None;
    }
    words.iter().all(|&w| w == first).then_some(first)
}

/// Fills a page with `pattern` repeated.
#[inline]
pub fn fill_pattern(page: &mut [u8], pattern: u64) {
    let bytes = pattern.to_ne_bytes();
    for c in page.chunks_exact_mut(8) {
        c.copy_from_slice(&bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_patterns() {
        let mut page = vec![0u8; PAGE_SIZE];
        assert_eq!(same_filled_pattern(&page), Some(0));
        fill_pattern(&mut page, 0xdead_beef_0000_0001);
        assert_eq!(same_filled_pattern(&page), Some(0xdead_beef_0000_0001));
        page[4095] ^= 1;
        assert_eq!(same_filled_pattern(&page), None);
        page[4095] ^= 1;
        page[8] ^= 1;
        assert_eq!(same_filled_pattern(&page), None);
        let mut buf = vec![0xffu8; PAGE_SIZE + 1];
        assert_eq!(same_filled_pattern(&buf[1..]), Some(u64::MAX));
        buf[100] = 0;
        assert_eq!(same_filled_pattern(&buf[1..]), None);
    }
}
