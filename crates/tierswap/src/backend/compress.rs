//! (stub)
#![allow(missing_docs, unused_variables)]
use crate::config::Compressor;
pub const INCOMPRESSIBLE_LIMIT: usize = 3072;
#[derive(Debug, thiserror::Error)] #[error("x")] pub struct CodecError;
pub fn compress(c: Compressor, src: &[u8], dst: &mut [u8]) -> Option<usize> { todo!() }
pub fn decompress(c: Compressor, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> { todo!() }
