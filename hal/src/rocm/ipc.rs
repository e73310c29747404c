//! ROCm IPC: hipIpcGetMemHandle / hipIpcOpenMemHandle through the AMD IPC handle cache
//! ([`crate::ipc_cache`]): one open mapping per handle per process, closed by the last release
//! ([`crate::IpcApi`] for [`Rocm`]).

use super::conv::{
    ipc_handle_bytes, ipc_handle_from, ipc_key, HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
};
use super::device::RocmDevice;
use super::memory::RocmMemory;
use super::result::ipc;
use super::Rocm;
use crate::auxil::fdpass::host_id;
use crate::ipc_cache::{CachedMapping, IpcHandleCache, IpcOpener};
use crate::{Buffer, Error, IpcApi, IpcDescriptor, IpcKind, Result};
use std::sync::OnceLock;

/// The cache's seam implementation for HIP.
#[derive(Debug)]
pub struct HipOpener;

impl IpcOpener for HipOpener {
    type Key = [u8; 64];
    type Mapping = u64;
    fn open(&self, key: &[u8; 64]) -> Result<u64> {
        ipc::open_handle(ipc_handle_from(key), HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    }
    fn close(&self, _key: &[u8; 64], mapping: &u64) -> Result<()> {
        // SAFETY: mapping came from hipIpcOpenMemHandle and is closed once (by the cache,
        // after the last user released it).
        unsafe { ipc::close_handle(*mapping) }
    }
}

fn cache() -> &'static IpcHandleCache<HipOpener> {
    static CACHE: OnceLock<IpcHandleCache<HipOpener>> = OnceLock::new();
    CACHE.get_or_init(|| IpcHandleCache::new(HipOpener))
}

/// Memory of another process, shared through the handle cache.
#[derive(Debug)]
pub struct RocmImported {
    mapping: CachedMapping<HipOpener>,
    offset: u64,
    size: usize,
}

impl Buffer for RocmImported {
    fn device_ptr(&self) -> u64 {
        *self.mapping.mapping() + self.offset
    }
    fn size(&self) -> usize {
        self.size
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        None
    }
}

impl IpcApi for Rocm {
    fn ipc_kinds(mem: &RocmMemory) -> Vec<IpcKind> {
        if mem.host.is_some() {
            Vec::new()
        } else {
            vec![IpcKind::Legacy]
        }
    }

    fn export(mem: &RocmMemory, kind: IpcKind) -> Result<IpcDescriptor> {
        if kind != IpcKind::Legacy || mem.host.is_some() {
            return Err(Error::Unsupported {
                op: "export",
                backend: "rocm",
                reason: format!(
                    "{kind:?} for {:?} memory (ROCm exports device memory as Legacy)",
                    mem.kind()
                ),
            });
        }
        mem.dev.enter()?;
        let handle = ipc::get_handle(mem.ptr)?;
        Ok(IpcDescriptor {
            kind,
            size: mem.size() as u64,
            offset: 0,
            pid: std::process::id(),
            host_id: host_id(),
            fd_id: 0,
            handle: ipc_handle_bytes(&handle),
        })
    }

    /// Not yet on ROCm: the HIP table (`sys.rs`) loads neither `hipMemGetAddressRange` nor
    /// `hipPointerGetAttribute`, which finding the allocation behind a pointer needs.
    fn adopt(
        _dev: &RocmDevice,
        ptr: u64,
        len: usize,
    ) -> Result<(RocmMemory, crate::AllocationIdentity)> {
        Err(adopt_unsupported(ptr, len))
    }
    fn identity(_dev: &RocmDevice, ptr: u64, len: usize) -> Result<crate::AllocationIdentity> {
        Err(adopt_unsupported(ptr, len))
    }

    fn import(dev: &RocmDevice, desc: &IpcDescriptor) -> Result<RocmImported> {
        if desc.kind != IpcKind::Legacy {
            return Err(Error::Unsupported {
                op: "import",
                backend: "rocm",
                reason: format!("{:?} (ROCm imports Legacy handles)", desc.kind),
            });
        }
        let key = ipc_key(desc)?;
        let size = usize::try_from(desc.size)
            .map_err(|_| Error::BadDescriptor("size does not fit usize".into()))?;
        dev.enter()?;
        let mapping = cache().open(&key)?;
        Ok(RocmImported {
            mapping,
            offset: desc.offset,
            size,
        })
    }
}

fn adopt_unsupported(ptr: u64, len: usize) -> Error {
    Error::Unsupported {
        op: "adopt",
        backend: "rocm",
        reason: format!(
            "{ptr:#x} (+{len} bytes): registering memory this library did not allocate is not \
             implemented on ROCm yet; allocate it through the library"
        ),
    }
}
