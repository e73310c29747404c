//! Context and connections inside one process: CudaIpc to self, Ethernet loopback between
//! two endpoints, host semaphores, and out-of-bounds writes rejected.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use mscclpp::{
    Connection, Context, Device, Host2HostSemaphore, LocalMemory, RegisteredMemory, Semaphore,
    SemaphoreStub, Transport,
};

#[path = "common/loopback.rs"]
mod loopback;
#[path = "common/rng.rs"]
mod rng;

use rng::Rng;

const T: Duration = Duration::from_secs(20);

/// `n` deterministic random bytes from `seed`.
fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    Rng(seed | 1).bytes(n)
}

/// Writes random data through `conn` into a remote view of `dst` and checks every byte.
fn write_and_verify(ctx: &Context, conn: &Connection, t: Transport) {
    let n = 3 * 1024 * 1024 + 123; // crosses the Ethernet chunk size
    let src = LocalMemory::alloc(Device::CPU, n).unwrap();
    let dst = LocalMemory::alloc(Device::CPU, n + 64).unwrap();
    let src_reg = ctx.register_buffer(&src, t.into()).unwrap();
    let dst_reg = ctx.register_buffer(&dst, t.into()).unwrap();
    // What the peer would receive.
    let dst_view = RegisteredMemory::deserialize(&dst_reg.serialize()).unwrap();
    for round in 0..3u64 {
        let data = random_bytes(n, 0xabc + round);
        src.write(0, &data).unwrap();
        conn.write(&dst_view, 64, &src_reg, 0, n as u64).unwrap();
        conn.flush(T).unwrap();
        let mut got = vec![0u8; n];
        dst.read(64, &mut got).unwrap();
        let first_bad = got.iter().zip(&data).position(|(a, b)| a != b);
        assert_eq!(first_bad, None, "round {round}: first differing byte");
    }
    // Partial write at an offset of the source.
    let data = random_bytes(n, 99);
    src.write(0, &data).unwrap();
    conn.write(&dst_view, 0, &src_reg, 1000, 5000).unwrap();
    conn.flush(T).unwrap();
    let mut got = vec![0u8; 5000];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, data[1000..6000]);

    // Out of bounds: errors, nothing written.
    let before = dst.to_vec().unwrap();
    assert!(conn.write(&dst_view, 65, &src_reg, 0, n as u64).is_err());
    assert!(conn.write(&dst_view, 0, &src_reg, 1, n as u64).is_err());
    assert!(conn.write(&dst_view, u64::MAX, &src_reg, 0, 2).is_err());
    let counter = AtomicU64::new(0);
    assert!(conn
        .update_and_sync(&dst_view, (n + 60) as u64, &counter, 1)
        .is_err());
    assert!(
        conn.update_and_sync(&dst_view, 4, &counter, 1).is_err(),
        "misaligned"
    );
    conn.flush(T).unwrap();
    assert_eq!(dst.to_vec().unwrap(), before);

    // update_and_sync stores the value on both sides.
    conn.update_and_sync(&dst_view, 8, &counter, 0x1122_3344_5566_7788)
        .unwrap();
    conn.flush(T).unwrap();
    assert_eq!(dst.read_u64(8).unwrap(), 0x1122_3344_5566_7788);
    assert_eq!(
        counter.load(std::sync::atomic::Ordering::Relaxed),
        0x1122_3344_5566_7788
    );
}

#[test]
fn ipc_to_self_writes_every_byte() {
    let ctx = Context::new().unwrap();
    let (ab, _ba) = loopback::pair(&ctx, Transport::CudaIpc);
    assert_eq!(ab.transport(), Transport::CudaIpc);
    assert_eq!(ab.remote_transport(), Transport::CudaIpc);
    assert_eq!(ab.local_device(), Device::CPU);
    write_and_verify(&ctx, &ab, Transport::CudaIpc);
}

#[test]
fn ethernet_loopback_writes_every_byte() {
    let ctx = Context::new().unwrap();
    let (ab, ba) = loopback::pair(&ctx, Transport::Ethernet);
    assert_eq!(ab.transport(), Transport::Ethernet);
    write_and_verify(&ctx, &ab, Transport::Ethernet);
    write_and_verify(&ctx, &ba, Transport::Ethernet);
}

#[test]
fn ethernet_write_to_unregistered_memory_is_reported() {
    let ctx = Context::new().unwrap();
    let (ab, ba) = loopback::pair(&ctx, Transport::Ethernet);
    let src = LocalMemory::alloc(Device::CPU, 4096).unwrap();
    let src_reg = ctx
        .register_buffer(&src, Transport::Ethernet.into())
        .unwrap();
    let dst = LocalMemory::alloc(Device::CPU, 4096).unwrap();
    let dst_reg = ctx
        .register_buffer(&dst, Transport::Ethernet.into())
        .unwrap();
    let dst_wire = dst_reg.serialize();
    // A view whose registration is gone in this process (the receiver's registry is empty
    // for that range once the registration dropped): fake a remote-only view by mutating
    // the pid hash so it decodes as another process's memory.
    let mut bytes = dst_wire.clone();
    // header 10 + ptr 8 + size 8 + transports 4 + kind 1 + id 4 + host 8 => pid hash at 43.
    bytes[43] ^= 0xff;
    let view = RegisteredMemory::deserialize(&bytes).unwrap();
    assert_eq!(
        view.data(),
        0,
        "another process's memory over Ethernet is remote-only"
    );
    // While the registration lives, the write lands.
    src.write(0, &[7u8; 4096]).unwrap();
    ab.write(&view, 0, &src_reg, 0, 4096).unwrap();
    ab.flush(T).unwrap();
    assert_eq!(dst.to_vec().unwrap(), vec![7u8; 4096]);
    // Drop every registration of dst: the receiver must refuse and both sides report it.
    drop(dst_reg);
    let dst_copy = dst.clone();
    drop(dst);
    src.write(0, &[9u8; 4096]).unwrap();
    ab.write(&view, 0, &src_reg, 0, 4096).unwrap();
    let e = ab.flush(T).unwrap_err().to_string();
    assert!(e.contains("rejected"), "{e}");
    assert_eq!(
        dst_copy.to_vec().unwrap(),
        vec![7u8; 4096],
        "nothing written"
    );
    // The receiving side reports it on its next operation.
    let e = ba.flush(T).unwrap_err().to_string();
    assert!(e.contains("rejected incoming write"), "{e}");
    // Reported once; the connection keeps working.
    ab.flush(T).unwrap();
}

#[test]
fn ethernet_peer_gone_is_an_error_not_a_hang() {
    let ctx = Context::new().unwrap();
    let (ab, ba) = loopback::pair(&ctx, Transport::Ethernet);
    drop(ba);
    let src = LocalMemory::alloc(Device::CPU, 4096).unwrap();
    let src_reg = ctx
        .register_buffer(&src, Transport::Ethernet.into())
        .unwrap();
    let view_wire = src_reg.serialize();
    let view = RegisteredMemory::deserialize(&view_wire).unwrap();
    let start = std::time::Instant::now();
    let mut failed = false;
    for _ in 0..100 {
        if ab.write(&view, 0, &src_reg, 0, 4096).is_err() || ab.flush(T).is_err() {
            failed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(failed, "writes to a closed peer kept succeeding");
    assert!(start.elapsed() < T);
}

#[test]
fn connecting_different_transports_names_both() {
    let ctx = Context::new().unwrap();
    let a = ctx.create_endpoint(Transport::CudaIpc.into()).unwrap();
    let b = ctx.create_endpoint(Transport::Ethernet.into()).unwrap();
    let remote = mscclpp::Endpoint::deserialize(&b.serialize()).unwrap();
    let e = ctx.connect(&a, &remote).unwrap_err().to_string();
    assert!(e.contains("CudaIpc") && e.contains("Ethernet"), "{e}");
}

#[test]
fn host_semaphores_over_both_transports() {
    for t in [Transport::CudaIpc, Transport::Ethernet] {
        let ctx = Context::new().unwrap();
        let (ab, ba) = loopback::pair(&ctx, t);
        let sa = SemaphoreStub::new(&ctx, &ab).unwrap();
        let sb = SemaphoreStub::new(&ctx, &ba).unwrap();
        let ra = RegisteredMemory::deserialize(&sa.memory().serialize()).unwrap();
        let rb = RegisteredMemory::deserialize(&sb.memory().serialize()).unwrap();
        let a = Host2HostSemaphore::new(Semaphore::new(sa, rb, ab).unwrap()).unwrap();
        let b = Host2HostSemaphore::new(Semaphore::new(sb, ra, ba).unwrap()).unwrap();
        assert!(!b.poll());
        let e = b.wait(Duration::from_millis(50)).unwrap_err();
        assert_eq!(e.code(), mscclpp::ErrorCode::Timeout);
        assert!(e.to_string().contains("Host2HostSemaphore"), "{e}");
        for _ in 0..5 {
            a.signal().unwrap();
            b.wait(T).unwrap();
            b.signal().unwrap();
            a.wait(T).unwrap();
        }
        a.signal().unwrap();
        a.signal().unwrap();
        b.wait(T).unwrap();
        b.wait(T).unwrap();
        assert!(!b.poll());
    }
}
