//! Transports, devices and endpoint configurations: what a connection runs over.

use std::fmt;

use crate::error::{Error, Result};

/// One way of moving bytes between two endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Transport {
    /// No transport (the default of an unset configuration).
    Unknown = 0,
    /// GPU IPC: peers map each other's memory (any backend: CUDA, HIP, host memfd).
    CudaIpc = 1,
    /// InfiniBand / RoCE HCA 0.
    Ib0 = 2,
    /// HCA 1.
    Ib1 = 3,
    /// HCA 2.
    Ib2 = 4,
    /// HCA 3.
    Ib3 = 5,
    /// HCA 4.
    Ib4 = 6,
    /// HCA 5.
    Ib5 = 7,
    /// HCA 6.
    Ib6 = 8,
    /// HCA 7.
    Ib7 = 9,
    /// TCP sockets with a receive thread; works between any two hosts.
    Ethernet = 10,
}

/// The eight InfiniBand transports, in device-index order.
/// (`Transport::ALL[2..10]`.)
pub const ALL_IB_TRANSPORTS: [Transport; 8] = {
    let mut ib = [Transport::Ib0; 8];
    let mut i = 0;
    while i < ib.len() {
        ib[i] = Transport::ALL[2 + i];
        i += 1;
    }
    ib
};

impl Transport {
    /// Every transport with a wire value, in order.
    pub const ALL: [Transport; 11] = [
        Transport::Unknown,
        Transport::CudaIpc,
        Transport::Ib0,
        Transport::Ib1,
        Transport::Ib2,
        Transport::Ib3,
        Transport::Ib4,
        Transport::Ib5,
        Transport::Ib6,
        Transport::Ib7,
        Transport::Ethernet,
    ];

    /// The wire value (used in serialized endpoints and memories).
    pub fn to_u8(self) -> u8 {
        self as u8
    }

    /// Parses a wire value; anything else is an error naming the accepted range.
    pub fn from_u8(v: u8) -> Result<Transport> {
        Transport::ALL
            .get(v as usize)
            .copied()
            .ok_or_else(|| Error::InvalidUsage(format!("transport value {v}: expected 0..=10")))
    }

    /// True for IB0..IB7.
    pub fn is_ib(self) -> bool {
        self.ib_index().is_some()
    }

    /// The IB device index (0..8) of IB0..IB7.
    pub fn ib_index(self) -> Option<usize> {
        ALL_IB_TRANSPORTS.iter().position(|&t| t == self)
    }

    fn bit(self) -> u32 {
        1 << (self as u8)
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ib_index() {
            Some(i) => write!(f, "IB{i}"),
            None => f.write_str(match self {
                Transport::Unknown => "Unknown",
                Transport::CudaIpc => "CudaIpc",
                _ => "Ethernet",
            }),
        }
    }
}

/// A set of transports.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TransportFlags(u32);

impl TransportFlags {
    /// The empty set.
    pub const NONE: TransportFlags = TransportFlags(0);

    /// The set with these bits (one per transport); an error for bits naming no transport.
    pub fn from_bits(bits: u32) -> Result<TransportFlags> {
        let all = Transport::ALL.iter().fold(0, |a, t| a | t.bit());
        if bits & !all != 0 {
            return Err(Error::InvalidUsage(format!(
                "transport flags {bits:#x}: bits outside {all:#x}"
            )));
        }
        Ok(TransportFlags(bits))
    }
    /// The set's bits.
    pub fn bits(self) -> u32 {
        self.0
    }
    /// Whether `t` is in the set.
    pub fn has(self, t: Transport) -> bool {
        self.0 & t.bit() != 0
    }
    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// How many transports are in the set.
    pub fn count(self) -> usize {
        self.0.count_ones() as usize
    }
    /// The transports in the set, in their numeric order.
    pub fn iter(self) -> impl Iterator<Item = Transport> {
        Transport::ALL.into_iter().filter(move |t| self.has(*t))
    }
    /// True when any IB transport is in the set.
    pub fn has_ib(self) -> bool {
        ALL_IB_TRANSPORTS.iter().any(|&t| self.has(t))
    }
}

impl From<Transport> for TransportFlags {
    fn from(t: Transport) -> Self {
        TransportFlags(t.bit())
    }
}

impl std::ops::BitOr for TransportFlags {
    type Output = TransportFlags;
    fn bitor(self, o: TransportFlags) -> TransportFlags {
        TransportFlags(self.0 | o.0)
    }
}

impl std::ops::BitOr<Transport> for TransportFlags {
    type Output = TransportFlags;
    fn bitor(self, o: Transport) -> TransportFlags {
        TransportFlags(self.0 | o.bit())
    }
}

impl std::ops::BitOr for Transport {
    type Output = TransportFlags;
    fn bitor(self, o: Transport) -> TransportFlags {
        TransportFlags(self.bit() | o.bit())
    }
}

impl std::ops::BitAnd for TransportFlags {
    type Output = TransportFlags;
    fn bitand(self, o: TransportFlags) -> TransportFlags {
        TransportFlags(self.0 & o.0)
    }
}

impl fmt::Debug for TransportFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// Where an endpoint's memory and work live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// Host memory and CPU threads.
    Cpu,
    /// A GPU.
    Gpu,
}

/// A device: the CPU, or GPU `id` of the backend this binary was built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    /// CPU or GPU.
    pub kind: DeviceType,
    /// The GPU's ordinal (-1 for the CPU).
    pub id: i32,
}

impl Device {
    /// The CPU.
    pub const CPU: Device = Device {
        kind: DeviceType::Cpu,
        id: -1,
    };
    /// GPU `id`.
    pub fn gpu(id: i32) -> Device {
        Device {
            kind: DeviceType::Gpu,
            id,
        }
    }
}

/// How an IB connection signals semaphores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IbMode {
    /// `MSCCLPP_IBV_MODE` (`host` or `host-no-atomic`); `host` when unset.
    Default,
    /// RDMA atomics (fetch-add of the difference).
    Host,
    /// 0-byte RDMA write-with-immediate and a receive thread that forwards the value.
    HostNoAtomic,
}

impl IbMode {
    /// Resolves `Default` from the value of `MSCCLPP_IBV_MODE`.
    pub fn resolve(self, env_value: Option<&str>) -> Result<IbMode> {
        match self {
            IbMode::Default => match env_value.map(str::trim) {
                None | Some("") | Some("host") => Ok(IbMode::Host),
                Some("host-no-atomic") => Ok(IbMode::HostNoAtomic),
                Some(other) => Err(Error::InvalidUsage(format!(
                    "MSCCLPP_IBV_MODE={other}: expected one of host, host-no-atomic"
                ))),
            },
            m => Ok(m),
        }
    }
}

/// IB part of an endpoint configuration (upstream's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbConfig {
    /// Reserved for future use (which NIC of a multi-NIC device).
    pub device_index: i32,
    /// -1: the first ACTIVE port with an IB or Ethernet link layer and a valid GID.
    pub port: i32,
    /// -1: `MSCCLPP_IB_GID_INDEX`, default 0.
    pub gid_index: i32,
    /// Completion queue entries.
    pub max_cq_size: i32,
    /// Completions taken per poll.
    pub max_cq_poll_num: i32,
    /// Send work requests the queue pair holds.
    pub max_send_wr: i32,
    /// Receive work requests the queue pair holds.
    pub max_recv_wr: i32,
    /// Work requests posted per `ibv_post_send` at most.
    pub max_wr_per_send: i32,
    /// How signals are delivered (RDMA atomics or write-with-immediate).
    pub mode: IbMode,
}

impl Default for IbConfig {
    fn default() -> Self {
        IbConfig {
            device_index: -1,
            port: -1,
            gid_index: -1,
            max_cq_size: 1024,
            max_cq_poll_num: 256,
            max_send_wr: 8192,
            max_recv_wr: 16,
            max_wr_per_send: 64,
            mode: IbMode::Default,
        }
    }
}

/// Everything needed to create an endpoint. A plain `Transport` converts into one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointConfig {
    /// The transport.
    pub transport: Transport,
    /// Where the endpoint's memory lives.
    pub device: Device,
    /// -1: the transport's default.
    pub max_write_queue_size: i32,
    /// IB settings (used by the IB transports only).
    pub ib: IbConfig,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            transport: Transport::Unknown,
            device: Device::CPU,
            max_write_queue_size: -1,
            ib: IbConfig::default(),
        }
    }
}

impl From<Transport> for EndpointConfig {
    fn from(transport: Transport) -> Self {
        EndpointConfig {
            transport,
            ..EndpointConfig::default()
        }
    }
}

impl EndpointConfig {
    /// An endpoint of `transport` on `device` with default IB settings.
    pub fn new(transport: Transport, device: Device) -> Self {
        EndpointConfig {
            transport,
            device,
            ..EndpointConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_values_round_trip_and_reject_unknown() {
        for t in Transport::ALL {
            assert_eq!(Transport::from_u8(t.to_u8()).unwrap(), t);
        }
        assert!(Transport::from_u8(11).is_err());
        assert_eq!(Transport::Ib3.ib_index(), Some(3));
        assert_eq!(Transport::Ethernet.ib_index(), None);
        assert_eq!(Transport::Ib7.to_string(), "IB7");
    }

    #[test]
    fn flags_behave_as_a_set() {
        let f = Transport::CudaIpc | Transport::Ib1;
        assert!(f.has(Transport::CudaIpc) && f.has(Transport::Ib1));
        assert!(!f.has(Transport::Ethernet));
        assert!(f.has_ib());
        assert_eq!(f.count(), 2);
        assert_eq!(
            f.iter().collect::<Vec<_>>(),
            vec![Transport::CudaIpc, Transport::Ib1]
        );
        assert_eq!(TransportFlags::from_bits(f.bits()).unwrap(), f);
        assert!(TransportFlags::from_bits(1 << 20).is_err());
        assert!((f & TransportFlags::from(Transport::Ethernet)).is_empty());
    }

    #[test]
    fn ib_mode_default_reads_the_env_value() {
        assert_eq!(IbMode::Default.resolve(None).unwrap(), IbMode::Host);
        assert_eq!(
            IbMode::Default.resolve(Some("host-no-atomic")).unwrap(),
            IbMode::HostNoAtomic
        );
        let e = IbMode::Default
            .resolve(Some("fast"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("host, host-no-atomic"), "{e}");
        assert_eq!(
            IbMode::Host.resolve(Some("host-no-atomic")).unwrap(),
            IbMode::Host
        );
    }

    #[test]
    fn transport_converts_into_config_with_upstream_defaults() {
        let c: EndpointConfig = Transport::Ib0.into();
        assert_eq!(c.transport, Transport::Ib0);
        assert_eq!(c.ib.max_cq_size, 1024);
        assert_eq!(c.ib.max_send_wr, 8192);
        assert_eq!(c.ib.port, -1);
        assert_eq!(c.device, Device::CPU);
    }
}
