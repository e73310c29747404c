//! Host memory: page-granular memfd mappings (MAP_SHARED), so they can be shared by fd
//! ([`crate::MemoryApi`] and [`crate::HostRegisterApi`] for [`Host`]).

use super::{Host, HostDevice};
use crate::auxil::fdpass::FdRegistration;
use crate::auxil::os::{self, Mapping};
use crate::auxil::{check_host_range, check_range};
use crate::{Buffer, Error, HostRegisterApi, MemoryApi, MemoryKind, Result};
use std::os::fd::OwnedFd;
use std::sync::Mutex;

/// A host allocation: a memfd mapped shared. Every [`MemoryKind`] gives the same memory.
#[derive(Debug)]
pub struct HostMemory {
    pub(super) map: Mapping,
    pub(super) fd: OwnedFd,
    pub(super) size: usize,
    pub(super) mapped_len: usize,
    pub(super) kind: MemoryKind,
    /// The fd registration of the first export, kept while the memory lives.
    pub(super) export: Mutex<Option<FdRegistration>>,
}

impl HostMemory {
    /// The kind it was allocated as.
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }
    /// Bytes actually mapped (size rounded up to the page or granularity).
    pub fn mapped_len(&self) -> usize {
        self.mapped_len
    }
}

impl Buffer for HostMemory {
    fn device_ptr(&self) -> u64 {
        self.map.ptr() as usize as u64
    }
    fn size(&self) -> usize {
        self.size
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        Some(self.map.ptr())
    }
}

fn round_up(size: usize, to: usize) -> Result<usize> {
    size.div_ceil(to).checked_mul(to).ok_or_else(|| {
        Error::invalid(
            "alloc",
            "a size that fits in usize when rounded",
            size.to_string(),
        )
    })
}

fn host_addr(op: &'static str, buf: &impl Buffer) -> Result<*mut u8> {
    buf.host_ptr().ok_or_else(|| {
        Error::invalid(
            op,
            "host-accessible memory",
            format!("device pointer {:#x}", buf.device_ptr()),
        )
    })
}

/// Caller-owned host memory "registered" with the host backend: the device pointer is the
/// host address and there is nothing to pin or undo, so dropping it does nothing.
pub type HostRegistration = crate::auxil::registration::HostRegistration<()>;

impl MemoryApi for Host {
    fn alloc(_dev: &HostDevice, size: usize, kind: MemoryKind) -> Result<HostMemory> {
        HostDevice::enter()?;
        if size == 0 {
            return Err(Error::invalid("alloc(host)", "a non-zero size", "0"));
        }
        let page = os::page_size();
        let gran = match kind {
            MemoryKind::Physical { granularity } if granularity > 0 => {
                if granularity % page != 0 {
                    return Err(Error::invalid(
                        "alloc(host)",
                        format!("a granularity that is a multiple of the page size {page}"),
                        granularity.to_string(),
                    ));
                }
                granularity
            }
            _ => page,
        };
        let mapped_len = round_up(size, gran)?;
        super::budget::check(mapped_len)?;
        let fd = os::memfd(c"mscclpp-hal-host", mapped_len)?;
        let map = Mapping::shared(&fd, mapped_len)?;
        Ok(HostMemory {
            map,
            fd,
            size,
            mapped_len,
            kind,
            export: Mutex::new(None),
        })
    }
    fn memset(
        _dev: &HostDevice,
        dst: &impl Buffer,
        offset: usize,
        value: u8,
        len: usize,
    ) -> Result<()> {
        HostDevice::enter()?;
        check_range("memset(host)", dst.size(), offset, len)?;
        let p = host_addr("memset(host)", dst)?;
        // SAFETY: the range was checked against the buffer, which stays alive for the call.
        unsafe { std::ptr::write_bytes(p.add(offset), value, len) };
        Ok(())
    }
    fn write(_dev: &HostDevice, dst: &impl Buffer, offset: usize, src: &[u8]) -> Result<()> {
        HostDevice::enter()?;
        check_range("write(host)", dst.size(), offset, src.len())?;
        let p = host_addr("write(host)", dst)?;
        // SAFETY: range checked; `src` is a distinct Rust slice, so no overlap with the mapping
        // unless the caller built it from this same mapping, in which case `copy` semantics hold.
        unsafe { std::ptr::copy(src.as_ptr(), p.add(offset), src.len()) };
        Ok(())
    }
    fn read(_dev: &HostDevice, src: &impl Buffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        HostDevice::enter()?;
        check_range("read(host)", src.size(), offset, dst.len())?;
        let p = host_addr("read(host)", src)?;
        // SAFETY: range checked; `copy` tolerates overlap.
        unsafe { std::ptr::copy(p.add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
    fn copy(
        _dev: &HostDevice,
        dst: &impl Buffer,
        dst_offset: usize,
        src: &impl Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        HostDevice::enter()?;
        check_range("copy(host) dst", dst.size(), dst_offset, len)?;
        check_range("copy(host) src", src.size(), src_offset, len)?;
        let d = host_addr("copy(host) dst", dst)?;
        let s = host_addr("copy(host) src", src)?;
        // SAFETY: both ranges checked against live buffers; `copy` tolerates overlap.
        unsafe { std::ptr::copy(s.add(src_offset), d.add(dst_offset), len) };
        Ok(())
    }
}

impl HostRegisterApi for Host {
    unsafe fn register_host(
        _dev: &HostDevice,
        ptr: *mut u8,
        len: usize,
    ) -> Result<HostRegistration> {
        HostDevice::enter()?;
        check_host_range("register_host(host)", ptr, len)?;
        Ok(HostRegistration::new((), ptr, ptr as usize as u64, len))
    }
    fn host_registration_device_ptr(r: &HostRegistration) -> u64 {
        r.device_ptr()
    }
}

impl crate::DmaBufApi for Host {
    /// The host backend's stand-in for a dma-buf: a duplicate of the allocation's memfd (the
    /// verbs test provider maps it), offset = the byte offset in the allocation.
    fn export_dmabuf(mem: &HostMemory, offset: usize, len: usize) -> Result<crate::DmaBuf> {
        HostDevice::enter()?;
        check_range("export_dmabuf(host)", mem.size, offset, len)?;
        if len == 0 {
            return Err(Error::invalid(
                "export_dmabuf(host)",
                "a non-zero length",
                "0",
            ));
        }
        let fd = mem.fd.try_clone().map_err(|source| Error::Os {
            op: "dup(memfd) for export_dmabuf(host)",
            source,
        })?;
        Ok(crate::DmaBuf {
            fd,
            offset: offset as u64,
            len,
        })
    }
}
