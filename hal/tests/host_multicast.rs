//! The host backend's multicast emulation in one process: two imported handles play two
//! devices (each adds itself and binds its own memfd), and the members behind the mapped
//! address are exactly those memories at the bound offsets. Cross-process use is covered by
//! `SwitchChannelTest` in mp_unit_tests.

use mscclpp_hal::api::Host;
use mscclpp_hal::host::multicast_members;
use mscclpp_hal::prelude::*;
use mscclpp_hal::{Error, MemoryKind};

fn words(p: *mut u8, n: usize) -> Vec<u32> {
    // SAFETY: callers pass pointers into live host mappings of at least n words.
    (0..n)
        .map(|i| unsafe { p.cast::<u32>().add(i).read_volatile() })
        .collect()
}

#[test]
fn two_devices_bind_map_and_resolve() {
    let dev = Host::open_device(0).expect("host device");
    let g = Host::multicast_granularity(&dev, 1 << 20, 2).expect("granularity");
    assert!(g.minimum > 0 && g.recommended % g.minimum == 0);
    let mc = Host::create_multicast(&dev, 3 * g.minimum, 2).expect("create");
    let info = Host::multicast_info(&mc);
    assert_eq!(
        info.size % g.recommended,
        0,
        "size rounded to the recommended granularity"
    );
    assert_eq!(info.ndevices, 2);
    let export = Host::export_multicast(mc).expect("export");
    let desc = Host::multicast_descriptors(&export)
        .into_iter()
        .next()
        .expect("one descriptor");
    let h0 = Host::import_multicast(&dev, &desc).expect("import 0");
    let h1 = Host::import_multicast(&dev, &desc).expect("import 1");
    let gran = info.granularity;
    let mem0 = Host::alloc(&dev, 2 * gran, MemoryKind::Physical { granularity: 0 }).expect("m0");
    let mem1 = Host::alloc(&dev, 2 * gran, MemoryKind::Physical { granularity: 0 }).expect("m1");

    // Binding needs the device added through the handle first.
    // SAFETY: the memories outlive every binding below.
    let early = unsafe { Host::multicast_bind(&h0, &dev, gran, &mem0, gran, gran) };
    assert!(
        matches!(early, Err(Error::InvalidArgument { .. })),
        "{early:?}"
    );
    Host::multicast_add_device(&h0, &dev).expect("add 0");
    Host::multicast_add_device(&h0, &dev).expect("adding twice through one handle is a no-op");
    Host::multicast_add_device(&h1, &dev).expect("add 1");
    let h2 = Host::import_multicast(&dev, &desc).expect("import 2");
    assert!(
        Host::multicast_add_device(&h2, &dev).is_err(),
        "a third device exceeds the count"
    );
    // Misaligned offsets are refused.
    // SAFETY: as above.
    assert!(unsafe { Host::multicast_bind(&h0, &dev, 1, &mem0, 0, gran) }.is_err());

    // Device 0 binds the second page of mem0 at multicast offset `gran`; device 1 the first
    // page of mem1 there.
    // SAFETY: the memories outlive the bindings.
    let b0 = unsafe { Host::multicast_bind(&h0, &dev, gran, &mem0, gran, gran) }.expect("bind 0");
    // SAFETY: as above.
    let overlap = unsafe { Host::multicast_bind(&h0, &dev, gran, &mem0, 0, gran) };
    assert!(overlap.is_err(), "one device binds a range once");
    // SAFETY: as above.
    let b1 = unsafe { Host::multicast_bind(&h1, &dev, gran, &mem1, 0, gran) }.expect("bind 1");

    let map = Host::multicast_map(&h0, &dev, gran, gran).expect("map");
    assert!(
        map.host_ptr().is_none(),
        "a multicast address is no host memory"
    );
    assert_eq!(map.size(), gran);
    let p0 = mem0.host_ptr().expect("host memory");
    let p1 = mem1.host_ptr().expect("host memory");
    // SAFETY: both memories are 2 * gran bytes; writes go to their own pages.
    unsafe {
        p0.add(gran).cast::<u32>().add(3).write_volatile(7);
        p1.cast::<u32>().add(3).write_volatile(35);
    }
    let m = multicast_members(map.device_ptr() + 12, 4).expect("members");
    assert_eq!(m.ptrs().len(), 2);
    assert_eq!(
        words(m.ptrs()[0], 1),
        vec![7],
        "device 0's copy at the bound offset"
    );
    assert_eq!(
        words(m.ptrs()[1], 1),
        vec![35],
        "device 1's copy at the bound offset"
    );
    // The members are fresh mappings of the same memfds: writes through them land in the memory.
    // SAFETY: members are valid for the resolved 4 bytes while `m` lives.
    unsafe { m.ptrs()[1].cast::<u32>().write_volatile(99) };
    assert_eq!(words(p1, 4)[3], 99);

    // Outside the bound range, or outside the mapping: errors, not garbage.
    let below = multicast_members(map.device_ptr() - gran as u64, 4);
    assert!(
        below.is_err(),
        "offset 0 is mapped but nothing is bound there"
    );
    assert!(multicast_members(map.device_ptr() + gran as u64, 4).is_err());
    assert!(multicast_members(12345, 4).is_err(), "no mapping there");

    // Unbinding device 1 leaves the range with one member: resolving fails, naming it.
    drop(b1);
    let e = multicast_members(map.device_ptr(), 4).expect_err("device 1 unbound");
    assert!(e.to_string().contains("device 1"), "{e}");
    drop((b0, map, h0, h1, h2, export));
}

#[test]
fn bad_descriptors_are_refused() {
    let dev = Host::open_device(0).expect("host device");
    let mc = Host::create_multicast(&dev, 4096, 1).expect("create");
    let export = Host::export_multicast(mc).expect("export");
    let good = Host::multicast_descriptors(&export).remove(0);
    let mut bad = good.clone();
    bad.handle[0] ^= 0xff;
    assert!(matches!(
        Host::import_multicast(&dev, &bad),
        Err(Error::BadDescriptor(_))
    ));
    let mut other_size = good.clone();
    other_size.size *= 2;
    assert!(Host::import_multicast(&dev, &other_size).is_err());
    let mut wrong_id = good.clone();
    wrong_id.fd_id = u64::MAX;
    assert!(Host::import_multicast(&dev, &wrong_id).is_err());
    assert!(Host::create_multicast(&dev, 0, 1).is_err());
    assert!(Host::create_multicast(&dev, 1, 0).is_err());
    let h = Host::import_multicast(&dev, &good).expect("import");
    assert!(
        Host::export_multicast(h).is_err(),
        "only the created handle exports"
    );
}
