//! (being written)

/// Placeholder until the wrappers land.
#[derive(Debug, thiserror::Error)]
#[error("userfaultfd placeholder")]
pub struct Error;
