//! Host memory: page-granular memfd mappings (MAP_SHARED), so they can be shared by fd
//! ([`crate::MemoryApi`] and [`crate::HostRegisterApi`] for [`Host`]); and the adoption of
//! shared mappings the application made itself (found through `/proc/self/maps`).

use super::{Host, HostDevice};
use crate::auxil::fdpass::FdRegistration;
use crate::auxil::os::{self, Mapping};
use crate::auxil::{check_host_range, check_range};
use crate::ipc::{check_adopt_args, not_exportable};
use crate::{AllocationIdentity, Buffer, Error, HostRegisterApi, MemoryApi, MemoryKind, Result};
use std::os::fd::OwnedFd;
use std::sync::Mutex;

/// A host allocation: a memfd mapped shared. Every [`MemoryKind`] gives the same memory.
/// Adopted memory ([`crate::IpcApi::adopt`]) is the application's shared mapping of a file:
/// no mapping of ours, the file reopened, and the mapping's offset in the file.
#[derive(Debug)]
pub struct HostMemory {
    /// The mapping this library made (`None` for adopted memory: the application's).
    pub(super) _map: Option<Mapping>,
    /// The address of the memory.
    pub(super) base: usize,
    pub(super) fd: OwnedFd,
    /// Offset of `base` in the file `fd` names (0 for allocations).
    pub(super) file_offset: u64,
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
        self.base as u64
    }
    fn size(&self) -> usize {
        self.size
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        Some(self.base as *mut u8)
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
            base: map.ptr() as usize,
            _map: Some(map),
            fd,
            file_offset: 0,
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
            offset: mem.file_offset + offset as u64,
            len,
        })
    }
}

/// One line of `/proc/self/maps`: `start-end perms offset major:minor inode path`.
#[derive(Debug, PartialEq, Eq)]
struct MapsLine {
    start: u64,
    end: u64,
    shared: bool,
    offset: u64,
    dev: (u32, u32),
    inode: u64,
    path: String,
}

fn parse_maps_line(line: &str) -> Option<MapsLine> {
    let mut it = line.split_ascii_whitespace();
    let (range, perms, offset, dev, inode) =
        (it.next()?, it.next()?, it.next()?, it.next()?, it.next()?);
    let path = it.collect::<Vec<_>>().join(" ");
    let (start, end) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    Some(MapsLine {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        shared: perms.as_bytes().get(3) == Some(&b's'),
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: (
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        ),
        inode: inode.parse().ok()?,
        path,
    })
}

const ADOPT: &str = "adopt(host)";

/// The length of the file `fd` names.
pub(super) fn file_len(fd: &OwnedFd) -> Result<u64> {
    let meta = rustix::fs::fstat(fd).map_err(|e| Error::Os {
        op: "fstat",
        source: e.into(),
    })?;
    Ok(meta.st_size as u64)
}

/// The shared file mapping holding `ptr..ptr+len`, or an error naming the pointer and why a
/// peer could not map it.
fn shared_mapping(ptr: u64, len: usize) -> Result<MapsLine> {
    check_adopt_args(ADOPT, ptr, len)?;
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|source| Error::Os {
        op: "read /proc/self/maps",
        source,
    })?;
    let m = maps
        .lines()
        .filter_map(parse_maps_line)
        .find(|m| m.start <= ptr && ptr < m.end)
        .ok_or_else(|| not_exportable(ADOPT, ptr, len, "not mapped in this process"))?;
    let what = if m.path.is_empty() {
        "anonymous memory".to_string()
    } else {
        format!("'{}'", m.path)
    };
    if ptr.checked_add(len as u64).is_none_or(|e| e > m.end) {
        return Err(not_exportable(
            ADOPT,
            ptr,
            len,
            format!(
                "the range runs past the end of its mapping {:#x}-{:#x} ({what}); register \
                 each mapping separately",
                m.start, m.end
            ),
        ));
    }
    if !m.shared {
        return Err(not_exportable(
            ADOPT,
            ptr,
            len,
            format!(
                "a private mapping ({what}, e.g. malloc or new memory): a peer cannot map \
                 private memory; allocate it through this library or map a memfd or file \
                 MAP_SHARED"
            ),
        ));
    }
    if m.inode == 0 {
        return Err(not_exportable(
            ADOPT,
            ptr,
            len,
            format!("a shared mapping with no file behind it ({what})"),
        ));
    }
    Ok(m)
}

fn identity_of(m: &MapsLine) -> AllocationIdentity {
    AllocationIdentity {
        base: m.start,
        size: (m.end - m.start) as usize,
        token: [
            (u64::from(m.dev.0) << 32) | u64::from(m.dev.1),
            m.inode,
            m.offset,
        ],
    }
}

/// Whether `meta` is the file the mapping `m` shows.
fn same_file(meta: &std::fs::Metadata, m: &MapsLine) -> bool {
    use std::os::unix::fs::MetadataExt;
    meta.ino() == m.inode && (rustix::fs::major(meta.dev()), rustix::fs::minor(meta.dev())) == m.dev
}

/// Opens the file behind mapping `m` read/write: an fd of this process open on it, else its
/// path, else `/proc/self/map_files` (which needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE).
fn open_mapped_file(ptr: u64, len: usize, m: &MapsLine) -> Result<OwnedFd> {
    let open = |path: &std::path::Path| -> std::io::Result<OwnedFd> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        if f.metadata().is_ok_and(|meta| same_file(&meta, m)) {
            Ok(OwnedFd::from(f))
        } else {
            Err(std::io::Error::other("a different file"))
        }
    };
    let mut tried = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        for entry in dir.flatten() {
            let path = entry.path();
            if std::fs::metadata(&path).is_ok_and(|meta| same_file(&meta, m)) {
                match open(&path) {
                    Ok(fd) => return Ok(fd),
                    Err(e) => tried.push(format!("{}: {e}", path.display())),
                }
            }
        }
    }
    if m.path.starts_with('/') && !m.path.ends_with(" (deleted)") {
        match open(std::path::Path::new(&m.path)) {
            Ok(fd) => return Ok(fd),
            Err(e) => tried.push(format!("{}: {e}", m.path)),
        }
    }
    let mf = format!("/proc/self/map_files/{:x}-{:x}", m.start, m.end);
    match open(std::path::Path::new(&mf)) {
        Ok(fd) => return Ok(fd),
        Err(e) => tried.push(format!("{mf}: {e}")),
    }
    Err(not_exportable(
        ADOPT,
        ptr,
        len,
        format!(
            "its file ('{}') could not be opened read/write (tried {}); keep an fd of it open \
             in this process",
            m.path,
            tried.join("; ")
        ),
    ))
}

/// [`crate::IpcApi::adopt`] for the host backend.
pub(super) fn adopt(ptr: u64, len: usize) -> Result<(HostMemory, AllocationIdentity)> {
    HostDevice::enter()?;
    let m = shared_mapping(ptr, len)?;
    let fd = open_mapped_file(ptr, len, &m)?;
    let id = identity_of(&m);
    // The mapping is page-rounded; only the bytes the file holds can be mapped by a peer.
    let file_len = file_len(&fd)?;
    let size = file_len.saturating_sub(m.offset).min(id.size as u64) as usize;
    if ptr + len as u64 > m.start + size as u64 {
        return Err(not_exportable(
            ADOPT,
            ptr,
            len,
            format!(
                "the range runs past the end of the file behind the mapping ({file_len} bytes \
                 from offset {})",
                m.offset
            ),
        ));
    }
    let mem = HostMemory {
        _map: None,
        base: m.start as usize,
        fd,
        file_offset: m.offset,
        size,
        mapped_len: size,
        kind: MemoryKind::Device,
        export: Mutex::new(None),
    };
    Ok((mem, id))
}

/// [`crate::IpcApi::identity`] for the host backend.
pub(super) fn identity(ptr: u64, len: usize) -> Result<AllocationIdentity> {
    HostDevice::enter()?;
    Ok(identity_of(&shared_mapping(ptr, len)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_parse() {
        let l = parse_maps_line(
            "7f0000000000-7f0000002000 rw-s 00001000 00:01 4242 /memfd:x (deleted)",
        )
        .unwrap();
        assert_eq!(
            l,
            MapsLine {
                start: 0x7f00_0000_0000,
                end: 0x7f00_0000_2000,
                shared: true,
                offset: 0x1000,
                dev: (0, 1),
                inode: 4242,
                path: "/memfd:x (deleted)".into(),
            }
        );
        let anon = parse_maps_line("1000-2000 rw-p 00000000 00:00 0").unwrap();
        assert!(!anon.shared && anon.path.is_empty() && anon.inode == 0);
        assert!(parse_maps_line("garbage").is_none());
    }

    #[test]
    fn private_memory_is_refused_with_the_pointer() {
        let v = vec![0u8; 1 << 16];
        let p = v.as_ptr() as u64;
        let e = adopt(p, 64).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{p:#x}")) && e.contains("private"),
            "{e}"
        );
    }

    #[test]
    fn a_memfd_mapping_is_adopted_and_its_identity_follows_the_file() {
        let fd = os::memfd(c"adopt-test", 3 * 4096).unwrap();
        let map = Mapping::shared(&fd, 3 * 4096).unwrap();
        let p = map.ptr() as u64;
        let (mem, id) = adopt(p + 4096, 100).unwrap();
        assert_eq!((mem.device_ptr(), mem.size()), (p, 3 * 4096));
        assert_eq!(id, identity(p + 8, 8).unwrap());
        // The adopted memory is the same memory.
        // SAFETY: inside the live mapping.
        unsafe { *map.ptr().add(4096) = 7 };
        let mut b = [0u8; 1];
        Host::read(&HostDevice, &mem, 4096, &mut b).unwrap();
        assert_eq!(b[0], 7);
        // Another file at another address has another identity.
        let fd2 = os::memfd(c"adopt-test2", 4096).unwrap();
        let map2 = Mapping::shared(&fd2, 4096).unwrap();
        assert_ne!(identity(map2.ptr() as u64, 1).unwrap().token, id.token);
        // A range past the mapping's end is refused, naming the pointer.
        let e = adopt(p, 4 * 4096).unwrap_err().to_string();
        assert!(e.contains("runs past the end"), "{e}");
    }
}
