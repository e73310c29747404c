//! Property-based fuzzing (proptest, stable Rust) of what a peer sends to the connections: the
//! Ethernet frames, acks, hellos and confirmations and the whole receive loop over them; the
//! IB endpoint blob (`MIBQ`, [`QpInfo`]) and memory-key blob (`MIBM`, [`RemoteMr`]); the CudaIpc
//! info blob of a registered memory (export, liveness slot and table). Each target: no panic,
//! allocation bounded by the documented limits, and either `Ok` that re-encodes to the same
//! bytes (where the format has an encoder) or an `Err` that names what was expected.
//!
//! Budget: `MSCCLPP_FUZZ_CASES` cases per target (default 256, what CI runs). Long mode, at
//! least a million cases per target:
//! `MSCCLPP_FUZZ_CASES=1000000 cargo test --release -p mscclpp --lib connection::fuzz`.

use proptest::prelude::*;

use super::ethernet::receiver::{serve, CHUNK};
use super::ethernet::wire::{
    self, decode_ack, decode_confirm, decode_hello, Frame, Op, ACK_LEN, FRAME_LEN, MAX_WRITE_LEN,
};
use crate::ib::mr::RemoteMr;
use crate::ib::qp::QpInfo;
use crate::registered_memory::decode_ipc_info;
use crate::{Context, Device, LocalMemory, RegisteredMemory, Transport};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: mscclpp_framework::fuzz_cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn names_expectation(what: &str, input: &[u8], e: &crate::Error) -> Result<(), TestCaseError> {
    let m = e.to_string();
    prop_assert!(
        m.contains("expected") || m.contains("outside"),
        "{} {:02x?}: the error names nothing expected: {}",
        what,
        input,
        m
    );
    Ok(())
}

/// Overwrites up to three bytes of `b` and maybe cuts it.
fn damaged(b: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        proptest::option::of(any::<usize>()),
    )
        .prop_map(move |(edits, cut)| {
            let mut b = b.clone();
            for (at, v) in edits {
                let i = at % b.len().max(1);
                if let Some(x) = b.get_mut(i) {
                    *x = v;
                }
            }
            if let Some(c) = cut {
                b.truncate(c % (b.len() + 1));
            }
            b
        })
}

/// A memory of three pages with only the middle one registered for Ethernet: writes must land
/// there or nowhere.
struct Guarded {
    mem: LocalMemory,
    reg: RegisteredMemory,
}

fn guarded() -> &'static Guarded {
    static G: std::sync::OnceLock<Guarded> = std::sync::OnceLock::new();
    G.get_or_init(|| {
        let mem = LocalMemory::alloc(Device::CPU, 3 * 4096).expect("alloc");
        let ctx = Context::new().expect("context");
        let reg = ctx
            .register_memory(mem.ptr() + 4096, 4096, Transport::Ethernet.into())
            .expect("register");
        Guarded { mem, reg }
    })
}

/// A stream of frames: mostly well-formed, some aimed at the guarded registration (inside,
/// across its edges, or with a wrong id), payloads shorter or longer than announced.
fn frame_stream() -> impl Strategy<Value = Vec<u8>> {
    let frame = (
        any::<u64>(),
        prop_oneof![Just(true), Just(false), any::<bool>()],
        prop_oneof![0u64..3 * 4096, any::<u64>()],
        prop_oneof![
            (0u64..5000).prop_map(|len| Op::Write { len }),
            (MAX_WRITE_LEN - 2..MAX_WRITE_LEN + 2).prop_map(|len| Op::Write { len }),
            any::<u64>().prop_map(|value| Op::Signal { value }),
        ],
        prop_oneof![Just(0i64), -8i64..8],
        any::<u8>(),
        any::<bool>(),
    )
        .prop_map(|(seq, real_id, off, op, payload_delta, fill, bad_kind)| {
            let g = guarded();
            let base = g.mem.ptr();
            let f = Frame {
                seq,
                registration: if real_id {
                    g.reg.registration_id()
                } else {
                    seq
                },
                addr: base.wrapping_add(off),
                op,
            };
            let mut b = f.encode().to_vec();
            if bad_kind {
                b[0] = fill;
            }
            if let Op::Write { len } = op {
                let n = (len.min(6000) as i64 + payload_delta).max(0) as usize;
                b.extend(std::iter::repeat_n(0xA5, n));
            }
            b
        });
    proptest::collection::vec(frame, 0..6).prop_map(|v| v.concat())
}

fn check_stream(bytes: &[u8]) -> Result<(), TestCaseError> {
    let g = guarded();
    let mut reader = bytes;
    let mut acks = Vec::new();
    let mut buf = Vec::new();
    let mut reports = 0usize;
    let end = serve(&mut reader, &mut acks, &mut buf, &mut |_| reports += 1);
    prop_assert!(!end.is_empty());
    prop_assert!(
        buf.capacity() <= 2 * CHUNK,
        "payload buffer {} bytes",
        buf.capacity()
    );
    prop_assert_eq!(acks.len() % ACK_LEN, 0);
    for a in acks.chunks(ACK_LEN) {
        prop_assert!(decode_ack(a).is_ok(), "the receiver's own ack decodes");
    }
    // Nothing outside the registered middle page was ever written.
    let all = g.mem.to_vec().expect("read");
    prop_assert!(
        all[..4096].iter().all(|&b| b == 0),
        "write below the registration"
    );
    prop_assert!(
        all[8192..].iter().all(|&b| b == 0),
        "write above the registration"
    );
    Ok(())
}

fn qp_info() -> impl Strategy<Value = Vec<u8>> {
    (
        (any::<u8>(), any::<u16>(), any::<[u8; 16]>()),
        (
            prop_oneof![1u32..0x100_0000, any::<u32>()],
            0u32..0x100_0000,
        ),
        (
            prop_oneof![1u8..=5, any::<u8>()],
            any::<u8>(),
            any::<bool>(),
        ),
        (
            any::<u64>(),
            any::<u32>(),
            prop_oneof![1u32..64, any::<u32>()],
        ),
    )
        .prop_map(
            |((port, lid, gid), (qpn, psn), (mtu, ll, no_atomic), (a, k, n))| {
                QpInfo {
                    port,
                    lid,
                    gid: mscclpp_hal::ibv::Gid(gid),
                    qpn,
                    psn,
                    mtu,
                    link_layer: ll,
                    mode: if no_atomic {
                        crate::IbMode::HostNoAtomic
                    } else {
                        crate::IbMode::Host
                    },
                    mailbox_addr: a,
                    mailbox_rkey: k,
                    mailbox_slots: n,
                }
                .encode()
            },
        )
        .prop_flat_map(damaged)
}

fn remote_mr() -> impl Strategy<Value = Vec<u8>> {
    (any::<u64>(), any::<u64>(), any::<u32>())
        .prop_map(|(addr, len, rkey)| RemoteMr { addr, len, rkey }.encode())
        .prop_flat_map(damaged)
}

/// The CudaIpc info blob of a real registration of this process, damaged.
fn ipc_info() -> impl Strategy<Value = Vec<u8>> {
    static REAL: std::sync::OnceLock<(LocalMemory, RegisteredMemory)> = std::sync::OnceLock::new();
    let (_, reg) = REAL.get_or_init(|| {
        let mem = LocalMemory::alloc(Device::CPU, 8192).expect("alloc");
        let reg = Context::new()
            .expect("context")
            .register_memory(mem.ptr() + 64, 4096, Transport::CudaIpc.into())
            .expect("register");
        (mem, reg)
    });
    let blob = reg
        .transport_info(Transport::CudaIpc)
        .expect("CudaIpc info")
        .to_vec();
    damaged(blob)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn ethernet_frame_header(b in proptest::collection::vec(any::<u8>(), 0..48)) {
        match Frame::decode(&b) {
            Ok(f) => {
                prop_assert_eq!(&f.encode()[..], &b[..], "a decoded frame re-encodes");
                if let Op::Write { len } = f.op {
                    prop_assert!(len <= MAX_WRITE_LEN);
                }
            }
            Err(e) => names_expectation("frame", &b, &e)?,
        }
        match decode_ack(&b) {
            Ok((seq, st)) => prop_assert_eq!(&wire::ack(seq, st)[..], &b[..]),
            Err(e) => names_expectation("ack", &b, &e)?,
        }
        match decode_hello(&b) {
            Ok((t, s)) => prop_assert_eq!(&wire::hello(t, s)[..], &b[..]),
            Err(e) => names_expectation("hello", &b, &e)?,
        }
        match decode_confirm(&b) {
            Ok(id) => prop_assert_eq!(&wire::confirm(id)[..], &b[..]),
            Err(e) => names_expectation("confirmation", &b, &e)?,
        }
    }

    #[test]
    fn ethernet_frame_header_structured(b in (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), 0u8..4)
        .prop_map(|(seq, registration, addr, arg, kind)| {
            let mut h = Frame { seq, registration, addr, op: Op::Signal { value: arg } }.encode();
            h[0] = kind;
            h.to_vec()
        })) {
        prop_assert_eq!(b.len(), FRAME_LEN);
        match Frame::decode(&b) {
            Ok(f) => prop_assert_eq!(&f.encode()[..], &b[..]),
            Err(e) => names_expectation("frame", &b, &e)?,
        }
    }

    #[test]
    fn ethernet_receive_loop(b in frame_stream()) {
        check_stream(&b)?;
    }

    #[test]
    fn ethernet_receive_loop_random_bytes(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        check_stream(&b)?;
    }

    #[test]
    fn ib_endpoint_blob(b in qp_info()) {
        match QpInfo::decode(&b) {
            Ok(q) => {
                prop_assert_eq!(q.encode(), b.clone(), "a decoded QpInfo re-encodes");
                prop_assert!(q.port >= 1 && q.qpn > 0 && q.qpn <= 0xFF_FFFF);
                prop_assert!((1..=5).contains(&q.mtu) && q.mailbox_slots > 0);
            }
            Err(e) => names_expectation("IB endpoint info", &b, &e)?,
        }
    }

    #[test]
    fn ib_endpoint_blob_random(b in proptest::collection::vec(any::<u8>(), 0..80)) {
        if let Err(e) = QpInfo::decode(&b) {
            names_expectation("IB endpoint info", &b, &e)?;
        }
    }

    #[test]
    fn ib_memory_key_blob(b in remote_mr()) {
        match RemoteMr::decode(&b) {
            Ok(m) => {
                prop_assert_eq!(m.encode(), b.clone(), "a decoded key re-encodes");
                prop_assert!(m.addr.checked_add(m.len).is_some());
            }
            Err(e) => names_expectation("IB memory info", &b, &e)?,
        }
    }

    #[test]
    fn cuda_ipc_info_blob(b in ipc_info(), size in prop_oneof![Just(4096u64), any::<u64>()]) {
        match decode_ipc_info(&b, size) {
            Ok((_, offset, desc, _, table)) => {
                prop_assert!(offset.checked_add(size).is_some_and(|end| end <= desc.size));
                prop_assert!(table.len() <= b.len());
            }
            Err(e) => names_expectation("CudaIpc info", &b, &e)?,
        }
    }

    #[test]
    fn cuda_ipc_info_blob_random(b in proptest::collection::vec(any::<u8>(), 0..120)) {
        if let Err(e) = decode_ipc_info(&b, 64) {
            names_expectation("CudaIpc info", &b, &e)?;
        }
    }
}

#[test]
fn the_seeds_are_valid() {
    // The damaged cases start from accepted inputs (else they fuzz nothing).
    let g = guarded();
    let mut stream = Frame {
        seq: 1,
        registration: g.reg.registration_id(),
        addr: g.mem.ptr() + 4096,
        op: Op::Write { len: 16 },
    }
    .encode()
    .to_vec();
    stream.extend([7u8; 16]);
    let (mut r, mut acks, mut buf) = (&stream[..], Vec::new(), Vec::new());
    let _ = serve(&mut r, &mut acks, &mut buf, &mut |m| panic!("refused: {m}"));
    assert_eq!(decode_ack(&acks).unwrap(), (1, wire::AckStatus::Applied));
    let mut page = vec![0u8; 16];
    g.mem.read(4096, &mut page).unwrap();
    assert_eq!(page, [7u8; 16]);
    g.mem.write(4096, &[0u8; 16]).unwrap();
}
