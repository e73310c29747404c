//! 02: register memory, create two Ethernet endpoints in one process, connect them, write and
//! signal. Run with `cargo run -p mscclpp --example 02-connection`.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use mscclpp::{Context, Device, Endpoint, LocalMemory, RegisteredMemory, Transport};

fn main() -> mscclpp::Result<()> {
    let ctx = Context::new()?;
    let a = ctx.create_endpoint(Transport::Ethernet.into())?;
    let b = ctx.create_endpoint(Transport::Ethernet.into())?;
    // Each side would normally receive the other's endpoint over the bootstrap.
    let (a_bytes, b_bytes) = (a.serialize(), b.serialize());
    let ctx_b = ctx.clone();
    let other = std::thread::spawn(move || {
        let remote_a = Endpoint::deserialize(&a_bytes)?;
        ctx_b.connect(&b, &remote_a)
    });
    let conn = ctx.connect(&a, &Endpoint::deserialize(&b_bytes)?)?;
    let _conn_b = other
        .join()
        .map_err(|_| mscclpp::Error::Internal("connect thread panicked".into()))??;

    let src = LocalMemory::alloc(Device::CPU, 4096)?;
    let dst = LocalMemory::alloc(Device::CPU, 4096)?;
    src.write(0, b"hello over Ethernet")?;
    let src_reg = ctx.register_buffer(&src, Transport::Ethernet.into())?;
    let dst_reg = ctx.register_buffer(&dst, Transport::Ethernet.into())?;
    // What a peer would see: the memory addressed by its original pointer.
    let dst_view = RegisteredMemory::deserialize(&dst_reg.serialize())?;
    conn.write(&dst_view, 0, &src_reg, 0, 19)?;
    let counter = AtomicU64::new(0);
    conn.update_and_sync(&dst_view, 64, &counter, 1)?;
    conn.flush(Duration::from_secs(10))?;
    let mut got = [0u8; 19];
    dst.read(0, &mut got)?;
    let flag = dst.read_u64(64)?;
    println!(
        "received {:?}, flag = {flag}",
        String::from_utf8_lossy(&got)
    );
    if &got != b"hello over Ethernet" || flag != 1 {
        return Err(mscclpp::Error::Internal(format!(
            "expected \"hello over Ethernet\" and flag 1, got {got:?} and {flag}"
        )));
    }
    Ok(())
}
