//! Hardware abstraction for mscclpp-rs: host, CUDA and ROCm backends, GPU IPC,
//! run-time libibverbs and GDRCopy.

pub mod gdr;
pub mod ibv;
