//! ROCm IPC: hipIpcGetMemHandle / hipIpcOpenMemHandle through the AMD IPC handle cache
//! ([`crate::ipc_cache`]): one open mapping per handle per process, closed by the last release.

use super::conv::{check, hip};
use super::device::RocmDevice;
use super::memory::RocmMemory;
use crate::fdpass::host_id;
use crate::ipc_cache::{CachedMapping, IpcHandleCache, IpcOpener};
use crate::{Buffer, Error, IpcDescriptor, IpcKind, Result};
use hip_sys::hiprt::hipIpcMemHandle_t;
use std::ffi::c_void;
use std::sync::OnceLock;

const HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: u32 = 1;

/// The cache's seam implementation for HIP.
#[derive(Debug)]
pub struct HipOpener;

impl IpcOpener for HipOpener {
    type Key = [u8; 64];
    type Mapping = u64;
    fn open(&self, key: &[u8; 64]) -> Result<u64> {
        let h = hip()?;
        // SAFETY: plain C struct of 64 bytes.
        let mut handle: hipIpcMemHandle_t = unsafe { std::mem::zeroed() };
        for (d, s) in handle.reserved.iter_mut().zip(key) {
            *d = *s as _;
        }
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out pointer; the handle came from hipIpcGetMemHandle in the exporter.
        check("hipIpcOpenMemHandle", unsafe {
            (h.hipIpcOpenMemHandle)(&mut p, handle, HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        })?;
        Ok(p as usize as u64)
    }
    fn close(&self, _key: &[u8; 64], mapping: &u64) -> Result<()> {
        let h = hip()?;
        // SAFETY: mapping came from hipIpcOpenMemHandle and is closed once (by the cache).
        check("hipIpcCloseMemHandle", unsafe {
            (h.hipIpcCloseMemHandle)(*mapping as usize as *mut c_void)
        })
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

pub(super) fn export(mem: &RocmMemory, kind: IpcKind) -> Result<IpcDescriptor> {
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
    let h = hip()?;
    mem.dev.bind()?;
    // SAFETY: plain C struct.
    let mut handle: hipIpcMemHandle_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer; ptr is the base of a hipMalloc allocation.
    check("hipIpcGetMemHandle", unsafe {
        (h.hipIpcGetMemHandle)(&mut handle, mem.ptr as usize as *mut c_void)
    })?;
    Ok(IpcDescriptor {
        kind,
        size: mem.size() as u64,
        offset: 0,
        pid: std::process::id(),
        host_id: host_id(),
        fd_id: 0,
        handle: handle.reserved.iter().map(|c| *c as u8).collect(),
    })
}

pub(super) fn import(dev: &RocmDevice, desc: &IpcDescriptor) -> Result<RocmImported> {
    if desc.kind != IpcKind::Legacy {
        return Err(Error::Unsupported {
            op: "import",
            backend: "rocm",
            reason: format!("{:?} (ROCm imports Legacy handles)", desc.kind),
        });
    }
    let key: [u8; 64] = desc.handle.as_slice().try_into().map_err(|_| {
        Error::BadDescriptor(format!(
            "Legacy: expected a 64-byte handle, got {}",
            desc.handle.len()
        ))
    })?;
    let size = usize::try_from(desc.size)
        .map_err(|_| Error::BadDescriptor("size does not fit usize".into()))?;
    dev.bind()?;
    let mapping = cache().open(&key)?;
    Ok(RocmImported {
        mapping,
        offset: desc.offset,
        size,
    })
}
