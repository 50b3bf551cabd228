//! Pure decisions over the engine state (aging, admission, readahead, stride prefetch, the
//! pool's share of the budget), no syscalls.

pub mod admission;
pub mod pool_share;
pub mod readahead;
pub mod stride;
