//! The `#[repr(C)]` device handles equal the C structs of kernels/cuda/include: compiles
//! kernels/cuda/tests/layout_dump.cpp with the host C++ compiler (`$CXX`, else `c++`), runs it,
//! and compares every size, alignment and field offset, plus the trigger bit packing.

use std::collections::HashMap;
use std::mem::{align_of, offset_of, size_of};

use mscclpp::device_emu::switch_channel::{Bf16x8, F16x8, F32x4};
use mscclpp::fifo::{
    parity_bit, FifoDeviceHandle, ProxyTrigger, TRIGGER_DATA, TRIGGER_FLAG, TRIGGER_SYNC,
};
use mscclpp::memory_channel::{BaseMemoryChannelDeviceHandle, MemoryChannelDeviceHandle};
use mscclpp::packet::{LL16Packet, LL8Packet};
use mscclpp::port_channel::{BasePortChannelDeviceHandle, PortChannelDeviceHandle};
use mscclpp::semaphore::{
    Host2DeviceSemaphoreDeviceHandle, MemoryDevice2DeviceSemaphoreDeviceHandle,
};
use mscclpp::switch_channel::SwitchChannelDeviceHandle;

#[path = "common/cpp_dump.rs"]
mod cpp_dump;

/// Builds and runs layout_dump once per test process (both tests need it; building it twice
/// at once races: one test would execute the file while the other rewrites it); returns its
/// output lines.
fn dump() -> Vec<String> {
    static LINES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    LINES.get_or_init(build_and_run_dump).clone()
}

fn build_and_run_dump() -> Vec<String> {
    cpp_dump::run("layout_dump")
        .lines()
        .map(str::to_string)
        .collect()
}

/// "Name size N" / "Name align N" / "Name.field offset N" -> key "Name size" etc. -> N.
fn parse(lines: &[String]) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for l in lines {
        let parts: Vec<&str> = l.split_whitespace().collect();
        if parts.len() == 3 && matches!(parts[1], "size" | "align" | "offset") {
            let v = parts[2]
                .parse()
                .unwrap_or_else(|e| panic!("line `{l}`: {e}"));
            m.insert(format!("{} {}", parts[0], parts[1]), v);
        }
    }
    m
}

#[test]
fn handles_match_the_c_headers() {
    let lines = dump();
    let c = parse(&lines);
    let mut checked = 0;
    let mut check = |key: &str, rust: usize| {
        let got = c
            .get(key)
            .copied()
            .unwrap_or_else(|| panic!("layout_dump printed no `{key}`"));
        assert_eq!(rust, got, "{key}: Rust {rust} vs C {got}");
        checked += 1;
    };
    macro_rules! ty {
        ($c:literal, $t:ty) => {
            check(concat!($c, " size"), size_of::<$t>());
            check(concat!($c, " align"), align_of::<$t>());
        };
    }
    macro_rules! field {
        ($c:literal, $t:ty, $f:ident) => {
            check(concat!($c, " offset"), offset_of!($t, $f));
        };
    }
    ty!("ProxyTrigger", ProxyTrigger);
    field!("ProxyTrigger.fst", ProxyTrigger, fst);
    field!("ProxyTrigger.snd", ProxyTrigger, snd);
    ty!("FifoDeviceHandle", FifoDeviceHandle);
    field!("FifoDeviceHandle.triggers", FifoDeviceHandle, triggers);
    field!("FifoDeviceHandle.head", FifoDeviceHandle, head);
    field!("FifoDeviceHandle.tail", FifoDeviceHandle, tail);
    field!("FifoDeviceHandle.tailCache", FifoDeviceHandle, tail_cache);
    field!("FifoDeviceHandle.size", FifoDeviceHandle, size);
    field!("FifoDeviceHandle.pad", FifoDeviceHandle, pad);
    ty!(
        "Host2DeviceSemaphoreDeviceHandle",
        Host2DeviceSemaphoreDeviceHandle
    );
    field!(
        "Host2DeviceSemaphoreDeviceHandle.inboundToken",
        Host2DeviceSemaphoreDeviceHandle,
        inbound_token
    );
    field!(
        "Host2DeviceSemaphoreDeviceHandle.expectedInboundToken",
        Host2DeviceSemaphoreDeviceHandle,
        expected_inbound_token
    );
    ty!(
        "MemoryDevice2DeviceSemaphoreDeviceHandle",
        MemoryDevice2DeviceSemaphoreDeviceHandle
    );
    field!(
        "MemoryDevice2DeviceSemaphoreDeviceHandle.inboundToken",
        MemoryDevice2DeviceSemaphoreDeviceHandle,
        inbound_token
    );
    field!(
        "MemoryDevice2DeviceSemaphoreDeviceHandle.remoteInboundToken",
        MemoryDevice2DeviceSemaphoreDeviceHandle,
        remote_inbound_token
    );
    field!(
        "MemoryDevice2DeviceSemaphoreDeviceHandle.expectedInboundToken",
        MemoryDevice2DeviceSemaphoreDeviceHandle,
        expected_inbound_token
    );
    ty!(
        "BaseMemoryChannelDeviceHandle",
        BaseMemoryChannelDeviceHandle
    );
    field!(
        "BaseMemoryChannelDeviceHandle.semaphore",
        BaseMemoryChannelDeviceHandle,
        semaphore
    );
    ty!("MemoryChannelDeviceHandle", MemoryChannelDeviceHandle);
    field!(
        "MemoryChannelDeviceHandle.semaphore",
        MemoryChannelDeviceHandle,
        semaphore
    );
    field!(
        "MemoryChannelDeviceHandle.dst",
        MemoryChannelDeviceHandle,
        dst
    );
    field!(
        "MemoryChannelDeviceHandle.src",
        MemoryChannelDeviceHandle,
        src
    );
    field!(
        "MemoryChannelDeviceHandle.packetBuffer",
        MemoryChannelDeviceHandle,
        packet_buffer
    );
    ty!("BasePortChannelDeviceHandle", BasePortChannelDeviceHandle);
    field!(
        "BasePortChannelDeviceHandle.semaphoreId",
        BasePortChannelDeviceHandle,
        semaphore_id
    );
    field!(
        "BasePortChannelDeviceHandle.pad",
        BasePortChannelDeviceHandle,
        pad
    );
    field!(
        "BasePortChannelDeviceHandle.semaphore",
        BasePortChannelDeviceHandle,
        semaphore
    );
    field!(
        "BasePortChannelDeviceHandle.fifo",
        BasePortChannelDeviceHandle,
        fifo
    );
    ty!("SwitchChannelDeviceHandle", SwitchChannelDeviceHandle);
    field!(
        "SwitchChannelDeviceHandle.devicePtr",
        SwitchChannelDeviceHandle,
        device_ptr
    );
    field!(
        "SwitchChannelDeviceHandle.mcPtr",
        SwitchChannelDeviceHandle,
        mc_ptr
    );
    field!(
        "SwitchChannelDeviceHandle.bufferSize",
        SwitchChannelDeviceHandle,
        buffer_size
    );
    // The emulation's vectors are transfer types: sizes match (the C ones are over-aligned for
    // the vector instructions).
    check("f32x4 size", size_of::<F32x4>());
    check("f16x8 size", size_of::<F16x8>());
    check("bf16x8 size", size_of::<Bf16x8>());
    ty!("PortChannelDeviceHandle", PortChannelDeviceHandle);
    field!(
        "PortChannelDeviceHandle.base",
        PortChannelDeviceHandle,
        base
    );
    field!("PortChannelDeviceHandle.dst", PortChannelDeviceHandle, dst);
    field!("PortChannelDeviceHandle.src", PortChannelDeviceHandle, src);
    ty!("LL16Packet", LL16Packet);
    field!("LL16Packet.data1", LL16Packet, data1);
    field!("LL16Packet.flag1", LL16Packet, flag1);
    field!("LL16Packet.data2", LL16Packet, data2);
    field!("LL16Packet.flag2", LL16Packet, flag2);
    ty!("LL8Packet", LL8Packet);
    field!("LL8Packet.data", LL8Packet, data);
    field!("LL8Packet.flag", LL8Packet, flag);
    // Every line layout_dump printed was compared (none of its structs is left unmirrored).
    assert_eq!(
        checked,
        c.len(),
        "layout_dump printed {} entries, {checked} were compared",
        c.len()
    );
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|e| panic!("`{s}`: {e}"))
}

#[test]
fn trigger_packing_matches_the_c_helper() {
    let lines = dump();
    let example = |name: &str| -> (u64, u64) {
        let l = lines
            .iter()
            .find(|l| l.starts_with(&format!("trigger_example {name} ")))
            .unwrap_or_else(|| panic!("layout_dump printed no trigger_example {name}"));
        let p: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(p.len(), 6, "line `{l}`");
        (hex(p[3]), hex(p[5]))
    };
    let a = ProxyTrigger::new(TRIGGER_DATA | TRIGGER_FLAG, 5, 0x1000, 3, 0x2000, 0x400, 7)
        .expect("fits");
    assert_eq!((a.fst, a.snd), example("data_flag"));
    let b = ProxyTrigger::new(
        TRIGGER_SYNC,
        511,
        0xffff_ffff,
        511,
        0xffff_ffff,
        0xffff_ffff,
        1023,
    )
    .expect("fits");
    assert_eq!((b.fst, b.snd), example("all_ones"));
    let parity = lines
        .iter()
        .find(|l| l.starts_with("trigger_parity "))
        .expect("layout_dump printed trigger_parity");
    let p: Vec<&str> = parity.split_whitespace().collect();
    let bit = |i: usize| {
        p.get(i)
            .map(|s| *s == "1")
            .unwrap_or_else(|| panic!("line `{parity}`"))
    };
    assert_eq!(parity_bit(0, 8) != 0, bit(6));
    assert_eq!(parity_bit(8, 8) != 0, bit(12));
    assert_eq!(parity_bit(17, 8) != 0, bit(18));
}
