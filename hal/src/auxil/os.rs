//! The few Linux calls std does not wrap: memfd, mmap and SCM_RIGHTS messages, through
//! rustix (no hand-laid `msghdr`/`cmsghdr` or magic constants here).

use crate::{Error, Result};
use rustix::mm::{MapFlags, ProtFlags};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::ffi::CStr;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// An [`Error::Os`] naming `op` for a rustix errno.
fn os_error(op: &'static str, e: rustix::io::Errno) -> Error {
    Error::Os {
        op,
        source: std::io::Error::from(e),
    }
}

/// The system page size.
pub(crate) fn page_size() -> usize {
    rustix::param::page_size()
}

/// Creates an anonymous memory file (close-on-exec) of `len` bytes.
pub(crate) fn memfd(name: &CStr, len: usize) -> Result<OwnedFd> {
    let owned = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| os_error("memfd_create", e))?;
    let file = std::fs::File::from(owned);
    file.set_len(len as u64).map_err(|source| Error::Os {
        op: "ftruncate(memfd)",
        source,
    })?;
    Ok(OwnedFd::from(file))
}

/// A shared read/write mapping, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// Thread-safe: the mapping is plain shared memory; synchronisation of its contents is the user's
// job, exactly as for device memory; `Mapping` itself has no interior state.
thread_safe!(Mapping);

impl Mapping {
    /// Maps `len` bytes of `fd` shared and read/write.
    pub(crate) fn shared(fd: &OwnedFd, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::invalid("mmap", "a non-zero length", "0"));
        }
        // SAFETY: a fresh mapping at an address chosen by the kernel (null hint), so no
        // existing memory is replaced; fd is a valid open descriptor.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }
        .map_err(|e| os_error("mmap(MAP_SHARED)", e))?;
        Ok(Mapping { ptr: p.cast(), len })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe a mapping made by `shared` and not unmapped before; every
        // borrower of it is gone with `self`.
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) } {
            crate::auxil::deferred::record(os_error("munmap", e));
        }
    }
}

/// A range of address space reserved with no access (`PROT_NONE`, anonymous, not backed by
/// memory), released on drop: the host backend's stand-in for a `cuMemAddressReserve`d range
/// that only device operations may use (a plain load or store there faults).
#[derive(Debug)]
pub(crate) struct Reservation {
    ptr: *mut u8,
    len: usize,
}

// Thread-safe: an inaccessible address range; nothing is read or written through it.
thread_safe!(Reservation);

impl Reservation {
    /// Reserves `len` bytes of address space, inaccessible.
    pub(crate) fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::invalid("mmap(PROT_NONE)", "a non-zero length", "0"));
        }
        // SAFETY: a fresh anonymous mapping at an address chosen by the kernel (null hint), so
        // no existing memory is replaced; with no access nothing can be corrupted through it.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }
        .map_err(|e| os_error("mmap(PROT_NONE)", e))?;
        Ok(Reservation { ptr: p.cast(), len })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe a reservation made by `new` and not released before.
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) } {
            crate::auxil::deferred::record(os_error("munmap(reservation)", e));
        }
    }
}

/// Sends `data` with `fd` (if any) attached as SCM_RIGHTS on a connected Unix socket.
pub(crate) fn send_with_fd(
    sock: &impl AsFd,
    data: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(fd) = fd {
        fds = [fd];
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(Error::invalid(
                "sendmsg(SCM_RIGHTS)",
                "room for one fd in the control buffer",
                "too little",
            ));
        }
    }
    let n = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(data)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .map_err(|e| os_error("sendmsg(SCM_RIGHTS)", e))?;
    if n != data.len() {
        return Err(Error::invalid(
            "sendmsg(SCM_RIGHTS)",
            format!("{} bytes sent", data.len()),
            format!("{n}"),
        ));
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes and at most one passed fd.
/// Returns the byte count and the fd (owned, close-on-exec) if one came; extra fds (never
/// sent by our servers) are closed.
pub(crate) fn recv_with_fd(sock: &impl AsFd, buf: &mut [u8]) -> Result<(usize, Option<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        sock,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| os_error("recvmsg(SCM_RIGHTS)", e))?;
    let mut fd = None;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            for owned in fds {
                if fd.is_none() {
                    fd = Some(owned);
                }
            }
        }
    }
    Ok((msg.bytes, fd))
}
