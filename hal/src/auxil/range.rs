//! Argument checks shared by the backends: byte ranges inside buffers and host ranges to pin.

use crate::{Error, Result};

/// Checks that `offset..offset+len` lies inside a buffer of `size` bytes.
pub(crate) fn check_range(op: &'static str, size: usize, offset: usize, len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::invalid(
            op,
            format!("a range inside {size} bytes"),
            format!("offset {offset} + len {len}"),
        )),
    }
}

/// Checks the arguments of [`crate::MemoryApi::register_host`]: a non-null pointer, a non-zero
/// length and a range that does not wrap the address space.
pub(crate) fn check_host_range(op: &'static str, ptr: *mut u8, len: usize) -> Result<()> {
    if ptr.is_null() {
        return Err(Error::invalid(op, "a non-null host pointer", "null"));
    }
    if len == 0 {
        return Err(Error::invalid(op, "a non-zero length", "0"));
    }
    if (ptr as usize).checked_add(len).is_none() {
        return Err(Error::invalid(
            op,
            "a range inside the address space",
            format!("{ptr:p} + {len} bytes"),
        ));
    }
    Ok(())
}

/// The driver steps of a GPU backend's [`crate::HostRegisterApi::register_host`]: `register` pins
/// the range, then `device_pointer` asks for its device address; should that fail, `unregister`
/// undoes the pin (as well as it can) and the device-pointer error is returned.
#[cfg(any(hal_cuda, hal_rocm))]
pub(crate) fn register_then_map(
    register: impl FnOnce() -> Result<()>,
    device_pointer: impl FnOnce() -> Result<u64>,
    unregister: impl FnOnce() -> Result<()>,
) -> Result<u64> {
    register()?;
    device_pointer().inspect_err(|_| {
        let _ = unregister();
    })
}
