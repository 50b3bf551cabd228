//! Pure decisions over the engine state (aging, admission, readahead, stride prefetch, the
//! pool's share of the budget, writes to clean pages), no syscalls.

pub mod admission;
pub mod pool_share;
pub mod readahead;
pub mod stride;
pub mod writes;
