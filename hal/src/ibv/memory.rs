//! Protection domains and registered memory regions.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use ibverbs_sys as sys;

use super::device::Context;
use super::IbvError;

/// `ibv_access_flags` as a plain bit set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AccessFlags(pub u32);

impl AccessFlags {
    /// `IBV_ACCESS_LOCAL_WRITE`: the local HCA may write the region (needed for receives).
    pub const LOCAL_WRITE: AccessFlags =
        AccessFlags(sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
    /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA-write into the region.
    pub const REMOTE_WRITE: AccessFlags =
        AccessFlags(sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0);
    /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA-read from the region.
    pub const REMOTE_READ: AccessFlags =
        AccessFlags(sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0);
    /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may run atomics (fetch-add, CAS) on the region.
    pub const REMOTE_ATOMIC: AccessFlags =
        AccessFlags(sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0);
    /// LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC: what the core registers with.
    pub const ALL_REMOTE: AccessFlags = AccessFlags(1 | 2 | 4 | 8);

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: AccessFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The flags as the C `int` the registration calls take (`op` names the call in the error).
    pub(crate) fn as_c_int(self, op: &'static str) -> Result<i32, IbvError> {
        i32::try_from(self.0).map_err(|_| IbvError::InvalidArgument {
            op,
            reason: format!("access flags {:#x} do not fit an int", self.0),
        })
    }
}

impl std::ops::BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, rhs: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | rhs.0)
    }
}

impl Context {
    /// `ibv_alloc_pd`.
    pub fn alloc_pd(self: &Arc<Self>) -> Result<Arc<ProtectionDomain>, IbvError> {
        ProtectionDomain::alloc(self.clone())
    }
}

/// A protection domain; deallocated when the last `Arc` goes (after its MRs and QPs).
pub struct ProtectionDomain {
    ctx: Arc<Context>,
    raw: NonNull<sys::ibv_pd>,
}

// Thread-safe: verbs objects are thread-safe; the pointer is only passed to verbs calls.
thread_safe!(ProtectionDomain);

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.ctx.name())
            .finish()
    }
}

impl ProtectionDomain {
    pub(crate) fn alloc(ctx: Arc<Context>) -> Result<Arc<Self>, IbvError> {
        // SAFETY: live context.
        let raw = unsafe { (ctx.lib().alloc_pd)(ctx.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| IbvError::from_errno("ibv_alloc_pd"))?;
        Ok(Arc::new(ProtectionDomain { ctx, raw }))
    }

    /// The context this PD belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw `ibv_pd` (valid while `self` lives).
    pub fn as_ptr(&self) -> *mut sys::ibv_pd {
        self.raw.as_ptr()
    }

    /// `ibv_reg_mr`: registers `[addr, addr + len)` with `access`.
    ///
    /// # Safety
    /// The memory must stay allocated (and mapped) until the returned [`MemoryRegion`] is
    /// dropped: once registered, the device (and, with remote access flags, a peer) may read or
    /// write it at any time without further involvement of this process.
    pub unsafe fn reg_mr(
        self: &Arc<Self>,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<MemoryRegion, IbvError> {
        let access_int = access.as_c_int("ibv_reg_mr")?;
        // SAFETY: live PD; the caller guarantees the range stays valid while registered.
        let raw = unsafe {
            (self.ctx.lib().reg_mr)(self.as_ptr(), addr.cast::<c_void>(), len, access_int)
        };
        let raw = NonNull::new(raw).ok_or_else(|| IbvError::from_errno("ibv_reg_mr"))?;
        Ok(MemoryRegion {
            pd: self.clone(),
            raw,
        })
    }

    /// `ibv_reg_dmabuf_mr`: registers `len` bytes at `offset` of the dma-buf `fd`, seen by the
    /// device at `iova`. [`IbvError::Unsupported`] when the library does not export it.
    ///
    /// # Safety
    /// `fd` must be a dma-buf file descriptor whose memory stays allocated until the returned
    /// region is dropped.
    pub unsafe fn reg_dmabuf_mr(
        self: &Arc<Self>,
        offset: u64,
        len: usize,
        iova: u64,
        fd: i32,
        access: AccessFlags,
    ) -> Result<MemoryRegion, IbvError> {
        let Some(f) = self.ctx.lib().reg_dmabuf_mr else {
            return Err(IbvError::Unsupported {
                what: "ibv_reg_dmabuf_mr",
                by: self.ctx.lib().path().to_string(),
            });
        };
        let access_int = access.as_c_int("ibv_reg_dmabuf_mr")?;
        // SAFETY: live PD; the caller guarantees the dma-buf stays valid while registered.
        let raw = unsafe { f(self.as_ptr(), offset, len, iova, fd, access_int) };
        let raw = NonNull::new(raw).ok_or_else(|| IbvError::from_errno("ibv_reg_dmabuf_mr"))?;
        Ok(MemoryRegion {
            pd: self.clone(),
            raw,
        })
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: live PD; by the Arc ownership no MR or QP of it remains.
        let ret = unsafe { (self.ctx.lib().dealloc_pd)(self.as_ptr()) };
        if ret != 0 {
            log::warn!(
                "ibv_dealloc_pd on {} failed: {}",
                self.ctx.name(),
                IbvError::from_ret("ibv_dealloc_pd", ret)
            );
        }
    }
}

/// A registered memory region; deregistered on drop.
pub struct MemoryRegion {
    pd: Arc<ProtectionDomain>,
    raw: NonNull<sys::ibv_mr>,
}

// Thread-safe: the MR is only read (addr/len/keys) and passed to verbs calls, which are thread-
// safe.
thread_safe!(MemoryRegion);

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &self.addr())
            .field("len", &self.len())
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .finish()
    }
}

impl MemoryRegion {
    /// Wraps a region returned by a registration call of `pd`'s library (or its mlx5dv).
    pub(crate) fn from_raw(pd: Arc<ProtectionDomain>, raw: NonNull<sys::ibv_mr>) -> Self {
        MemoryRegion { pd, raw }
    }

    fn raw(&self) -> &sys::ibv_mr {
        // SAFETY: the MR is live until drop and its public fields are not changed by the library.
        unsafe { self.raw.as_ref() }
    }

    /// Start address of the region.
    pub fn addr(&self) -> u64 {
        self.raw().addr as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.raw().length
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Local key (for this side's scatter/gather entries).
    pub fn lkey(&self) -> u32 {
        self.raw().lkey
    }

    /// Remote key (what a peer puts in its RDMA work requests).
    pub fn rkey(&self) -> u32 {
        self.raw().rkey
    }

    /// The PD this region is registered in.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The raw `ibv_mr` (valid while `self` lives).
    pub fn as_ptr(&self) -> *mut sys::ibv_mr {
        self.raw.as_ptr()
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: live MR, deregistered exactly once.
        let ret = unsafe { (self.pd.context().lib().dereg_mr)(self.as_ptr()) };
        if ret != 0 {
            log::warn!(
                "ibv_dereg_mr failed: {}",
                IbvError::from_ret("ibv_dereg_mr", ret)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_flags_convert_to_a_c_int_or_name_the_call() {
        assert_eq!(
            AccessFlags::ALL_REMOTE.as_c_int("ibv_reg_mr").ok(),
            Some(15)
        );
        let err = AccessFlags(u32::MAX)
            .as_c_int("ibv_reg_mr")
            .expect_err("too wide for an int");
        assert!(err.to_string().contains("ibv_reg_mr"), "{err}");
    }
}
