//! Page math in one place: sizes, alignment, index conversions.

/// Bytes in a base page (x86_64 and the targets we run on).
pub const PAGE_SIZE: usize = 4096;
/// log2 of [`PAGE_SIZE`].
pub const PAGE_SHIFT: u32 = 12;
/// Pages in one 64 KiB block, the unit of aging, staging and large swap-in.
pub const BLOCK_PAGES: usize = 16;
/// Bytes in one 64 KiB block.
pub const BLOCK_SIZE: usize = BLOCK_PAGES * PAGE_SIZE;

/// Rounds `len_bytes` up to a whole number of pages.
#[inline]
pub const fn round_up_pages(len_bytes: usize) -> usize {
    (len_bytes + PAGE_SIZE - 1) & !(PAGE_SIZE - 1)
}

/// Number of pages needed to hold `len_bytes`.
#[inline]
pub const fn pages_for(len_bytes: usize) -> usize {
    round_up_pages(len_bytes) >> PAGE_SHIFT
}

/// Rounds an address down to its page.
#[inline]
pub const fn page_align_down(addr: usize) -> usize {
    addr & !(PAGE_SIZE - 1)
}

/// Bytes of `n_pages` pages.
#[inline]
pub const fn pages_to_bytes(n_pages: usize) -> usize {
    n_pages << PAGE_SHIFT
}

/// Rounds `len_bytes` up to a multiple of `align` (a power of two).
#[inline]
pub const fn round_up(len_bytes: usize, align: usize) -> usize {
    (len_bytes + align - 1) & !(align - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding() {
        assert_eq!(round_up_pages(0), 0);
        assert_eq!(round_up_pages(1), PAGE_SIZE);
        assert_eq!(round_up_pages(PAGE_SIZE), PAGE_SIZE);
        assert_eq!(pages_for(PAGE_SIZE + 1), 2);
        assert_eq!(page_align_down(PAGE_SIZE * 3 + 17), PAGE_SIZE * 3);
        assert_eq!(round_up(65, 64), 128);
        assert_eq!(pages_to_bytes(BLOCK_PAGES), BLOCK_SIZE);
    }
}
