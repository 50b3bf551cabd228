//! (stub)
#![allow(missing_docs, unused_variables)]
#[derive(Clone, Copy, Debug)] pub struct PoolHandle(u64);
impl PoolHandle { pub fn raw(self) -> u64 { self.0 } pub fn from_raw(r: u64) -> Option<PoolHandle> { Some(PoolHandle(r)) } }
#[derive(Debug, thiserror::Error)] pub enum PoolError { #[error("full")] Full }
pub struct Pool;
impl Pool {
    pub fn new(max_bytes: usize) -> std::io::Result<Pool> { todo!() }
    pub fn store(&self, data: &[u8]) -> Result<PoolHandle, PoolError> { todo!() }
    pub unsafe fn object(&self, h: PoolHandle, len: usize) -> &[u8] { todo!() }
    pub fn free(&self, h: PoolHandle, len: usize) { todo!() }
    pub fn total_bytes(&self) -> u64 { todo!() }
    pub fn stored_bytes(&self) -> u64 { todo!() }
    pub fn metadata_bytes(&self) -> u64 { todo!() }
}
