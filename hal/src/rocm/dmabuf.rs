//! dma-buf export for ROCm ([`crate::DmaBufApi`] for [`Rocm`]): not available in this build.
//!
//! ROCm exports dma-bufs through `hsa_amd_portable_export_dmabuf` in libhsa-runtime64, which
//! hip-sys does not bind; until that is loaded here, export reports `Unsupported` and IB
//! registration of ROCm memory falls back to `ibv_reg_mr` (which needs amdgpu peer memory).

use super::memory::RocmMemory;
use super::Rocm;
use crate::{DmaBuf, DmaBufApi, Error, Result};

impl DmaBufApi for Rocm {
    fn export_dmabuf(_mem: &RocmMemory, _offset: usize, _len: usize) -> Result<DmaBuf> {
        Err(Error::Unsupported {
            op: "export_dmabuf",
            backend: "rocm",
            reason: "hsa_amd_portable_export_dmabuf is not bound in this build (hip-sys has no \
                     dma-buf export)"
                .into(),
        })
    }
}
