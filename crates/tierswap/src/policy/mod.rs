//! Pure decisions over the engine state (aging, admission, readahead, stride prefetch), no
//! syscalls.

pub mod admission;
pub mod readahead;
pub mod stride;
