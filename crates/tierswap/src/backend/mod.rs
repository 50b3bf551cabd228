//! Backends: where a swapped page's bytes live.
pub mod compress;
pub mod pool;
