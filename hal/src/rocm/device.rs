//! ROCm devices: selection (hipSetDevice), properties, peer access
//! ([`crate::DeviceApi`] for [`Rocm`]).

use super::result::device;
use super::Rocm;
use crate::auxil::deferred;
use crate::{DeviceApi, DeviceProperties, Error, Result};
use hip_sys::hiprt::hipDeviceAttribute_t as A;
use std::time::Duration;

/// An opened HIP device (its ordinal). Cheap to copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RocmDevice {
    pub(super) ordinal: i32,
}

impl RocmDevice {
    /// Enters the device for one operation: makes the device current. Every fallible
    /// operation of this backend starts here; `Drop` paths use [`RocmDevice::bind`]. It does
    /// not surface failures recorded by an earlier `Drop` (see `auxil::deferred`): one thread's
    /// failed free must not fail another thread's copy.
    pub(super) fn enter(&self) -> Result<()> {
        self.bind()
    }
    /// Makes this device current on the calling thread.
    pub(super) fn bind(&self) -> Result<()> {
        device::set(self.ordinal)
    }
    fn attribute(&self, attr: A, op: &'static str) -> Result<i32> {
        device::attribute(self.ordinal, attr as i32, op)
    }
}

impl DeviceApi for Rocm {
    fn device_count() -> Result<usize> {
        let n = device::count()?;
        deferred::check()?;
        Ok(n.max(0) as usize)
    }

    fn open_device(ordinal: usize) -> Result<RocmDevice> {
        let n = Self::device_count()?;
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

    fn device_ordinal(dev: &RocmDevice) -> usize {
        dev.ordinal as usize
    }

    fn set_current(dev: &RocmDevice) -> Result<()> {
        dev.enter()
    }

    fn current_ordinal() -> Result<Option<usize>> {
        Ok(usize::try_from(device::current()?).ok())
    }

    fn properties(d: &RocmDevice) -> Result<DeviceProperties> {
        d.enter()?;
        let name = device::name(d.ordinal)?;
        let pci = device::pci_bus_id(d.ordinal)?.to_ascii_lowercase();
        // HIP has no NUMA attribute: read sysfs; -1 when unknown.
        let numa = std::fs::read_to_string(format!("/sys/bus/pci/devices/{pci}/numa_node"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .filter(|n| *n >= 0)
            .unwrap_or(-1);
        let sm = d.attribute(
            A::hipDeviceAttributeMultiprocessorCount,
            "hipDeviceGetAttribute(MultiprocessorCount)",
        )?;
        let major = d.attribute(
            A::hipDeviceAttributeComputeCapabilityMajor,
            "hipDeviceGetAttribute(ComputeCapabilityMajor)",
        )?;
        let minor = d.attribute(
            A::hipDeviceAttributeComputeCapabilityMinor,
            "hipDeviceGetAttribute(ComputeCapabilityMinor)",
        )?;
        Ok(DeviceProperties {
            name,
            sm_count: sm.max(0) as u32,
            compute_capability: (major.max(0) as u32, minor.max(0) as u32),
            pci_bus_id: pci,
            numa_node: numa,
        })
    }

    fn can_access_peer(d: &RocmDevice, peer: &RocmDevice) -> Result<bool> {
        d.enter()?;
        if d == peer {
            return Ok(true);
        }
        device::can_access_peer(d.ordinal, peer.ordinal)
    }

    fn enable_peer_access(d: &RocmDevice, peer: &RocmDevice) -> Result<()> {
        d.enter()?;
        if d == peer {
            return Ok(());
        }
        device::enable_peer_access(peer.ordinal)
    }

    fn multicast_supported(_dev: &RocmDevice) -> Result<bool> {
        Ok(false)
    }

    fn synchronize(dev: &RocmDevice, timeout: Duration) -> Result<()> {
        dev.enter()?;
        // hipDeviceSynchronize has no timeout: run it on a helper thread and stop waiting at
        // the limit.
        let d = *dev;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("mscclpp-hal-hipsync".into())
            .spawn(move || {
                let r = d.bind().and_then(|()| device::synchronize());
                let _ = tx.send(r);
            })
            .map_err(|source| Error::Os {
                op: "spawn device sync thread",
                source,
            })?;
        rx.recv_timeout(timeout).unwrap_or(Err(Error::Timeout {
            op: "hipDeviceSynchronize",
            waited: timeout,
        }))
    }
}
