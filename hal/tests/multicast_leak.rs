//! Leak test of the multicast lifecycle (the seed's fix: the creator's handle is released right
//! after export): 1000 cycles of create, export, import, add device, allocate, bind, map, a
//! load-reduce through the members, then destroy everything; afterwards every multicast handle,
//! export, binding and mapping ([`mscclpp_hal::multicast_counts`]), every fd (`/proc/self/fd`)
//! and every mapping (`/proc/self/maps`) is back to where it was after the first cycle.
//!
//! The host emulation runs everywhere. The same cycle is compiled for CUDA and runs only where
//! NVLS is usable; while `MSCCLPP_FORCE_DISABLE_NVLS=1` / `NCCL_NVLS_ENABLE=0` disables it (always
//! on the lent machines) it prints why it skips and makes no multicast call. One test function
//! (one thread), so nothing else in this binary moves the counts.

use mscclpp_hal::prelude::*;
use mscclpp_hal::{multicast_counts, MemoryKind, MulticastCounts};

const CYCLES: usize = 1000;

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

fn maps() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .lines()
        .count()
}

/// One cycle; `check` runs on the mapping and the two memories (host: the reduction).
fn cycle<A: Api>(
    dev: &A::Device,
    check: &dyn Fn(&A::MulticastMapping, &A::Memory),
) -> Result<(), mscclpp_hal::Error> {
    let g = A::multicast_granularity(dev, 1, 1)?;
    let mc = A::create_multicast(dev, 2 * g.minimum, 1)?;
    let export = A::export_multicast(mc)?;
    let desc = A::multicast_descriptors(&export)
        .into_iter()
        .next()
        .expect("an export has a descriptor");
    let h = A::import_multicast(dev, &desc)?;
    A::multicast_add_device(&h, dev)?;
    let gran = A::multicast_info(&h).granularity;
    let mem = A::alloc(dev, 2 * gran, MemoryKind::Physical { granularity: gran })?;
    // SAFETY: `mem` outlives the binding (dropped first below).
    let binding = unsafe { A::multicast_bind(&h, dev, gran, &mem, gran, gran) }?;
    let map = A::multicast_map(&h, dev, gran, gran)?;
    check(&map, &mem);
    drop(map);
    drop(binding);
    drop(mem);
    drop(h);
    drop(export);
    Ok(())
}

fn run<A: Api>(dev: &A::Device, check: &dyn Fn(&A::MulticastMapping, &A::Memory)) -> String {
    cycle::<A>(dev, check).expect("warm-up cycle");
    // The fd server answers each importer on a thread of its own, whose end of the socket
    // closes just after the importer got its fd: let the warm-up cycle's closes land first.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (fd0, map0, counts0) = (fds(), maps(), multicast_counts());
    assert_eq!(
        counts0,
        MulticastCounts::default(),
        "nothing left after a cycle"
    );
    for i in 0..CYCLES {
        if let Err(e) = cycle::<A>(dev, check) {
            panic!("{} cycle {i}: {e}", A::NAME);
        }
    }
    // The fd server answers each importer on a thread of its own, whose end of the socket
    // closes just after the importer got its fd: give those closes a moment to land.
    let settle = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while fds() != fd0 && std::time::Instant::now() < settle {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let (fd1, map1, counts1) = (fds(), maps(), multicast_counts());
    assert_eq!(
        counts1,
        MulticastCounts::default(),
        "{} multicast resources left",
        A::NAME
    );
    assert_eq!(fd1, fd0, "{}: fds before/after {CYCLES} cycles", A::NAME);
    if A::HOST_ADDRESSABLE {
        assert_eq!(
            map1,
            map0,
            "{}: mappings before/after {CYCLES} cycles",
            A::NAME
        );
    } else {
        // The driver keeps pools of its own; what must not happen is growth per cycle.
        assert!(
            map1 <= map0 + 16,
            "{}: mappings {map0} before, {map1} after {CYCLES} cycles",
            A::NAME
        );
    }
    format!(
        "{}: {CYCLES} cycles, {fd1} fds and {map1} mappings before and after, 0 multicast \
         handles/exports/bindings/mappings",
        A::NAME
    )
}

fn host_check(
    map: &<mscclpp_hal::api::Host as Api>::MulticastMapping,
    mem: &<mscclpp_hal::api::Host as Api>::Memory,
) {
    let p = mem.host_ptr().expect("host memory");
    let gran = map.size();
    // SAFETY: the memory is 2 * gran bytes and bound from offset gran.
    unsafe { p.add(gran).cast::<f32>().add(5).write_volatile(2.5) };
    let m = mscclpp_hal::host::multicast_members(map.device_ptr() + 20, 4).expect("members");
    assert_eq!(m.ptrs().len(), 1);
    // SAFETY: valid for 4 bytes while `m` lives.
    let v = unsafe { m.ptrs()[0].cast::<f32>().read_volatile() };
    assert_eq!(v, 2.5, "the member is the bound memory at the bound offset");
}

#[test]
fn multicast_create_bind_destroy_leaves_nothing() {
    let dev = mscclpp_hal::api::Host::open_device(0).expect("host device");
    println!("{}", run::<mscclpp_hal::api::Host>(&dev, &host_check));
    cuda::run_or_skip();
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use mscclpp_hal::api::Cuda;

    pub(super) fn run_or_skip() {
        if mscclpp_hal::nvls_disabled_by_env() {
            println!(
                "SKIPPED cuda multicast leak test: NVLS disabled by \
                 MSCCLPP_FORCE_DISABLE_NVLS/NCCL_NVLS_ENABLE (no multicast call made)"
            );
            return;
        }
        if !mscclpp_hal::nvls_supported() {
            println!("SKIPPED cuda multicast leak test: no GPU with multicast support");
            return;
        }
        let dev = Cuda::open_device(0).expect("GPU 0");
        println!("{}", run::<Cuda>(&dev, &|_, _| {}));
    }
}

#[cfg(not(feature = "cuda"))]
mod cuda {
    pub(super) fn run_or_skip() {
        println!("SKIPPED cuda multicast leak test: built without --features cuda");
    }
}
