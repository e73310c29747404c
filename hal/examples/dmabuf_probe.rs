//! dma-buf and GDRCopy probe for a GPU machine: exports a cuMemAlloc (`MemoryKind::Device`)
//! and a cuMem VMM (`MemoryKind::Physical`) allocation of GPU 0 as dma-buf fds and prints the
//! result (or the driver's reason), then the GDRCopy status, and with GDRCopy ok maps a token
//! of the cuMemAlloc allocation, stores through the mapping and reads the value back with the
//! driver.
//!
//! `cargo run --release --features cuda -p mscclpp-hal --example dmabuf_probe`
//! Exit status 0 when every step either worked or reported why it cannot; 1 when a step that
//! reported success gave a wrong result.

use mscclpp_hal::gdr::{Gdr, GdrStatus};
use mscclpp_hal::{prelude::*, Gpu, MemoryKind};

fn main() {
    println!("backend: {}", Gpu::NAME);
    let dev = match Gpu::open_device(0) {
        Ok(d) => d,
        Err(e) => {
            println!("no GPU 0: {e}");
            return;
        }
    };
    let size = 4 << 20;
    let mut bad = false;
    let mut linear = None;
    for (name, kind) in [
        ("cuMemAlloc (Device)", MemoryKind::Device),
        (
            "cuMem VMM (Physical)",
            MemoryKind::Physical { granularity: 0 },
        ),
    ] {
        let mem = match Gpu::alloc(&dev, size, kind) {
            Ok(m) => m,
            Err(e) => {
                println!("dma-buf {name}: allocation failed: {e}");
                continue;
            }
        };
        for (off, len) in [(0usize, size), (12_345, 100_000)] {
            match Gpu::export_dmabuf(&mem, off, len) {
                Ok(b) => {
                    use std::os::fd::AsRawFd;
                    let ok = b.offset < 4096 && b.len == len && b.fd.as_raw_fd() >= 0;
                    bad |= !ok;
                    println!(
                        "dma-buf {name} [+{off}, {len} bytes]: OK fd {} offset {} ({})",
                        b.fd.as_raw_fd(),
                        b.offset,
                        if ok { "as expected" } else { "UNEXPECTED" }
                    );
                }
                Err(e) => println!("dma-buf {name} [+{off}, {len} bytes]: not exported: {e}"),
            }
        }
        if kind == MemoryKind::Device {
            linear = Some(mem);
        }
    }
    let probe = Gdr::probe();
    println!(
        "GDRCopy status: {} ({})",
        probe.status.name(),
        probe.message
    );
    if let (GdrStatus::Ok, Some(g), Some(mem)) = (probe.status, probe.gdr.as_ref(), linear.as_ref())
    {
        let addr = mem.device_ptr() + 4096;
        // SAFETY: addr..addr+8 lies inside the live allocation `mem`, dropped after the mapping.
        match unsafe { g.map(addr, 8) } {
            Ok(m) => {
                let v = 0x1234_5678_9abc_def0u64;
                let stored = m.store_u64(0, v);
                let mut back = [0u8; 8];
                let read = Gpu::read(&dev, mem, 4096, &mut back);
                let got = u64::from_le_bytes(back);
                let ok = stored.is_ok() && read.is_ok() && got == v;
                bad |= !ok;
                println!(
                    "GDRCopy store through a mapping, read back by the driver: {got:#x} ({})",
                    if ok { "OK" } else { "MISMATCH" }
                );
            }
            Err(e) => println!("GDRCopy map failed: {e}"),
        }
    }
    std::process::exit(i32::from(bad));
}
