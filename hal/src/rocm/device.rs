//! ROCm devices: selection (hipSetDevice), properties, peer access.

use super::conv::{check, hip, HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED};
use crate::{DeviceProperties, Error, Result};
use hip_sys::hiprt::hipDeviceAttribute_t as A;

/// An opened HIP device (its ordinal). Cheap to copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RocmDevice {
    pub(super) ordinal: i32,
}

impl RocmDevice {
    /// Makes this device current on the calling thread.
    pub(super) fn bind(&self) -> Result<()> {
        let h = hip()?;
        // SAFETY: ordinal was validated at open.
        check("hipSetDevice", unsafe { (h.hipSetDevice)(self.ordinal) })
    }
    pub(super) fn attribute(&self, attr: A, op: &'static str) -> Result<i32> {
        let h = hip()?;
        let mut v = 0;
        // SAFETY: valid out pointer.
        check(op, unsafe {
            (h.hipDeviceGetAttribute)(&mut v, attr as i32, self.ordinal)
        })?;
        Ok(v)
    }
}

pub(super) fn count() -> Result<usize> {
    let h = hip()?;
    let mut n = 0;
    // SAFETY: valid out pointer.
    check("hipGetDeviceCount", unsafe {
        (h.hipGetDeviceCount)(&mut n)
    })?;
    Ok(n.max(0) as usize)
}

/// `hipGetDevice`: the calling thread's device (HIP always has one, device 0 by default).
pub(super) fn current_ordinal() -> Result<Option<usize>> {
    let h = hip()?;
    let mut d = 0;
    // SAFETY: valid out pointer.
    check("hipGetDevice", unsafe { (h.hipGetDevice)(&mut d) })?;
    Ok(usize::try_from(d).ok())
}

pub(super) fn open(ordinal: usize) -> Result<RocmDevice> {
    let n = count()?;
    if ordinal >= n {
        return Err(Error::invalid(
            "open_device(rocm)",
            format!("an ordinal below {n}"),
            ordinal.to_string(),
        ));
    }
    let d = RocmDevice {
        ordinal: ordinal as i32,
    };
    d.bind()?;
    Ok(d)
}

pub(super) fn properties(d: &RocmDevice) -> Result<DeviceProperties> {
    let h = hip()?;
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the buffer holds 256 chars.
    check("hipDeviceGetName", unsafe {
        (h.hipDeviceGetName)(name.as_mut_ptr(), name.len() as i32, d.ordinal)
    })?;
    let mut bus = [0 as std::ffi::c_char; 64];
    // SAFETY: as above.
    check("hipDeviceGetPCIBusId", unsafe {
        (h.hipDeviceGetPCIBusId)(bus.as_mut_ptr(), bus.len() as i32, d.ordinal)
    })?;
    let cstr = |b: &[std::ffi::c_char]| {
        let bytes: Vec<u8> = b
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let pci = cstr(&bus).to_ascii_lowercase();
    // HIP has no NUMA attribute: read sysfs; -1 when unknown.
    let numa = std::fs::read_to_string(format!("/sys/bus/pci/devices/{pci}/numa_node"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|n| *n >= 0)
        .unwrap_or(-1);
    Ok(DeviceProperties {
        name: cstr(&name),
        sm_count: d
            .attribute(
                A::hipDeviceAttributeMultiprocessorCount,
                "hipDeviceGetAttribute(MultiprocessorCount)",
            )?
            .max(0) as u32,
        compute_capability: (
            d.attribute(
                A::hipDeviceAttributeComputeCapabilityMajor,
                "hipDeviceGetAttribute(ComputeCapabilityMajor)",
            )?
            .max(0) as u32,
            d.attribute(
                A::hipDeviceAttributeComputeCapabilityMinor,
                "hipDeviceGetAttribute(ComputeCapabilityMinor)",
            )?
            .max(0) as u32,
        ),
        pci_bus_id: pci,
        numa_node: numa,
    })
}

pub(super) fn can_access_peer(d: &RocmDevice, peer: &RocmDevice) -> Result<bool> {
    if d == peer {
        return Ok(true);
    }
    let h = hip()?;
    let mut v = 0;
    // SAFETY: valid out pointer.
    check("hipDeviceCanAccessPeer", unsafe {
        (h.hipDeviceCanAccessPeer)(&mut v, d.ordinal, peer.ordinal)
    })?;
    Ok(v != 0)
}

pub(super) fn enable_peer_access(d: &RocmDevice, peer: &RocmDevice) -> Result<()> {
    if d == peer {
        return Ok(());
    }
    d.bind()?;
    let h = hip()?;
    // SAFETY: flags must be 0.
    let rc = unsafe { (h.hipDeviceEnablePeerAccess)(peer.ordinal, 0) };
    if rc == HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(());
    }
    check("hipDeviceEnablePeerAccess", rc)
}
