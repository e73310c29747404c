//! The host backend's only device: the CPU.

use crate::{DeviceProperties, Error, Result};

/// The CPU as a device. There is exactly one, ordinal 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostDevice;

pub(super) fn open(ordinal: usize) -> Result<HostDevice> {
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

pub(super) fn properties() -> DeviceProperties {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    DeviceProperties {
        name: "host cpu".to_string(),
        sm_count: u32::try_from(cpus).unwrap_or(u32::MAX),
        compute_capability: (0, 0),
        pci_bus_id: String::new(),
        numa_node: -1,
    }
}
