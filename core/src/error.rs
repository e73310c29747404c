//! Errors (placeholder).
#[derive(Debug)]
pub enum ErrorCode { InternalError }
#[derive(Debug)]
pub struct Error;
pub type Result<T> = std::result::Result<T, Error>;
