//! IPC descriptors: the explicit, versioned wire format that names exported memory.
//!
//! Layout (little endian), version 1:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `MHIP` |
//! | 2 | version (1) |
//! | 1 | kind ([`IpcKind`]) |
//! | 1 | reserved (0) |
//! | 8 | size of the exported region |
//! | 8 | offset of the region inside the exported allocation |
//! | 4 | exporter pid |
//! | 8 | exporter host id ([`crate::auxil::fdpass::host_id`]) |
//! | 8 | fd id at the exporter's fd server (0 when the kind passes no fd) |
//! | 2 | handle length `n` (at most [`MAX_HANDLE_LEN`]) |
//! | n | handle bytes (driver handle; empty for fd kinds) |
//!
//! The decoder checks the magic, version, kind, reserved byte, lengths and that no bytes
//! trail; it never panics on any input.

use crate::{Error, Result};

const MAGIC: &[u8; 4] = b"MHIP";
const VERSION: u16 = 1;
const HEADER_LEN: usize = 4 + 2 + 1 + 1 + 8 + 8 + 4 + 8 + 8 + 2;
/// The longest driver handle a descriptor may carry.
pub const MAX_HANDLE_LEN: usize = 256;

/// How an allocation is shared with another process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum IpcKind {
    /// Legacy driver IPC handle (`cuIpcGetMemHandle` / `hipIpcGetMemHandle`); no fd.
    Legacy = 1,
    /// A cuMem allocation exported as a POSIX file descriptor (passed over the fd server).
    PosixFd = 2,
    /// A cuMem allocation exported as a fabric handle (works across nodes under IMEX); no fd.
    Fabric = 3,
    /// Host backend: a memfd (passed over the fd server).
    HostMemfd = 4,
}

impl IpcKind {
    /// Whether importing this kind needs an fd from the exporter's fd server.
    pub fn needs_fd(self) -> bool {
        matches!(self, IpcKind::PosixFd | IpcKind::HostMemfd)
    }

    fn from_u8(v: u8) -> Result<Self> {
        Ok(match v {
            1 => IpcKind::Legacy,
            2 => IpcKind::PosixFd,
            3 => IpcKind::Fabric,
            4 => IpcKind::HostMemfd,
            other => {
                return Err(Error::BadDescriptor(format!(
                    "unknown kind {other} (expected 1..=4)"
                )))
            }
        })
    }
}

/// A description of exported memory that another process can import with `Api::import`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpcDescriptor {
    /// How it is shared.
    pub kind: IpcKind,
    /// Bytes of the exported region.
    pub size: u64,
    /// Offset of the region inside the exported allocation.
    pub offset: u64,
    /// The exporter's pid.
    pub pid: u32,
    /// The exporter's host id.
    pub host_id: u64,
    /// The fd id at the exporter's fd server (0 if none).
    pub fd_id: u64,
    /// Driver handle bytes (empty for fd kinds).
    pub handle: Vec<u8>,
}

impl IpcDescriptor {
    /// Encodes to the version-1 wire format.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.handle.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.push(self.kind as u8);
        out.push(0);
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&self.host_id.to_le_bytes());
        out.extend_from_slice(&self.fd_id.to_le_bytes());
        // Handles come from our own backends and are at most 64 bytes; clamp defensively.
        let n = self.handle.len().min(MAX_HANDLE_LEN);
        out.extend_from_slice(&(n as u16).to_le_bytes());
        out.extend_from_slice(&self.handle[..n]);
        out
    }

    /// Decodes the wire format, checking every length and field.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < HEADER_LEN {
            return Err(Error::BadDescriptor(format!(
                "expected at least {HEADER_LEN} bytes, got {}",
                bytes.len()
            )));
        }
        let mut r = Reader { bytes, pos: 0 };
        let magic = r.take::<4>();
        if &magic != MAGIC {
            return Err(Error::BadDescriptor(format!(
                "expected magic {MAGIC:?}, got {magic:?}"
            )));
        }
        let version = u16::from_le_bytes(r.take());
        if version != VERSION {
            return Err(Error::BadDescriptor(format!(
                "expected version {VERSION}, got {version}"
            )));
        }
        let kind = IpcKind::from_u8(r.take::<1>()[0])?;
        let reserved = r.take::<1>()[0];
        if reserved != 0 {
            return Err(Error::BadDescriptor(format!(
                "expected reserved byte 0, got {reserved}"
            )));
        }
        let size = u64::from_le_bytes(r.take());
        let offset = u64::from_le_bytes(r.take());
        let pid = u32::from_le_bytes(r.take());
        let host_id = u64::from_le_bytes(r.take());
        let fd_id = u64::from_le_bytes(r.take());
        let n = u16::from_le_bytes(r.take()) as usize;
        if n > MAX_HANDLE_LEN {
            return Err(Error::BadDescriptor(format!(
                "handle length {n} exceeds {MAX_HANDLE_LEN}"
            )));
        }
        let rest = bytes.len() - HEADER_LEN;
        if rest != n {
            return Err(Error::BadDescriptor(format!(
                "expected {n} handle bytes after the header, got {rest}"
            )));
        }
        if size == 0 {
            return Err(Error::BadDescriptor("size is 0".into()));
        }
        if offset.checked_add(size).is_none() {
            return Err(Error::BadDescriptor(format!(
                "offset {offset} + size {size} overflows"
            )));
        }
        if kind.needs_fd() && fd_id == 0 {
            return Err(Error::BadDescriptor(format!(
                "kind {kind:?} needs an fd id, got 0"
            )));
        }
        Ok(IpcDescriptor {
            kind,
            size,
            offset,
            pid,
            host_id,
            fd_id,
            handle: bytes[HEADER_LEN..].to_vec(),
        })
    }
}

/// What tells one allocation made outside this library apart from a later one at the same
/// address ([`crate::IpcApi::adopt`]): its range and a backend token that changes when the
/// memory is freed and other memory is allocated there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllocationIdentity {
    /// Start of the allocation (device address; host address on the host backend).
    pub base: u64,
    /// Bytes of the allocation.
    pub size: usize,
    /// CUDA: `CU_POINTER_ATTRIBUTE_BUFFER_ID` (unique in the process) and whether the memory
    /// is cuMem/VMM memory; ROCm: the allocation's base, size and buffer id where the runtime
    /// reports one; host: the mapping's device, inode and file offset.
    pub token: [u64; 3],
}

/// `Ok` for a non-null pointer and a non-empty range (what every backend's adoption checks
/// first).
pub(crate) fn check_adopt_args(op: &'static str, ptr: u64, len: usize) -> Result<()> {
    if ptr == 0 || len == 0 {
        return Err(not_exportable(
            op,
            ptr,
            len,
            "a null pointer or an empty range",
        ));
    }
    Ok(())
}

/// The error of an adoption that cannot work: names the pointer and why.
pub(crate) fn not_exportable(
    op: &'static str,
    ptr: u64,
    len: usize,
    why: impl std::fmt::Display,
) -> Error {
    Error::invalid(
        op,
        "memory a peer process can map (allocated through this library, cudaMalloc/hipMalloc, \
         cuMem/VMM with a shareable handle type, or on the host backend a MAP_SHARED file or \
         memfd mapping)",
        format!("{ptr:#x} (+{len} bytes): {why}"),
    )
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    /// Only called after the header length was checked, so the slice is in range.
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.bytes[self.pos..self.pos + N]);
        self.pos += N;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> IpcDescriptor {
        IpcDescriptor {
            kind: IpcKind::Legacy,
            size: 4096,
            offset: 64,
            pid: 1234,
            host_id: 0xdead_beef,
            fd_id: 0,
            handle: (0..64).collect(),
        }
    }

    #[test]
    fn round_trip() {
        let d = sample();
        assert_eq!(IpcDescriptor::from_bytes(&d.to_bytes()).unwrap(), d);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let b = sample().to_bytes();
        for len in 0..b.len() {
            assert!(
                IpcDescriptor::from_bytes(&b[..len]).is_err(),
                "prefix of {len} bytes decoded"
            );
        }
        let mut longer = b.clone();
        longer.push(0);
        assert!(IpcDescriptor::from_bytes(&longer).is_err());
    }

    #[test]
    fn mutated_header_fields_are_rejected() {
        let b = sample().to_bytes();
        for (pos, val) in [(0usize, b'X'), (4, 9), (6, 0), (6, 77), (7, 1), (44, 0xff)] {
            let mut m = b.clone();
            m[pos] = val;
            assert!(
                IpcDescriptor::from_bytes(&m).is_err(),
                "byte {pos} = {val} accepted"
            );
        }
    }
}
