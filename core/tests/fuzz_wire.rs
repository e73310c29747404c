//! Property-based fuzzing (proptest, stable Rust) of what peers send as connection setup:
//! `Endpoint` and `RegisteredMemory` deserialization, with the blobs inside them (Ethernet
//! addresses, IB queue-pair descriptions, CudaIpc exports of this process). Inputs are built
//! field by field after the documented wire formats, then bytes are overwritten, cut or
//! added. Each target: no panic, and either `Ok` that serializes back to the same bytes, or
//! an `Err` naming the message and what was expected.
//!
//! Budget: `MSCCLPP_FUZZ_CASES` cases per target (default 256, what CI runs). Long mode, at
//! least a million cases per target:
//! `MSCCLPP_FUZZ_CASES=1000000 cargo test --release -p mscclpp --test fuzz_wire`.

use std::sync::OnceLock;

use mscclpp::{Context, Device, Endpoint, LocalMemory, RegisteredMemory, Transport};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: mscclpp_framework::fuzz_cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// The serialize envelope: magic, version, body length, body.
fn envelope(magic: &[u8; 4], version: u16, body: &[u8]) -> Vec<u8> {
    let mut out = magic.to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    out
}

fn blob(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// Overwrites, cuts or extends `b`; `fix_len` then rewrites the envelope's body length so the
/// field parsers behind the envelope check are reached.
#[derive(Debug, Clone)]
struct Damage {
    edits: Vec<(usize, u8)>,
    cut: Option<usize>,
    extra: Vec<u8>,
    fix_len: bool,
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        // Half the cases stay well-formed up to the field values.
        Just(Damage {
            edits: vec![],
            cut: None,
            extra: vec![],
            fix_len: true
        }),
        (
            proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
            proptest::option::of(any::<usize>()),
            proptest::collection::vec(any::<u8>(), 0..3),
            any::<bool>(),
        )
            .prop_map(|(edits, cut, extra, fix_len)| Damage {
                edits,
                cut,
                extra,
                fix_len
            }),
    ]
}

fn apply(mut b: Vec<u8>, d: &Damage) -> Vec<u8> {
    if b.is_empty() {
        return b;
    }
    for &(at, v) in &d.edits {
        let i = at % b.len();
        b[i] = v;
    }
    if let Some(c) = d.cut {
        b.truncate(c % (b.len() + 1));
    }
    b.extend_from_slice(&d.extra);
    if d.fix_len && b.len() >= 10 {
        let body = (b.len() - 10) as u32;
        b[6..10].copy_from_slice(&body.to_le_bytes());
    }
    b
}

/// Errors that state the rule without the word "expected" (clear, but worded otherwise; to
/// be reworded with the wire-format work of phase 2).
const RULE_WORDINGS: &[&str] = &[
    "exceeds",
    "outside",
    "header says",
    "carries no transport payload",
    "non-zero padding",
    "no longer allocated",
    "but export info",
    "unreachable",
    "not supported",
    "overflow",
    "needs",
    // The HAL's IPC descriptor decoder words its errors as "bad IPC descriptor: <rule>"
    // ("size is 0", ...); every one of them names the field.
    "bad IPC descriptor:",
];

fn check_error(what: &str, input: &[u8], e: &mscclpp::Error) -> Result<(), TestCaseError> {
    let m = e.to_string();
    prop_assert!(
        m.contains("expected") || RULE_WORDINGS.iter().any(|w| m.contains(w)),
        "{} {:02x?}: error names nothing expected: {}",
        what,
        input,
        m
    );
    Ok(())
}

/// An Ethernet address payload: family, 16 address bytes, port.
fn ethernet_payload() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![Just(4u8), Just(6u8), any::<u8>()],
        any::<[u8; 16]>(),
        any::<bool>(),
        any::<u16>(),
    )
        .prop_map(|(fam, mut ip, pad_zero, port)| {
            if fam == 4 && pad_zero {
                ip[4..].fill(0);
            }
            let mut out = vec![fam];
            out.extend_from_slice(&ip);
            out.extend_from_slice(&port.to_le_bytes());
            out
        })
}

/// An IB queue-pair description (magic `MIBQ`, version 1).
fn ib_payload() -> impl Strategy<Value = Vec<u8>> {
    (
        (any::<u8>(), prop_oneof![0u32..0x1_0000, any::<u32>()]),
        prop_oneof![Just(16usize), 0usize..20],
        (
            prop_oneof![1u32..0x100_0000, any::<u32>()],
            prop_oneof![0u32..0x100_0000, any::<u32>()],
        ),
        (
            prop_oneof![1u8..=5, any::<u8>()],
            any::<u8>(),
            prop_oneof![1u8..=2, any::<u8>()],
        ),
        (
            any::<u64>(),
            any::<u32>(),
            prop_oneof![1u32..64, any::<u32>()],
        ),
    )
        .prop_map(
            |((port, lid), gid_len, (qpn, psn), (mtu, ll, mode), (addr, rkey, slots))| {
                let mut body = vec![port];
                body.extend_from_slice(&lid.to_le_bytes());
                blob(&mut body, &vec![0xfe; gid_len]);
                body.extend_from_slice(&qpn.to_le_bytes());
                body.extend_from_slice(&psn.to_le_bytes());
                body.extend_from_slice(&[mtu, ll, mode]);
                body.extend_from_slice(&addr.to_le_bytes());
                body.extend_from_slice(&rkey.to_le_bytes());
                body.extend_from_slice(&slots.to_le_bytes());
                envelope(b"MIBQ", 1, &body)
            },
        )
}

/// An endpoint (magic `MEPT`, version 1) with a payload fitting, or not, its transport.
fn endpoint_bytes() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![0u8..=10, any::<u8>()],
        prop_oneof![
            Just((0u8, -1i32)),
            (Just(1u8), 0i32..8),
            (any::<u8>(), any::<i32>())
        ],
        (any::<u64>(), any::<u64>()),
        prop_oneof![Just(-1i32), 1i32..4096, any::<i32>()],
        any::<u64>(),
        prop_oneof![
            Just(Vec::new()),
            ethernet_payload(),
            ib_payload(),
            proptest::collection::vec(any::<u8>(), 0..64),
        ],
        damage(),
    )
        .prop_map(|(t, (kind, id), (host, pid), q, ep_id, payload, d)| {
            let mut body = vec![t, kind];
            body.extend_from_slice(&id.to_le_bytes());
            body.extend_from_slice(&host.to_le_bytes());
            body.extend_from_slice(&pid.to_le_bytes());
            body.extend_from_slice(&q.to_le_bytes());
            body.extend_from_slice(&ep_id.to_le_bytes());
            blob(&mut body, &payload);
            apply(envelope(b"MEPT", 1, &body), &d)
        })
}

/// Memory registered by this process (CudaIpc and Ethernet), serialized: the real CudaIpc
/// export blob of this process, so same-process lookups and same-host imports are reached.
fn real_memory() -> &'static (LocalMemory, RegisteredMemory, Vec<u8>) {
    static MEM: OnceLock<(LocalMemory, RegisteredMemory, Vec<u8>)> = OnceLock::new();
    MEM.get_or_init(|| {
        let ctx = Context::new().expect("context");
        let mem = LocalMemory::alloc(Device::CPU, 1 << 16).expect("alloc");
        let reg = ctx
            .register_memory(
                mem.ptr() + 4096,
                8192,
                Transport::CudaIpc | Transport::Ethernet,
            )
            .expect("register");
        let bytes = reg.serialize();
        (mem, reg, bytes)
    })
}

/// A registered memory (magic `MREG`, version 1): fields drawn freely, infos that may be
/// this process's real CudaIpc export, an IB key blob or junk.
fn memory_bytes() -> impl Strategy<Value = Vec<u8>> {
    (
        (any::<u64>(), prop_oneof![1u64..1 << 20, any::<u64>()]),
        prop_oneof![Just(0b110_0000_0010u32), 0u32..0x800, any::<u32>()],
        prop_oneof![
            Just((0u8, -1i32)),
            (Just(1u8), 0i32..8),
            (any::<u8>(), any::<i32>())
        ],
        (any::<u64>(), any::<u64>()),
        proptest::collection::vec(
            (
                prop_oneof![Just(1u8), 2u8..=10, any::<u8>()],
                prop_oneof![
                    Just(None),
                    proptest::collection::vec(any::<u8>(), 0..40).prop_map(Some)
                ],
            ),
            0..3,
        ),
        damage(),
    )
        .prop_map(
            |((ptr, size), transports, (kind, id), (host, pid), infos, d)| {
                let real = &real_memory().2;
                let mut body = Vec::new();
                body.extend_from_slice(&ptr.to_le_bytes());
                body.extend_from_slice(&size.to_le_bytes());
                body.extend_from_slice(&transports.to_le_bytes());
                body.push(kind);
                body.extend_from_slice(&id.to_le_bytes());
                body.extend_from_slice(&host.to_le_bytes());
                body.extend_from_slice(&pid.to_le_bytes());
                body.push(infos.len() as u8);
                for (t, b) in infos {
                    body.push(t);
                    // None: the CudaIpc info blob of the real registration (after its fixed
                    // fields: 8 ptr + 8 size + 4 transports + 1 + 4 + 8 + 8 + 1 count + 1 t).
                    let from_real = real.get(10 + 43..).and_then(|r| {
                        let n = u32::from_le_bytes(r.get(..4)?.try_into().ok()?) as usize;
                        r.get(4..4 + n).map(<[u8]>::to_vec)
                    });
                    blob(&mut body, &b.or(from_real).unwrap_or_default());
                }
                apply(envelope(b"MREG", 1, &body), &d)
            },
        )
}

/// The real registration, damaged.
fn damaged_real_memory() -> impl Strategy<Value = Vec<u8>> {
    damage().prop_map(|d| apply(real_memory().2.clone(), &d))
}

/// A blob `deserialize` accepts round-trips through `serialize` and passes `valid`; one it
/// refuses gets an error that `check_error` accepts for `what`.
fn check_blob<T>(
    what: &str,
    bytes: &[u8],
    deserialize: impl Fn(&[u8]) -> mscclpp::Result<T>,
    serialize: impl Fn(&T) -> Vec<u8>,
    valid: impl Fn(&T) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    match deserialize(bytes) {
        Ok(v) => {
            prop_assert_eq!(
                serialize(&v),
                bytes.to_vec(),
                "accepted {} must round-trip",
                what
            );
            valid(&v)?;
        }
        Err(e) => check_error(what, bytes, &e)?,
    }
    Ok(())
}

fn check_endpoint(bytes: &[u8]) -> Result<(), TestCaseError> {
    check_blob(
        "endpoint",
        bytes,
        Endpoint::deserialize,
        Endpoint::serialize,
        |ep| {
            prop_assert!(ep.transport() != Transport::Unknown);
            Ok(())
        },
    )
}

fn check_memory(bytes: &[u8]) -> Result<(), TestCaseError> {
    let valid = |m: &RegisteredMemory| {
        prop_assert!(m.size() > 0);
        prop_assert!(m.original_data_ptr().checked_add(m.size() as u64).is_some());
        Ok(())
    };
    check_blob(
        "registered memory",
        bytes,
        RegisteredMemory::deserialize,
        RegisteredMemory::serialize,
        valid,
    )
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn endpoint_from_structured_bytes(bytes in endpoint_bytes()) {
        check_endpoint(&bytes)?;
    }

    #[test]
    fn endpoint_from_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
        check_endpoint(&bytes)?;
    }

    #[test]
    fn registered_memory_from_structured_bytes(bytes in memory_bytes()) {
        check_memory(&bytes)?;
    }

    #[test]
    fn registered_memory_from_damaged_real_bytes(bytes in damaged_real_memory()) {
        check_memory(&bytes)?;
    }
}

#[test]
fn the_real_memory_blob_round_trips() {
    // The seed the damaged cases start from is itself accepted (else they fuzz nothing).
    let (_, reg, bytes) = real_memory();
    let back = RegisteredMemory::deserialize(bytes).expect("own blob");
    assert_eq!(back.data(), reg.data());
    assert_eq!(&back.serialize(), bytes);
}
