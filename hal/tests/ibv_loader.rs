//! The run-time libibverbs loader: a missing library gives an error naming every path tried;
//! the system libibverbs (no RDMA devices here) gives an empty list; the test provider
//! (`libmscclpp_ibv_testprov.so`, built by `cargo build -p mscclpp-ibv-testprov`) lists
//! `testprov0` and runs a loopback RDMA write.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mscclpp_hal::ibv::{
    AccessFlags, IbvError, IbvLib, QpCaps, RtrParams, RtsParams, SendOp, SendWr, Sge,
};

fn provider_path() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    [
        deps.parent()?.join("libmscclpp_ibv_testprov.so"),
        deps.join("libmscclpp_ibv_testprov.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
}

#[test]
fn nonexistent_path_is_a_clear_error() {
    let cands = IbvLib::candidates(Some("/nonexistent/libibverbs-none.so".as_ref()));
    assert_eq!(
        cands,
        vec![PathBuf::from("/nonexistent/libibverbs-none.so")],
        "only the env path is tried"
    );
    let err = IbvLib::load_candidates(&cands).expect_err("loading a missing file must fail");
    let msg = err.to_string();
    assert!(
        matches!(err, IbvError::LibraryNotFound { ref tried } if tried.len() == 1),
        "{err:?}"
    );
    assert!(msg.contains("/nonexistent/libibverbs-none.so"), "{msg}");
    // Without the variable the two default names are tried.
    assert_eq!(
        IbvLib::candidates(None),
        vec![
            PathBuf::from("libibverbs.so"),
            PathBuf::from("libibverbs.so.1")
        ]
    );
}

/// Runs `IbvLib::load()` with `MSCCLPP_IBV_SO=/nonexistent` in a child process (the variable is
/// process-wide, so it is not set in this multi-threaded test process).
#[test]
fn env_variable_is_honoured() {
    if std::env::var_os("IBV_LOADER_CHILD").is_some() {
        let err = IbvLib::load().expect_err("MSCCLPP_IBV_SO=/nonexistent must fail");
        let msg = err.to_string();
        assert!(msg.contains("/nonexistent"), "{msg}");
        assert!(
            !msg.contains("libibverbs.so.1"),
            "only the env path may be tried: {msg}"
        );
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", "env_variable_is_honoured", "--test-threads=1"])
        .env("IBV_LOADER_CHILD", "1")
        .env("MSCCLPP_IBV_SO", "/nonexistent")
        .output()
        .expect("spawning the child");
    assert!(
        out.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
}

#[test]
fn system_libibverbs_has_no_devices_and_does_not_crash() {
    let lib = match IbvLib::load_candidates(&[PathBuf::from("libibverbs.so.1")]) {
        Ok(lib) => lib,
        Err(e) => {
            eprintln!("SKIP: system libibverbs.so.1 is not installed: {e}");
            return;
        }
    };
    let names = lib.device_names().expect("device list");
    if !names.is_empty() {
        eprintln!(
            "SKIP: this machine has RDMA devices {names:?}; the empty-list check does not apply"
        );
        return;
    }
    let err = lib.open_device("mlx5_0").expect_err("no such device");
    assert!(matches!(err, IbvError::DeviceNotFound { .. }), "{err:?}");
}

#[test]
fn test_provider_lists_testprov0_and_writes_in_loopback() {
    let Some(path) = provider_path() else {
        eprintln!("SKIP: libmscclpp_ibv_testprov.so not found next to the test binary; run `cargo build -p mscclpp-ibv-testprov` first");
        return;
    };
    let lib = IbvLib::load_candidates(&[path]).expect("load the provider");
    assert!(
        lib.has_dmabuf(),
        "the provider exports ibv_reg_dmabuf_mr (issue 19), so the loader must find it"
    );
    assert_eq!(
        lib.device_names().expect("list"),
        vec!["testprov0".to_string()]
    );
    let ctx = lib.open_device("testprov0").expect("open");
    let attr = ctx.query_device().expect("query_device");
    assert_eq!(attr.phys_port_cnt, 1);
    let port = ctx.query_port(1).expect("query_port");
    assert!(port.is_usable() && port.is_ethernet(), "{port:?}");
    assert!(ctx.query_port(2).is_err(), "port 2 does not exist");
    let (p, _, gid) = ctx.first_active_port(0).expect("active port");
    assert_eq!(p, 1);
    assert!(
        gid.ipv4().is_some(),
        "IPv4-mapped GID expected, got {gid:?}"
    );
    assert!(ctx.check_port(1, 3).is_err(), "gid index 3 does not exist");

    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(64).expect("cq");
    let mut src = vec![0u8; 4096];
    let mut dst = vec![0u8; 4096];
    for (i, b) in src.iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    // SAFETY: the vectors outlive the regions (dropped after them) and are never resized.
    let smr = unsafe { pd.reg_mr(src.as_mut_ptr(), src.len(), AccessFlags::LOCAL_WRITE) }
        .expect("src mr");
    // SAFETY: as above.
    let dmr =
        unsafe { pd.reg_mr(dst.as_mut_ptr(), dst.len(), AccessFlags::ALL_REMOTE) }.expect("dst mr");
    let qa = pd.create_rc_qp(&cq, &cq, QpCaps::default()).expect("qa");
    let qb = pd.create_rc_qp(&cq, &cq, QpCaps::default()).expect("qb");
    for (q, other) in [(&qa, &qb), (&qb, &qa)] {
        q.to_init(1, AccessFlags::ALL_REMOTE).expect("init");
        let mut r = RtrParams::new(1, other.qp_num(), port.active_mtu);
        r.remote_gid = Some(gid);
        q.to_rtr(&r).expect("rtr");
        q.to_rts(&RtsParams::default()).expect("rts");
    }
    let wr = SendWr {
        wr_id: 42,
        op: SendOp::Write {
            remote_addr: dmr.addr(),
            rkey: dmr.rkey(),
        },
        local: Some(Sge {
            addr: smr.addr(),
            length: 4096,
            lkey: smr.lkey(),
        }),
        signaled: true,
    };
    qa.post_send(&[wr]).expect("post");
    let mut wcs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while wcs.is_empty() && Instant::now() < deadline {
        cq.poll(&mut wcs, 4).expect("poll");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(wcs.len(), 1);
    assert!(
        wcs[0].is_success() && wcs[0].wr_id == 42,
        "{}",
        wcs[0].describe()
    );
    // SAFETY: the write completed; read through a volatile view.
    let got: Vec<u8> = (0..4096)
        .map(|i| unsafe { std::ptr::read_volatile(dst.as_ptr().add(i)) })
        .collect();
    assert_eq!(got, src);
    drop((qa, qb, smr, dmr));
}
