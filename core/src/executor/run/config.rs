//! The executor's settings ([`ExecutorConfig`]) and the packet format of a launch
//! ([`PacketType`]).

use std::time::Duration;

pub use crate::env::PortChannels;

/// LL packet format of packet operations (upstream's `PacketType`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PacketType {
    /// 16-byte packets carrying 8 data bytes (upstream's default).
    #[default]
    LL16,
    /// 8-byte packets carrying 4 data bytes.
    LL8,
}

impl PacketType {
    /// Data bytes per packet.
    pub fn payload_bytes(self) -> usize {
        match self {
            PacketType::LL16 => 8,
            PacketType::LL8 => 4,
        }
    }
}

/// Executor settings.
#[derive(Clone, Debug)]
pub struct ExecutorConfig {
    /// Host backend: how long a CPU "thread block" waits for a peer before failing.
    pub timeout: Duration,
    /// Host backend: CPU threads per thread block (1 runs each block's ops in order; more
    /// split the work as GPU threads do and make `nop` a real block barrier).
    pub host_threads_per_block: u32,
    /// How port channels run when every rank of a plan is on one node (default:
    /// `MSCCLPP_EXECUTOR_PORT_CHANNELS`, `auto`: as memory channels; core/src/executor/ports.rs).
    pub port_channels: PortChannels,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            timeout: Duration::from_secs(60),
            host_threads_per_block: 1,
            port_channels: crate::env::env().executor_port_channels(),
        }
    }
}
