//! Pure decisions over the engine state (aging, admission, readahead), no syscalls.

pub mod admission;
pub mod readahead;
