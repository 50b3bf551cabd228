//! (stub for type-checking; replaced by the real wrappers)
#![allow(missing_docs, unused_variables)]
use std::os::fd::RawFd;
pub type Result<T> = std::result::Result<T, Error>;
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("x")] PageExist { op: &'static str, done_bytes: usize },
    #[error("x")] Again { op: &'static str, done_bytes: usize },
    #[error("x")] NoPage { op: &'static str, done_bytes: usize },
    #[error("x")] Busy { op: &'static str, done_bytes: usize },
    #[error("x")] ProcessGone { op: &'static str },
    #[error("x")] Invalid { op: &'static str },
}
pub mod features { pub const MOVE: u64 = 1 << 16; }
#[derive(Clone, Copy)] pub struct RegisterMode { pub missing: bool, pub wp: bool, pub minor: bool }
pub struct Readiness { pub uffd: bool, pub extra: bool }
pub enum Event { PageFault { addr: usize, write: bool, wp: bool, minor: bool, tid: u32 }, Other }
pub struct Uffd;
impl Uffd {
    pub fn new(features: u64, nonblock: bool) -> Result<Uffd> { todo!() }
    pub fn register(&self, start: usize, len: usize, mode: RegisterMode) -> Result<u64> { todo!() }
    pub fn unregister(&self, start: usize, len: usize) -> Result<()> { todo!() }
    pub fn copy(&self, dst: usize, src: &[u8], dontwake: bool, wp: bool) -> Result<usize> { todo!() }
    pub fn zeropage(&self, dst: usize, len: usize, dontwake: bool) -> Result<usize> { todo!() }
    pub unsafe fn move_pages(&self, dst: usize, src: usize, len: usize, dontwake: bool, holes: bool) -> Result<usize> { todo!() }
    pub fn wake(&self, start: usize, len: usize) -> Result<()> { todo!() }
    pub fn poison(&self, start: usize, len: usize, dontwake: bool) -> Result<usize> { todo!() }
    pub fn read_events(&self, out: &mut Vec<Event>, max: usize) -> Result<usize> { todo!() }
    pub fn poll_readable(&self, timeout_ms: i32, extra: Option<RawFd>) -> Result<Readiness> { todo!() }
}
