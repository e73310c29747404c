//! Host IPC: the memfd of an allocation travels over the fd server and is mapped again
//! ([`crate::IpcApi`] for [`Host`]).

use super::{Host, HostDevice, HostMemory};
use crate::auxil::fdpass::FD_FETCH_TIMEOUT;
use crate::auxil::fdpass::{self, host_id};
use crate::auxil::os::Mapping;
use crate::{AllocationIdentity, Buffer, Error, IpcApi, IpcDescriptor, IpcKind, Result};
use std::os::fd::OwnedFd;

/// Host memory mapped from another process's export. Unmapped and its fd closed on drop.
#[derive(Debug)]
pub struct HostImported {
    map: Mapping,
    // Field order: the mapping is dropped (unmapped) before the fd is closed.
    _fd: OwnedFd,
    offset: usize,
    size: usize,
}

impl Buffer for HostImported {
    fn device_ptr(&self) -> u64 {
        self.map.ptr() as usize as u64 + self.offset as u64
    }
    fn size(&self) -> usize {
        self.size
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        // SAFETY: offset < mapped length was checked at import.
        Some(unsafe { self.map.ptr().add(self.offset) })
    }
}

impl IpcApi for Host {
    fn ipc_kinds(_mem: &HostMemory) -> Vec<IpcKind> {
        vec![IpcKind::HostMemfd]
    }
    fn export(mem: &HostMemory, kind: IpcKind) -> Result<IpcDescriptor> {
        HostDevice::enter()?;
        export(mem, kind)
    }
    fn import(_dev: &HostDevice, desc: &IpcDescriptor) -> Result<HostImported> {
        HostDevice::enter()?;
        import(desc)
    }
    fn adopt(_dev: &HostDevice, ptr: u64, len: usize) -> Result<(HostMemory, AllocationIdentity)> {
        super::memory::adopt(ptr, len)
    }
    fn identity(_dev: &HostDevice, ptr: u64, len: usize) -> Result<AllocationIdentity> {
        super::memory::identity(ptr, len)
    }
}

fn export(mem: &HostMemory, kind: IpcKind) -> Result<IpcDescriptor> {
    if kind != IpcKind::HostMemfd {
        return Err(Error::Unsupported {
            op: "export",
            backend: "host",
            reason: format!("{kind:?} (host memory exports as HostMemfd)"),
        });
    }
    let mut reg = mem.export.lock().unwrap_or_else(|p| p.into_inner());
    let id = match &*reg {
        Some(r) => r.id(),
        None => {
            let dup = mem.fd.try_clone().map_err(|source| Error::Os {
                op: "dup(memfd)",
                source,
            })?;
            let r = fdpass::register(dup)?;
            let id = r.id();
            *reg = Some(r);
            id
        }
    };
    Ok(IpcDescriptor {
        kind: IpcKind::HostMemfd,
        size: mem.size() as u64,
        offset: mem.file_offset,
        pid: std::process::id(),
        host_id: host_id(),
        fd_id: id,
        handle: Vec::new(),
    })
}

fn import(desc: &IpcDescriptor) -> Result<HostImported> {
    if desc.kind != IpcKind::HostMemfd {
        return Err(Error::Unsupported {
            op: "import",
            backend: "host",
            reason: format!("{:?} (the host backend imports HostMemfd)", desc.kind),
        });
    }
    if desc.host_id != host_id() {
        return Err(Error::invalid(
            "import(host)",
            format!("a descriptor from this host ({:016x})", host_id()),
            format!("host {:016x}", desc.host_id),
        ));
    }
    let fd = fdpass::fetch(desc.host_id, desc.pid, desc.fd_id, FD_FETCH_TIMEOUT)?;
    let file_len = super::memory::file_len(&fd)?;
    let end = desc.offset.saturating_add(desc.size);
    if end > file_len {
        return Err(Error::invalid(
            "import(host)",
            format!("offset + size within the {file_len}-byte memfd"),
            format!("{end}"),
        ));
    }
    let fits = |what: &str, v: u64| {
        usize::try_from(v).map_err(|_| {
            Error::invalid(
                "import(host)",
                format!("{what} that fits usize"),
                v.to_string(),
            )
        })
    };
    let offset = fits("an offset", desc.offset)?;
    let size = fits("a size", desc.size)?;
    let map_len = fits("a file length", file_len)?;
    let map = Mapping::shared(&fd, map_len)?;
    Ok(HostImported {
        map,
        _fd: fd,
        offset,
        size,
    })
}
