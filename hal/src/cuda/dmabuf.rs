//! dma-buf export of CUDA device memory ([`crate::DmaBufApi`] for [`Cuda`]): both cuMemAlloc
//! and cuMem (VMM) allocations, when the device reports `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.

use super::memory::{Backing, CudaMemory};
use super::result::mem;
use super::Cuda;
use crate::auxil::{check_range, os};
use crate::{DmaBuf, DmaBufApi, Error, Result};
use cudarc::driver::sys;
use std::os::fd::{FromRawFd, OwnedFd};

impl DmaBufApi for Cuda {
    fn export_dmabuf(mem: &CudaMemory, offset: usize, len: usize) -> Result<DmaBuf> {
        check_range("export_dmabuf(cuda)", mem.size, offset, len)?;
        if len == 0 {
            return Err(Error::invalid(
                "export_dmabuf(cuda)",
                "a non-zero length",
                "0",
            ));
        }
        let unsupported = |reason: String| Error::Unsupported {
            op: "export_dmabuf",
            backend: "cuda",
            reason,
        };
        if let Backing::Host(_) = mem.backing {
            return Err(unsupported(
                "HostMapped memory is host memory: register it with ibv_reg_mr".into(),
            ));
        }
        mem.dev.enter()?;
        let supported = mem.dev.attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
            "cuDeviceGetAttribute(DMA_BUF_SUPPORTED)",
        )?;
        if supported == 0 {
            return Err(unsupported(format!(
                "device {} reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0 (the kernel or driver \
                 lacks dma-buf support)",
                mem.dev.ordinal()
            )));
        }
        // The driver wants a host-page aligned range. Allocations start page aligned, cuMemAlloc
        // rounds sizes up to at least a page and VMM mappings to their granularity, so the
        // rounded range stays inside the allocation's mapping.
        let page = os::page_size() as u64;
        let start = mem.ptr + offset as u64;
        let base = start & !(page - 1);
        let end = (start + len as u64).div_ceil(page) * page;
        // SAFETY: base..end lies inside this live allocation (see above), bound on this thread.
        let fd = unsafe { mem::dmabuf_fd(base, (end - base) as usize) }?;
        if fd < 0 {
            return Err(unsupported(format!(
                "cuMemGetHandleForAddressRange returned success with fd {fd}"
            )));
        }
        // SAFETY: the driver handed us a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(DmaBuf {
            fd,
            offset: start - base,
            len,
        })
    }
}
