//! LL ("low latency") packets: data travels with a flag in the same 8-byte word, so a reader
//! needs no separate signal. Layouts equal `packet_device.hpp`.
//!
//! - [`LL16Packet`] {data1, flag1, data2, flag2}: 8 data bytes per 16-byte packet, each u64 half
//!   carries its own flag; valid when both flags equal the expected one.
//! - [`LL8Packet`] {data, flag}: 4 data bytes per 8-byte packet.
//!
//! Packet buffers need twice the data bytes. Flags must change between uses of a buffer and
//! never be 0 on a zeroed buffer. The device operations (write/read/copy) for the host backend
//! are in [`crate::device_emu::packet`].

/// `union LL16Packet` of the C header (size 16, align 16).
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LL16Packet {
    /// First data word.
    pub data1: u32,
    /// Flag of the first half.
    pub flag1: u32,
    /// Second data word.
    pub data2: u32,
    /// Flag of the second half.
    pub flag2: u32,
}

/// `union LL8Packet` of the C header (size 8, align 8).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LL8Packet {
    /// Data word.
    pub data: u32,
    /// Flag.
    pub flag: u32,
}

/// A packet format: how many data bytes one packet carries and how big it is.
pub trait Packet: Copy {
    /// Data bytes per packet (8 for LL16, 4 for LL8).
    const PAYLOAD_BYTES: usize;
    /// Bytes per packet.
    const PACKET_BYTES: usize = std::mem::size_of::<Self>();
    /// Name for messages.
    const NAME: &'static str;
}

impl Packet for LL16Packet {
    const PAYLOAD_BYTES: usize = 8;
    const NAME: &'static str = "LL16";
}

impl Packet for LL8Packet {
    const PAYLOAD_BYTES: usize = 4;
    const NAME: &'static str = "LL8";
}

/// Bytes of packet buffer needed to carry `data_bytes` of data.
pub const fn packet_buffer_bytes<P: Packet>(data_bytes: usize) -> usize {
    data_bytes.div_ceil(P::PAYLOAD_BYTES) * P::PACKET_BYTES
}
