//! The host backend's only device: the CPU ([`crate::DeviceApi`] for [`Host`]).

use super::Host;
use crate::auxil::deferred;
use crate::{DeviceApi, DeviceProperties, Error, Result};
use std::time::Duration;

/// The CPU as a device. There is exactly one, ordinal 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostDevice;

impl HostDevice {
    /// Enters the backend for one operation. Every fallible host operation starts here (the
    /// host has no context to make current); like the GPU backends it does not surface failures
    /// recorded by an earlier `Drop` (`device_count` and `open_device` do).
    pub(super) fn enter() -> Result<()> {
        Ok(())
    }
}

impl DeviceApi for Host {
    fn device_count() -> Result<usize> {
        deferred::check()?;
        Ok(1)
    }
    fn open_device(ordinal: usize) -> Result<HostDevice> {
        deferred::check()?;
        if ordinal == 0 {
            Ok(HostDevice)
        } else {
            Err(Error::invalid(
                "open_device(host)",
                "ordinal 0 (the host has one device)",
                ordinal.to_string(),
            ))
        }
    }
    fn device_ordinal(_dev: &HostDevice) -> usize {
        0
    }
    fn set_current(_dev: &HostDevice) -> Result<()> {
        HostDevice::enter()
    }
    fn current_ordinal() -> Result<Option<usize>> {
        HostDevice::enter()?;
        Ok(Some(0))
    }
    fn properties(_dev: &HostDevice) -> Result<DeviceProperties> {
        HostDevice::enter()?;
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Ok(DeviceProperties {
            name: "host cpu".to_string(),
            sm_count: u32::try_from(cpus).unwrap_or(u32::MAX),
            compute_capability: (0, 0),
            pci_bus_id: String::new(),
            numa_node: -1,
        })
    }
    fn can_access_peer(_dev: &HostDevice, _peer: &HostDevice) -> Result<bool> {
        Ok(true)
    }
    fn enable_peer_access(_dev: &HostDevice, _peer: &HostDevice) -> Result<()> {
        HostDevice::enter()
    }
    fn multicast_supported(_dev: &HostDevice) -> Result<bool> {
        Ok(false)
    }
    fn synchronize(_dev: &HostDevice, _timeout: Duration) -> Result<()> {
        HostDevice::enter()
    }
}
