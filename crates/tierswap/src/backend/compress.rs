//! compression
