//! The few Linux calls std does not wrap: memfd, mmap and SCM_RIGHTS messages.
//!
//! Declared here by hand (x86_64 and aarch64 Linux share these layouts) so the HAL needs no
//! extra crate.

use crate::{Error, Result};
use std::ffi::{c_int, c_long, c_uint, c_void, CStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const PROT_READ: c_int = 1;
const PROT_WRITE: c_int = 2;
const MAP_SHARED: c_int = 1;
const MFD_CLOEXEC: c_uint = 1;
const SOL_SOCKET: c_int = 1;
const SCM_RIGHTS: c_int = 1;
const MSG_CMSG_CLOEXEC: c_int = 0x4000_0000;
const MSG_NOSIGNAL: c_int = 0x4000;
const SC_PAGESIZE: c_int = 30;

#[repr(C)]
struct IoVec {
    base: *mut c_void,
    len: usize,
}

#[repr(C)]
struct MsgHdr {
    name: *mut c_void,
    namelen: u32,
    iov: *mut IoVec,
    iovlen: usize,
    control: *mut c_void,
    controllen: usize,
    flags: c_int,
}

#[repr(C)]
struct CmsgHdr {
    len: usize,
    level: c_int,
    kind: c_int,
}

extern "C" {
    fn memfd_create(name: *const std::ffi::c_char, flags: c_uint) -> c_int;
    fn mmap(
        addr: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        off: i64,
    ) -> *mut c_void;
    fn munmap(addr: *mut c_void, len: usize) -> c_int;
    fn sendmsg(fd: c_int, msg: *const MsgHdr, flags: c_int) -> isize;
    fn recvmsg(fd: c_int, msg: *mut MsgHdr, flags: c_int) -> isize;
    fn sysconf(name: c_int) -> c_long;
}

/// The system page size (4096 if the query fails).
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { sysconf(SC_PAGESIZE) };
    if v > 0 {
        v as usize
    } else {
        4096
    }
}

/// Creates an anonymous memory file (close-on-exec) of `len` bytes.
pub(crate) fn memfd(name: &CStr, len: usize) -> Result<OwnedFd> {
    // SAFETY: name is a valid NUL-terminated string.
    let fd = unsafe { memfd_create(name.as_ptr(), MFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::last_os("memfd_create"));
    }
    // SAFETY: fd was just returned by memfd_create and is owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
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

// SAFETY: the mapping is plain shared memory; synchronisation of its contents is the user's job,
// exactly as for device memory.
unsafe impl Send for Mapping {}
// SAFETY: as above; `Mapping` itself has no interior state.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared and read/write.
    pub(crate) fn shared(fd: &OwnedFd, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::invalid("mmap", "a non-zero length", "0"));
        }
        // SAFETY: a fresh mapping chosen by the kernel; fd is a valid open descriptor.
        let p = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                PROT_READ | PROT_WRITE,
                MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p as isize == -1 {
            return Err(Error::last_os("mmap(MAP_SHARED)"));
        }
        Ok(Mapping { ptr: p.cast(), len })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe a mapping made by `shared` and not unmapped before.
        if unsafe { munmap(self.ptr.cast(), self.len) } != 0 {
            crate::auxil::deferred::record(Error::last_os("munmap"));
        }
    }
}

/// Sends `data` with `fd` (if any) attached as SCM_RIGHTS on a connected Unix socket.
pub(crate) fn send_with_fd(sock: &impl AsRawFd, data: &[u8], fd: Option<RawFd>) -> Result<()> {
    let mut iov = IoVec {
        base: data.as_ptr() as *mut c_void,
        len: data.len(),
    };
    // Room for one cmsghdr (16 bytes) plus one int, aligned to 8: CMSG_SPACE(4) = 24.
    let mut control = [0u64; 3];
    let mut msg = MsgHdr {
        name: std::ptr::null_mut(),
        namelen: 0,
        iov: &mut iov,
        iovlen: 1,
        control: std::ptr::null_mut(),
        controllen: 0,
        flags: 0,
    };
    if let Some(fd) = fd {
        let hdr = control.as_mut_ptr().cast::<CmsgHdr>();
        // SAFETY: `control` is 24 bytes, 8-aligned: room for the header and the fd after it.
        unsafe {
            (*hdr).len = std::mem::size_of::<CmsgHdr>() + std::mem::size_of::<c_int>();
            (*hdr).level = SOL_SOCKET;
            (*hdr).kind = SCM_RIGHTS;
            hdr.add(1).cast::<c_int>().write(fd);
        }
        msg.control = control.as_mut_ptr().cast();
        msg.controllen = std::mem::size_of_val(&control);
    }
    // SAFETY: msg points at live buffers for the duration of the call.
    let n = unsafe { sendmsg(sock.as_raw_fd(), &msg, MSG_NOSIGNAL) };
    if n < 0 {
        return Err(Error::last_os("sendmsg(SCM_RIGHTS)"));
    }
    if n as usize != data.len() {
        return Err(Error::invalid(
            "sendmsg(SCM_RIGHTS)",
            format!("{} bytes sent", data.len()),
            format!("{n}"),
        ));
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes and at most one passed fd.
/// Returns the byte count and the fd (owned, close-on-exec) if one came.
pub(crate) fn recv_with_fd(
    sock: &impl AsRawFd,
    buf: &mut [u8],
) -> Result<(usize, Option<OwnedFd>)> {
    let mut iov = IoVec {
        base: buf.as_mut_ptr().cast(),
        len: buf.len(),
    };
    let mut control = [0u64; 8];
    let mut msg = MsgHdr {
        name: std::ptr::null_mut(),
        namelen: 0,
        iov: &mut iov,
        iovlen: 1,
        control: control.as_mut_ptr().cast(),
        controllen: std::mem::size_of_val(&control),
        flags: 0,
    };
    // SAFETY: msg points at live buffers for the duration of the call.
    let n = unsafe { recvmsg(sock.as_raw_fd(), &mut msg, MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(Error::last_os("recvmsg(SCM_RIGHTS)"));
    }
    let mut fd = None;
    let hdr_len = std::mem::size_of::<CmsgHdr>();
    if msg.controllen >= hdr_len + std::mem::size_of::<c_int>() {
        let hdr = control.as_ptr().cast::<CmsgHdr>();
        // SAFETY: the kernel wrote at least one header plus one int into `control`.
        let (level, kind, len) = unsafe { ((*hdr).level, (*hdr).kind, (*hdr).len) };
        if level == SOL_SOCKET
            && kind == SCM_RIGHTS
            && len >= hdr_len + std::mem::size_of::<c_int>()
        {
            let count = (len - hdr_len) / std::mem::size_of::<c_int>();
            for i in 0..count {
                // SAFETY: `count` ints follow the header, all inside `control` (len <= controllen).
                let raw = unsafe { hdr.add(1).cast::<c_int>().add(i).read() };
                // SAFETY: the kernel installed this fd for us; we are its only owner.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                if fd.is_none() {
                    fd = Some(owned);
                } // extra fds (never sent by our servers) are closed here
            }
        }
    }
    Ok((n as usize, fd))
}
