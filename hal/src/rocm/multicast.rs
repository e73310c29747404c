//! ROCm has no multicast objects: every entry point of [`crate::MulticastApi`] for [`Rocm`]
//! reports [`crate::Error::Unsupported`] (after the NVLS environment gate, which answers first
//! while a switch disables NVLS), without any HIP call. The handle types are uninhabited, so
//! the functions that take one can never be called.

use super::device::RocmDevice;
use super::memory::RocmMemory;
use super::Rocm;
use crate::{
    Buffer, IpcDescriptor, MulticastApi, MulticastGranularity, MulticastInfo, NvlsPermit, Result,
};

/// No multicast handle exists on ROCm.
#[derive(Clone, Copy, Debug)]
pub enum RocmMulticast {}
/// No multicast export exists on ROCm.
#[derive(Debug)]
pub enum RocmMulticastExport {}
/// No multicast binding exists on ROCm.
#[derive(Debug)]
pub enum RocmMulticastBinding {}
/// No multicast mapping exists on ROCm.
#[derive(Debug)]
pub enum RocmMulticastMapping {}

impl Buffer for RocmMulticastMapping {
    fn device_ptr(&self) -> u64 {
        match *self {}
    }
    fn size(&self) -> usize {
        match *self {}
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        match *self {}
    }
}

fn unsupported<T>(op: &'static str) -> Result<T> {
    NvlsPermit::check(op)?;
    crate::unsupported(op, "rocm", "AMD GPUs have no NVLink multicast objects")
}

impl MulticastApi for Rocm {
    fn multicast_granularity(
        _dev: &RocmDevice,
        _size: usize,
        _ndevices: usize,
    ) -> Result<MulticastGranularity> {
        unsupported("multicast_granularity(rocm)")
    }
    fn create_multicast(
        _dev: &RocmDevice,
        _size: usize,
        _ndevices: usize,
    ) -> Result<RocmMulticast> {
        unsupported("create_multicast(rocm)")
    }
    fn export_multicast(mc: RocmMulticast) -> Result<RocmMulticastExport> {
        match mc {}
    }
    fn multicast_descriptors(export: &RocmMulticastExport) -> Vec<IpcDescriptor> {
        match *export {}
    }
    fn import_multicast(_dev: &RocmDevice, _desc: &IpcDescriptor) -> Result<RocmMulticast> {
        unsupported("import_multicast(rocm)")
    }
    fn multicast_info(mc: &RocmMulticast) -> MulticastInfo {
        match *mc {}
    }
    fn multicast_add_device(mc: &RocmMulticast, _dev: &RocmDevice) -> Result<()> {
        match *mc {}
    }
    unsafe fn multicast_bind(
        mc: &RocmMulticast,
        _dev: &RocmDevice,
        _mc_offset: usize,
        _mem: &RocmMemory,
        _mem_offset: usize,
        _size: usize,
    ) -> Result<RocmMulticastBinding> {
        match *mc {}
    }
    fn multicast_map(
        mc: &RocmMulticast,
        _dev: &RocmDevice,
        _offset: usize,
        _size: usize,
    ) -> Result<RocmMulticastMapping> {
        match *mc {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn refused_without_hip_calls() {
        let dev = RocmDevice { ordinal: 0 };
        let before = crate::auxil::driver_calls_on_this_thread();
        let e = Rocm::create_multicast(&dev, 1 << 21, 2).expect_err("no multicast on ROCm");
        if crate::nvls_disabled_by_env() {
            assert!(matches!(e, Error::NvlsDisabled { .. }), "{e}");
        } else {
            assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        }
        assert!(Rocm::multicast_granularity(&dev, 1, 1).is_err());
        assert_eq!(crate::auxil::driver_calls_on_this_thread(), before);
    }
}
