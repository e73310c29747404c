//! The build's device backend as the NCCL interface needs it: which device is current, binding
//! a device to a thread, checking an ordinal. On the host backend there is one "device", 0.

use mscclpp_hal::prelude::*;
use mscclpp_hal::Gpu;

use crate::error::{NResult, NcclError};

fn hal(what: &str) -> impl FnOnce(mscclpp_hal::Error) -> NcclError + '_ {
    move |e| NcclError::from(mscclpp::Error::from(e)).context(what)
}

/// The calling thread's current device (the CUDA runtime's `cudaSetDevice`); device 0 when
/// none was made current yet.
pub fn current_device() -> NResult<i32> {
    let d = Gpu::current_ordinal().map_err(hal("querying the current device"))?;
    Ok(d.map_or(0, |d| d as i32))
}

/// `ncclInvalidArgument` unless `device` is an ordinal of this machine.
pub fn check_device(device: i32) -> NResult<()> {
    let n = Gpu::device_count().map_err(hal("counting devices"))?;
    if device < 0 || device as usize >= n {
        return Err(NcclError::arg(format!(
            "device {device}: expected a device ordinal in 0..{n}"
        )));
    }
    Ok(())
}

/// Makes `device` current on the calling thread (a no-op on the host backend).
pub fn bind_device(device: i32) -> NResult<()> {
    if crate::HOST_BACKEND {
        return Ok(());
    }
    check_device(device)?;
    let dev = Gpu::open_device(device as usize).map_err(hal("opening the device"))?;
    Gpu::set_current(&dev).map_err(hal("making the device current"))
}

/// The `mscclpp` device for `device`.
pub fn device(device: i32) -> mscclpp::Device {
    if crate::HOST_BACKEND {
        mscclpp::Device::CPU
    } else {
        mscclpp::Device::gpu(device)
    }
}
