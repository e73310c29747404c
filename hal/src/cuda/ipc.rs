//! CUDA IPC: legacy cuIpc handles for cuMemAlloc memory; POSIX-fd (over the fd server) and
//! fabric exports of cuMem allocations; the same for the application's own allocations
//! ([`crate::IpcApi::adopt`], found behind any device pointer in `memory.rs`).
//!
//! Handle bytes in the descriptor: Legacy = the 64-byte `CUipcMemHandle`; PosixFd = the mapped
//! length (u64 LE); Fabric = the 64-byte `CUmemFabricHandle` then the mapped length (u64 LE).
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html> (cuIpc*),
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html> (cuMemExport/Import).
//! [`crate::IpcApi`] for [`Cuda`].

use super::conv::{ipc_handle_bytes, ipc_handle_from};
use super::device::CudaDevice;
use super::memory::{
    map_handle, min_granularity, physical_prop, unmap_release, Backing, CudaMemory,
};
use super::result::{ipc, vmm};
use super::Cuda;
use crate::auxil::deferred;
use crate::auxil::fdpass::{self, host_id, FD_FETCH_TIMEOUT};
use crate::{AllocationIdentity, Buffer, Error, IpcApi, IpcDescriptor, IpcKind, Result};
use cudarc::driver::sys;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Memory of another process mapped into this one. Unmapped (and its fd closed) on drop.
#[derive(Debug)]
pub struct CudaImported {
    dev: CudaDevice,
    base: u64,
    offset: u64,
    size: usize,
    how: ImportKind,
}

#[derive(Debug)]
enum ImportKind {
    Legacy,
    Mapped {
        handle: sys::CUmemGenericAllocationHandle,
        len: usize,
        _fd: Option<OwnedFd>,
    },
}

// SAFETY: device addresses and handles may be used from any thread.
unsafe impl Send for CudaImported {}
// SAFETY: as above; no interior mutation.
unsafe impl Sync for CudaImported {}

impl Buffer for CudaImported {
    fn device_ptr(&self) -> u64 {
        self.base + self.offset
    }
    fn size(&self) -> usize {
        self.size
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        None
    }
}

impl Drop for CudaImported {
    fn drop(&mut self) {
        if let Err(e) = self.dev.bind() {
            deferred::record(e);
            return;
        }
        let r = match &self.how {
            // SAFETY: base came from cuIpcOpenMemHandle and is closed once.
            ImportKind::Legacy => unsafe { ipc::close_handle(self.base) },
            ImportKind::Mapped { handle, len, .. } => unmap_release(self.base, *len, *handle),
        };
        if let Err(e) = r {
            deferred::record(e);
        }
    }
}

impl IpcApi for Cuda {
    fn ipc_kinds(mem: &CudaMemory) -> Vec<IpcKind> {
        kinds(mem)
    }
    fn export(mem: &CudaMemory, kind: IpcKind) -> Result<IpcDescriptor> {
        mem.dev.enter()?;
        export(mem, kind)
    }
    fn import(dev: &CudaDevice, desc: &IpcDescriptor) -> Result<CudaImported> {
        dev.enter()?;
        import(dev, desc)
    }
    fn adopt(dev: &CudaDevice, ptr: u64, len: usize) -> Result<(CudaMemory, AllocationIdentity)> {
        super::memory::adopt(dev, ptr, len)
    }
    fn identity(dev: &CudaDevice, ptr: u64, len: usize) -> Result<AllocationIdentity> {
        super::memory::identity(dev, ptr, len)
    }
}

fn kinds(mem: &CudaMemory) -> Vec<IpcKind> {
    match mem.backing {
        Backing::Linear | Backing::ForeignLinear => vec![IpcKind::Legacy],
        Backing::Host(_) => Vec::new(),
        Backing::ForeignVmm { fabric, posix, .. } => {
            let mut k = Vec::new();
            if fabric {
                k.push(IpcKind::Fabric);
            }
            if posix {
                k.push(IpcKind::PosixFd);
            }
            k
        }
        Backing::Physical { fabric: true, .. } => vec![IpcKind::Fabric, IpcKind::PosixFd],
        Backing::Physical { fabric: false, .. } => vec![IpcKind::PosixFd],
    }
}

fn descriptor(mem: &CudaMemory, kind: IpcKind, fd_id: u64, handle: Vec<u8>) -> IpcDescriptor {
    IpcDescriptor {
        kind,
        size: mem.size() as u64,
        offset: 0,
        pid: std::process::id(),
        host_id: host_id(),
        fd_id,
        handle,
    }
}

fn export(mem: &CudaMemory, kind: IpcKind) -> Result<IpcDescriptor> {
    let unsupported = || Error::Unsupported {
        op: "export",
        backend: "cuda",
        reason: format!("{kind:?} for {:?} memory", mem.kind()),
    };
    match (kind, &mem.backing) {
        (IpcKind::Legacy, Backing::Linear | Backing::ForeignLinear) => {
            let h = ipc::get_handle(mem.ptr)?;
            Ok(descriptor(mem, kind, 0, ipc_handle_bytes(&h)))
        }
        (
            IpcKind::PosixFd,
            Backing::Physical {
                handle, mapped_len, ..
            }
            | Backing::ForeignVmm {
                handle,
                mapped_len,
                posix: true,
                ..
            },
        ) => {
            let mut reg = mem.fd_export.lock().unwrap_or_else(|p| p.into_inner());
            let id = match &*reg {
                Some(r) => r.id(),
                None => {
                    let fd = vmm::export_posix_fd(*handle)?;
                    // SAFETY: the driver gave us a new fd that nobody else owns.
                    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                    let r = fdpass::register(owned)?;
                    let id = r.id();
                    *reg = Some(r);
                    id
                }
            };
            Ok(descriptor(
                mem,
                kind,
                id,
                (*mapped_len as u64).to_le_bytes().to_vec(),
            ))
        }
        (
            IpcKind::Fabric,
            Backing::Physical {
                handle,
                mapped_len,
                fabric: true,
            }
            | Backing::ForeignVmm {
                handle,
                mapped_len,
                fabric: true,
                ..
            },
        ) => {
            let fh = vmm::export_fabric(*handle)?;
            let mut bytes = fh.data.to_vec();
            bytes.extend_from_slice(&(*mapped_len as u64).to_le_bytes());
            Ok(descriptor(mem, kind, 0, bytes))
        }
        _ => Err(unsupported()),
    }
}

fn mapped_len_of(desc: &IpcDescriptor, at: usize) -> Result<usize> {
    let b = desc.handle.get(at..at + 8).ok_or_else(|| {
        Error::BadDescriptor(format!(
            "{:?}: expected {} handle bytes, got {}",
            desc.kind,
            at + 8,
            desc.handle.len()
        ))
    })?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    let len = usize::try_from(u64::from_le_bytes(a))
        .map_err(|_| Error::BadDescriptor("mapped length does not fit usize".into()))?;
    if (desc.offset.saturating_add(desc.size)) > len as u64 {
        return Err(Error::BadDescriptor(format!(
            "offset {} + size {} exceeds the mapped length {len}",
            desc.offset, desc.size
        )));
    }
    Ok(len)
}

fn import(dev: &CudaDevice, desc: &IpcDescriptor) -> Result<CudaImported> {
    let size = usize::try_from(desc.size)
        .map_err(|_| Error::BadDescriptor("size does not fit usize".into()))?;
    match desc.kind {
        IpcKind::Legacy => {
            let base = ipc::open_handle(ipc_handle_from(desc)?)?;
            Ok(CudaImported {
                dev: dev.clone(),
                base,
                offset: desc.offset,
                size,
                how: ImportKind::Legacy,
            })
        }
        IpcKind::PosixFd => {
            let len = mapped_len_of(desc, 0)?;
            let fd = fdpass::fetch(desc.host_id, desc.pid, desc.fd_id, FD_FETCH_TIMEOUT)?;
            // SAFETY: the fd is a live descriptor exported by cuMemExportToShareableHandle in
            // the peer; the driver does not take ownership of it (we keep `fd`).
            let handle = unsafe { vmm::import_posix_fd(fd.as_raw_fd()) }?;
            map_import(dev, desc, size, handle, len, Some(fd))
        }
        IpcKind::Fabric => {
            let len = mapped_len_of(desc, 64)?;
            // SAFETY: plain C struct.
            let mut fh: sys::CUmemFabricHandle = unsafe { std::mem::zeroed() };
            fh.data.copy_from_slice(&desc.handle[..64]);
            let handle = vmm::import_fabric(&fh)?;
            map_import(dev, desc, size, handle, len, None)
        }
        IpcKind::HostMemfd => Err(Error::Unsupported {
            op: "import",
            backend: "cuda",
            reason: "HostMemfd descriptors are imported with the host backend".into(),
        }),
    }
}

fn map_import(
    dev: &CudaDevice,
    desc: &IpcDescriptor,
    size: usize,
    handle: sys::CUmemGenericAllocationHandle,
    len: usize,
    fd: Option<OwnedFd>,
) -> Result<CudaImported> {
    let prop = physical_prop(
        dev,
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0,
    );
    let gran = min_granularity(&prop)?;
    match map_handle(handle, len, gran, &[dev.ordinal() as i32]) {
        Ok(base) => Ok(CudaImported {
            dev: dev.clone(),
            base,
            offset: desc.offset,
            size,
            how: ImportKind::Mapped {
                handle,
                len,
                _fd: fd,
            },
        }),
        Err(e) => {
            // SAFETY: release the imported handle; nothing maps it.
            let _ = unsafe { vmm::release(handle) };
            Err(e)
        }
    }
}
