//! Endpoint and RegisteredMemory wire formats: round trips, and thousands of random
//! mutations, truncations and extensions that must give errors (or valid values), never a
//! panic.

use mscclpp::{
    Context, Device, Endpoint, EndpointConfig, LocalMemory, RegisteredMemory, Transport,
    TransportFlags,
};

#[path = "common/rng.rs"]
mod rng;

use rng::Rng;

#[test]
fn endpoint_round_trips() {
    let ctx = Context::new().unwrap();
    for t in [Transport::CudaIpc, Transport::Ethernet] {
        let mut cfg = EndpointConfig::new(t, Device::CPU);
        cfg.max_write_queue_size = 77;
        let ep = ctx.create_endpoint(cfg).unwrap();
        let back = Endpoint::deserialize(&ep.serialize()).unwrap();
        assert_eq!(back.transport(), t);
        assert_eq!(back.device(), Device::CPU);
        assert_eq!(back.host_hash(), ep.host_hash());
        assert_eq!(back.pid_hash(), ep.pid_hash());
        assert_eq!(back.max_write_queue_size(), 77);
        assert_eq!(back.transport_payload(), ep.transport_payload());
        assert!(!back.is_local());
        assert_eq!(back.serialize(), ep.serialize());
        if t == Transport::Ethernet {
            assert_eq!(
                back.ethernet_address().unwrap(),
                ep.ethernet_address().unwrap()
            );
            assert_ne!(back.ethernet_address().unwrap().port(), 0);
        }
    }
}

#[test]
fn unbuilt_and_unknown_transports_are_errors() {
    let ctx = Context::new().unwrap();
    // Without an IB device, an IB endpoint is an error naming the transport.
    if mscclpp::ib::ib_unavailable_reason().is_some() {
        let e = ctx
            .create_endpoint(Transport::Ib0.into())
            .unwrap_err()
            .to_string();
        assert!(e.contains("IB0"), "{e}");
    }
    assert!(ctx.create_endpoint(Transport::Unknown.into()).is_err());
}

#[test]
fn registered_memory_round_trips_in_process() {
    let ctx = Context::new().unwrap();
    let mem = LocalMemory::alloc(Device::CPU, 8192).unwrap();
    let reg = ctx
        .register_memory(
            mem.ptr() + 64,
            4096,
            Transport::CudaIpc | Transport::Ethernet,
        )
        .unwrap();
    assert_eq!(reg.data(), mem.ptr() + 64);
    let back = RegisteredMemory::deserialize(&reg.serialize()).unwrap();
    assert_eq!(back.data(), reg.data());
    assert_eq!(back.original_data_ptr(), reg.original_data_ptr());
    assert_eq!(back.size(), 4096);
    assert_eq!(back.transports(), reg.transports());
    assert!(back.is_local());
    assert_eq!(back.serialize(), reg.serialize());
    // Not inside a live allocation.
    assert!(ctx
        .register_memory(mem.ptr() + 8000, 4096, Transport::Ethernet.into())
        .is_err());
    assert!(ctx.register_memory(8, 8, TransportFlags::NONE).is_err());
}

#[test]
fn memory_of_a_freed_allocation_is_rejected() {
    let ctx = Context::new().unwrap();
    let mem = LocalMemory::alloc(Device::CPU, 4096).unwrap();
    let bytes = ctx
        .register_buffer(&mem, Transport::Ethernet.into())
        .unwrap()
        .serialize();
    drop(mem);
    let e = RegisteredMemory::deserialize(&bytes)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no longer live"), "{e}");
}

fn fuzz<T>(
    valid: &[u8],
    seed: u64,
    decode: impl Fn(&[u8]) -> mscclpp::Result<T>,
) -> (usize, usize) {
    let mut rng = Rng(seed);
    let (mut errors, mut accepted) = (0, 0);
    // Every truncation and a few extensions.
    for len in 0..valid.len() {
        assert!(
            decode(&valid[..len]).is_err(),
            "prefix of {len} bytes decoded"
        );
    }
    for extra in 1..64 {
        let mut b = valid.to_vec();
        b.extend((0..extra).map(|_| rng.next() as u8));
        assert!(decode(&b).is_err(), "{extra} trailing bytes accepted");
    }
    let mut wrong_version = valid.to_vec();
    wrong_version[4] ^= 0x7;
    assert!(decode(&wrong_version).is_err());
    for _ in 0..5000 {
        let mut b = valid.to_vec();
        match rng.below(4) {
            0 => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 => {
                for _ in 0..1 + rng.below(8) {
                    let i = rng.below(b.len());
                    b[i] = rng.next() as u8;
                }
            }
            2 => {
                let cut = rng.below(b.len());
                b.truncate(cut);
            }
            _ => {
                let i = rng.below(b.len());
                let n = 1 + rng.below(16);
                for _ in 0..n {
                    b.insert(i, rng.next() as u8);
                }
            }
        }
        match decode(&b) {
            Ok(_) => accepted += 1,
            Err(_) => errors += 1,
        }
    }
    (errors, accepted)
}

#[test]
fn fuzzed_endpoints_never_panic() {
    let ctx = Context::new().unwrap();
    for (i, t) in [Transport::CudaIpc, Transport::Ethernet]
        .into_iter()
        .enumerate()
    {
        let ep = ctx.create_endpoint(t.into()).unwrap();
        let (errors, _) = fuzz(
            &ep.serialize(),
            0x9e37_79b9 + i as u64,
            Endpoint::deserialize,
        );
        assert!(errors > 1000, "only {errors} mutations were rejected");
    }
}

#[test]
fn fuzzed_memories_never_panic() {
    let ctx = Context::new().unwrap();
    let mem = LocalMemory::alloc(Device::CPU, 4096).unwrap();
    for (i, flags) in [
        TransportFlags::from(Transport::Ethernet),
        Transport::CudaIpc | Transport::Ethernet,
    ]
    .into_iter()
    .enumerate()
    {
        let reg = ctx.register_buffer(&mem, flags).unwrap();
        let (errors, _) = fuzz(
            &reg.serialize(),
            0x1234_5678 + i as u64,
            RegisteredMemory::deserialize,
        );
        assert!(errors > 1000, "only {errors} mutations were rejected");
    }
}
