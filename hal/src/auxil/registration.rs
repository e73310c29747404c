//! Caller-owned host memory registered for device access ([`crate::HostRegisterApi`]): one type
//! for every backend, which differ only in what undoes the registration when it drops.

/// What undoes a registration when its [`HostRegistration`] drops: the GPU backends' devices
/// unregister the range; `()` (host backend) has nothing to undo.
pub trait Unregister: std::fmt::Debug {
    /// Undoes the registration of the range starting at `host`.
    ///
    /// # Safety
    /// `host` was registered through this owner and is unregistered once.
    unsafe fn unregister(&self, host: *mut u8);
}

impl Unregister for () {
    unsafe fn unregister(&self, _host: *mut u8) {}
}

/// Caller-owned host memory registered by [`crate::HostRegisterApi::register_host`]; dropping
/// it undoes the registration through `U` (the memory itself stays the caller's).
#[derive(Debug)]
pub struct HostRegistration<U: Unregister> {
    owner: U,
    host: *mut u8,
    device_ptr: u64,
    len: usize,
}

// SAFETY: the host pointer is only handed to the driver (thread-safe) and back to the caller;
// the memory is owned and synchronised by the caller per the `register_host` contract.
unsafe impl<U: Unregister + Send> Send for HostRegistration<U> {}
// SAFETY: as above; the struct is immutable after creation.
unsafe impl<U: Unregister + Sync> Sync for HostRegistration<U> {}

impl<U: Unregister> HostRegistration<U> {
    /// A registration of `len` bytes at `host` that kernels address at `device_ptr`; dropping
    /// it calls `owner.unregister(host)`.
    pub(crate) fn new(owner: U, host: *mut u8, device_ptr: u64, len: usize) -> Self {
        HostRegistration {
            owner,
            host,
            device_ptr,
            len,
        }
    }
    /// The registered host address.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }
    /// Registered bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false: registrations are never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The address kernels use (CUDA: `cuMemHostGetDevicePointer`, ROCm:
    /// `hipHostGetDevicePointer`, host backend: the host address itself).
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }
}

impl<U: Unregister> Drop for HostRegistration<U> {
    fn drop(&mut self) {
        // SAFETY: `host` was registered through `owner` (`new`'s contract) and this is the one
        // drop.
        unsafe { self.owner.unregister(self.host) }
    }
}
