//! dma-buf export of device memory, so an RDMA NIC can register it with `ibv_reg_dmabuf_mr`
//! (or mlx5 Data Direct) without the `nvidia-peermem` kernel module.
//!
//! CUDA exports with `cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)` when
//! the device reports `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`; the host backend hands out a
//! duplicate of the memfd behind the allocation (a test provider maps it); ROCm reports
//! [`crate::Error::Unsupported`] (hip-sys binds no dma-buf export).

use std::os::fd::OwnedFd;

/// A dma-buf fd covering a device range, owned by whoever registers it (closed on drop).
#[derive(Debug)]
pub struct DmaBuf {
    /// The dma-buf (or, on the host backend, memfd) descriptor.
    pub fd: OwnedFd,
    /// Byte offset inside the dma-buf of the first requested byte.
    pub offset: u64,
    /// Requested bytes (the dma-buf may cover more: it is page aligned).
    pub len: usize,
}

/// dma-buf export of device memory (each backend's `dmabuf.rs` or `memory.rs`).
pub trait DmaBufApi {
    /// Exports `len` bytes at `offset` of `mem` as a dma-buf fd. `Unsupported` names why when
    /// the device, driver or allocation kind cannot.
    fn export_dmabuf(
        mem: &<Self as crate::Api>::Memory,
        offset: usize,
        len: usize,
    ) -> crate::Result<DmaBuf>
    where
        Self: crate::Api;
}
