//! The engine's error type: what can go wrong creating or using a pager, each variant
//! saying what to do about it.

use thiserror::Error;

use crate::config::ConfigError;

/// What can go wrong creating or using a pager.
#[derive(Debug, Error)]
pub enum Error {
    /// The configuration cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// userfaultfd is missing, forbidden, or lacks a feature we need.
    #[error(transparent)]
    Uffd(#[from] crate::uffd::Error),
    /// A system call on our own memory or files failed.
    #[error("{what}: {source}")]
    Io {
        /// What we were doing.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A region of zero bytes, or larger than the address space allows.
    #[error("cannot create a region of {len_bytes} bytes: give a length between 1 byte and 64 TiB")]
    RegionSize {
        /// The length asked for.
        len_bytes: usize,
    },
    /// `adopt_grown` over memory that is managed already, or not page-aligned.
    #[error("cannot adopt {addr:#x}+{len_bytes}: give the page-aligned tail an mremap added to a managed mapping")]
    NotGrownTail {
        /// First byte asked for.
        addr: usize,
        /// Length asked for.
        len_bytes: usize,
    },
    /// A grant of inherited memory the pager cannot take over (events/fork.rs).
    #[error("cannot take over the inherited memory at {addr:#x}+{len_bytes}: it is not page-aligned, or the pager holds part of it already")]
    NotInherited {
        /// First byte granted.
        addr: usize,
        /// Length granted.
        len_bytes: usize,
    },
    /// An operation on a tier this pager was not configured with.
    #[error("this pager has no {0} tier (add it to the tiers)")]
    NoSuchTier(&'static str),
    /// The remote tier's cluster did not answer at start.
    #[error("cannot reach the remote tier {seeds}: {source} (start the cluster, or fix the seeds in --tiers remote=redis://HOST:PORT)")]
    Remote {
        /// The seeds tried.
        seeds: String,
        /// What failed.
        source: crate::backend::remote::RemoteError,
    },
}

/// The pager's `Result`.
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}
