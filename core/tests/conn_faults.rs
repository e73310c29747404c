//! Connection faults inside one process: stale registration handles, an Ethernet peer that is
//! gone before or during the handshake, a wait behind a closed peer, and failed proxy requests
//! made visible. (The same faults between processes: `conn_faults_mp.rs`.)

use std::time::{Duration, Instant};

use mscclpp::semaphore::{Host2HostSemaphore, Semaphore, SemaphoreStub};
use mscclpp::{Connection, Context, Device, Endpoint, LocalMemory, RegisteredMemory, Transport};

#[path = "common/loopback.rs"]
mod loopback;

const T: Duration = Duration::from_secs(10);

/// What another process on this host would receive for `reg` (the pid hash changed, so it
/// decodes as a remote-only view over Ethernet).
fn foreign_view(reg: &RegisteredMemory) -> RegisteredMemory {
    let mut bytes = reg.serialize();
    // header 10 + ptr 8 + size 8 + transports 4 + kind 1 + id 4 + host 8 => pid hash at 43.
    bytes[43] ^= 0xff;
    RegisteredMemory::deserialize(&bytes).unwrap()
}

/// A context and two Ethernet endpoints of it.
fn ethernet_endpoints() -> (Context, Endpoint, Endpoint) {
    let ctx = Context::new().unwrap();
    let a = ctx.create_endpoint(Transport::Ethernet.into()).unwrap();
    let b = ctx.create_endpoint(Transport::Ethernet.into()).unwrap();
    (ctx, a, b)
}

#[test]
fn ethernet_write_through_a_stale_handle_is_refused() {
    let ctx = Context::new().unwrap();
    let (ab, ba) = loopback::pair(&ctx, Transport::Ethernet);
    let n = 1 << 20;
    let src = LocalMemory::alloc(Device::CPU, n).unwrap();
    let src_reg = ctx
        .register_buffer(&src, Transport::Ethernet.into())
        .unwrap();
    let dst = LocalMemory::alloc(Device::CPU, n).unwrap();
    let old = ctx
        .register_buffer(&dst, Transport::Ethernet.into())
        .unwrap();
    let view = foreign_view(&old);
    src.write(0, &vec![1u8; n]).unwrap();
    ab.write(&view, 0, &src_reg, 0, n as u64).unwrap();
    ab.flush(T).unwrap();
    assert!(dst.to_vec().unwrap().iter().all(|&b| b == 1));
    // The owner drops the registration and registers the same address again.
    drop(old);
    let new = ctx
        .register_buffer(&dst, Transport::Ethernet.into())
        .unwrap();
    dst.write(0, &vec![2u8; n]).unwrap();
    src.write(0, &vec![3u8; n]).unwrap();
    let r = ab
        .write(&view, 0, &src_reg, 0, n as u64)
        .and_then(|()| ab.flush(T));
    let overwritten = dst.to_vec().unwrap().iter().filter(|&&b| b == 3).count();
    println!(
        "MEASURE stale write: {r:?}; bytes of the new registration overwritten: {overwritten}"
    );
    assert_eq!(
        overwritten, 0,
        "the stale handle wrote into the new registration"
    );
    let e = r.expect_err("the writer's flush reports the refused write");
    assert!(e.to_string().contains("stale"), "{e}");
    let e = ba.flush(T).expect_err("the receiver reports it too");
    assert!(e.to_string().contains("rejected incoming write"), "{e}");
    // The new handle works; the connection is not broken by a refused write.
    ab.write(&foreign_view(&new), 0, &src_reg, 0, n as u64)
        .unwrap();
    ab.flush(T).unwrap();
    assert!(dst.to_vec().unwrap().iter().all(|&b| b == 3));
}

#[test]
fn stale_handle_deserialized_by_its_owner_is_refused() {
    let ctx = Context::new().unwrap();
    let mem = LocalMemory::alloc(Device::CPU, 4096).unwrap();
    let flags = Transport::CudaIpc | Transport::Ethernet;
    let old = ctx.register_buffer(&mem, flags).unwrap();
    let wire = old.serialize();
    let live = RegisteredMemory::deserialize(&wire).expect("a live handle");
    assert_eq!(live.data(), mem.ptr());
    drop((old, live));
    let _new = ctx.register_buffer(&mem, flags).unwrap();
    let r = RegisteredMemory::deserialize(&wire).map(|m| m.data());
    println!("MEASURE owner deserializes a stale handle: {r:?}");
    let e = r.expect_err("a stale handle names no live registration");
    assert!(e.to_string().contains("stale"), "{e}");
}

#[test]
fn ethernet_connect_to_a_gone_endpoint_fails_at_once() {
    let (ctx, a, b) = ethernet_endpoints();
    ctx.set_connect_timeout(Duration::from_secs(10));
    let b_wire = b.serialize();
    drop(b); // its listener closes: the peer "exited"
    let start = Instant::now();
    let r = ctx.connect(&a, &Endpoint::deserialize(&b_wire).unwrap());
    let took = start.elapsed();
    println!(
        "MEASURE connect to a gone endpoint: {:.3} s, {:?}",
        took.as_secs_f64(),
        r.as_ref().map(|_| ())
    );
    let e = r.expect_err("nobody listens there");
    assert!(took < Duration::from_secs(2), "took {took:?}: {e}");
}

#[test]
fn ethernet_sides_agree_on_a_failed_handshake() {
    // Side A gives up (short timeout) before B starts; B must not end up "connected" to it.
    let (ctx, a, b) = ethernet_endpoints();
    let (a_wire, b_wire) = (a.serialize(), b.serialize());
    ctx.set_connect_timeout(Duration::from_millis(300));
    let ra = ctx.connect(&a, &Endpoint::deserialize(&b_wire).unwrap());
    assert!(ra.is_err(), "A times out: B never connected");
    ctx.set_connect_timeout(Duration::from_secs(5));
    let start = Instant::now();
    let rb = ctx.connect(&b, &Endpoint::deserialize(&a_wire).unwrap());
    println!(
        "MEASURE late side of a failed handshake: {:.3} s, {:?}",
        start.elapsed().as_secs_f64(),
        rb.as_ref().map(|_| ())
    );
    assert!(
        rb.is_err(),
        "B must fail too: A already gave up (half-connected otherwise)"
    );
}

fn host_semaphores(
    ctx: &Context,
    ab: &Connection,
    ba: &Connection,
) -> (Host2HostSemaphore, Host2HostSemaphore) {
    let sa = SemaphoreStub::new(ctx, ab).unwrap();
    let sb = SemaphoreStub::new(ctx, ba).unwrap();
    let (ma, mb) = (sa.memory().clone(), sb.memory().clone());
    (
        Host2HostSemaphore::new(Semaphore::new(sa, mb, ab.clone()).unwrap()).unwrap(),
        Host2HostSemaphore::new(Semaphore::new(sb, ma, ba.clone()).unwrap()).unwrap(),
    )
}

#[test]
fn host_wait_ends_when_the_ethernet_peer_closed() {
    let ctx = Context::new().unwrap();
    let (ab, ba) = loopback::pair(&ctx, Transport::Ethernet);
    let (a, b) = host_semaphores(&ctx, &ab, &ba);
    b.signal().unwrap();
    a.wait(T).unwrap();
    drop(b);
    drop(ba); // the peer's sockets close: a's connection sees EOF
    let start = Instant::now();
    let r = a.wait(T);
    let took = start.elapsed();
    println!(
        "MEASURE wait after the peer closed: {:.3} s, {r:?}",
        took.as_secs_f64()
    );
    let e = r.expect_err("no signal can come");
    assert!(took < Duration::from_secs(2), "waited {took:?}: {e}");
}

#[test]
fn failed_proxy_requests_are_counted() {
    let ctx = Context::new().unwrap();
    let (ab, ba) = loopback::pair(&ctx, Transport::CudaIpc);
    let sa = SemaphoreStub::new(&ctx, &ab).unwrap();
    let sb = SemaphoreStub::new(&ctx, &ba).unwrap();
    let sem = Semaphore::new(sa, sb.memory().clone(), ab.clone()).unwrap();
    let (mut proxy, ch, m, _mem) = loopback::started_proxy(&ctx, sem);
    // SAFETY: the proxy outlives the calls.
    unsafe {
        ch.put(m, 0, m, 0, 32, T).unwrap();
        ch.flush(T).expect("good requests flush cleanly");
        // Memory 9 was never added: the request fails, and its own flush says so.
        let r = ch.put_with_signal_and_flush(9, 0, m, 0, 8, T);
        println!("MEASURE device flush after a failed request: {r:?}");
        assert!(r.is_err(), "the device must see that its request failed");
        assert_eq!(ch.fifo.failed_triggers(), 1, "the device-readable count");
    }
    assert_eq!(proxy.failed_requests(), 1);
    let e = proxy.stop_proxy().expect_err("the host API reports it too");
    assert!(e.to_string().contains("memory 9"), "{e}");
}

#[test]
fn a_broken_connection_fails_fast_naming_the_rank() {
    let (ctx, a, b) = ethernet_endpoints();
    let (a_wire, b_wire) = (a.serialize(), b.serialize());
    let ctx2 = ctx.clone();
    let h = std::thread::spawn(move || {
        let ra = Endpoint::deserialize(&a_wire).unwrap();
        ctx2.connect_to(&b, &ra, Some(4), T).unwrap()
    });
    let ab = ctx
        .connect_to(&a, &Endpoint::deserialize(&b_wire).unwrap(), Some(3), T)
        .unwrap();
    let ba = h.join().unwrap();
    assert_eq!(ab.remote_rank(), Some(3));
    assert!(ab.health().is_ok());
    drop(ba);
    let start = Instant::now();
    while ab.health().is_ok() {
        assert!(start.elapsed() < T, "the closed peer was never noticed");
        std::thread::sleep(Duration::from_millis(1));
    }
    let e = ab.health().unwrap_err();
    assert_eq!(e.code(), mscclpp::ErrorCode::RemoteError, "{e}");
    assert!(e.to_string().contains("rank 3"), "{e}");
    assert!(ab.broken().is_some());
    let mem = LocalMemory::alloc(Device::CPU, 64).unwrap();
    let reg = ctx
        .register_buffer(&mem, Transport::Ethernet.into())
        .unwrap();
    let t0 = Instant::now();
    let e = ab.flush(T).unwrap_err();
    assert!(t0.elapsed() < Duration::from_millis(100), "fails at once");
    assert!(
        e.to_string().contains("rank 3") && e.to_string().contains("broken"),
        "{e}"
    );
    let e = ab.write(&foreign_view(&reg), 0, &reg, 0, 8).unwrap_err();
    assert!(e.to_string().contains("rank 3"), "{e}");
    // Bad arguments stay invalid usage, not "broken".
    let e = ab.write(&foreign_view(&reg), 60, &reg, 0, 8).unwrap_err();
    assert_eq!(e.code(), mscclpp::ErrorCode::InvalidUsage, "{e}");
}

/// The end of a collective: the peer sees our last signal, closes at once, and our flush of
/// that signal must still succeed (its ack is sent before the peer's receive side closes; a
/// flush only needs every frame acked). Repeated: the close races with the ack.
#[test]
fn ethernet_flush_succeeds_when_the_peer_closes_right_after_our_last_signal() {
    let ctx = Context::new().unwrap();
    for round in 0..40 {
        let (ab, ba) = loopback::pair(&ctx, Transport::Ethernet);
        let (a, b) = host_semaphores(&ctx, &ab, &ba);
        a.signal().unwrap();
        b.wait(T).unwrap();
        drop(b);
        drop(ba);
        let r = ab.flush(T);
        assert!(r.is_ok(), "round {round}: {r:?}");
        // The connection is gone for anything new.
        let start = Instant::now();
        while ab.health().is_ok() {
            assert!(
                start.elapsed() < T,
                "round {round}: the closed peer was never noticed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            a.signal().is_err(),
            "round {round}: a signal to a closed peer"
        );
    }
}
