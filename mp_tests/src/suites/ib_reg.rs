//! IbRegistrationTest and IbGdrTest: which IB registration path memory takes (mlx5 Data
//! Direct, dma-buf, plain `ibv_reg_mr`, with `MSCCLPP_IB_MR_PATH` forcing one), the GDRCopy
//! status, and HostNoAtomic tokens in GPU memory forwarded through GDRCopy with their data
//! visible first.
//!
//! CI states what it expects through `MSCCLPP_TEST_EXPECT_REG_CPU` / `MSCCLPP_TEST_EXPECT_REG_GPU`
//! (`data-direct`, `dmabuf`, `plain`) and `MSCCLPP_TEST_EXPECT_GDR` (`ok`, `disabled`,
//! `missing`, `open-failed`, `too-old`, `not-built`); unset, a test checks only what holds in
//! every configuration (a forced path is the path taken) and prints what it found.

use mscclpp::env::IbMrPath;
use mscclpp::ib::{gdr_forwarded_signals, gdr_status, GdrStatus, RegPath};
use mscclpp::{Device, LocalMemory, Transport};
use mscclpp_framework::*;

use super::ib::{ib_config, require_ib, wait_token};
use super::memory_channel::common::*;

fn path_name(p: RegPath) -> &'static str {
    match p {
        RegPath::DmaBufDataDirect => "data-direct",
        RegPath::DmaBuf => "dmabuf",
        RegPath::Plain => "plain",
    }
}

fn expect_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The memory a rank registers as "GPU" memory: its GPU in a GPU build, GPU 0 of the host
/// backend otherwise (host memory standing in for it, exported as a memfd).
fn gpu_device() -> Device {
    if is_gpu_build() {
        match crate::world::rank_gpu() {
            Ok(d) => d,
            Err(reason) => SKIP!("{}", reason),
        }
    } else {
        Device::gpu(0)
    }
}

fn check_path(what: &str, device: Device, expect_var: &str) {
    let forced = ok!(mscclpp::env().ib_mr_path(), "MSCCLPP_IB_MR_PATH");
    let ctx = ok!(mscclpp::Context::new(), "creating a context");
    let mem = ok!(
        LocalMemory::alloc(device, 1 << 20),
        "allocating {what} memory"
    );
    let reg = ok!(
        ctx.register_memory(mem.ptr() + 4096, 64 << 10, Transport::Ib0.into()),
        "registering {what} memory for IB0"
    );
    let path = reg.ib_registration_path(Transport::Ib0);
    let Some(path) = path else {
        FAIL!("{what} memory registered for IB0 reports no registration path");
    };
    println!("{what} memory: registered through {}", path.describe());
    let want_forced = match forced {
        IbMrPath::Auto => None,
        IbMrPath::DataDirect => Some(RegPath::DmaBufDataDirect),
        IbMrPath::DmaBuf => Some(RegPath::DmaBuf),
        IbMrPath::Plain => Some(RegPath::Plain),
    };
    if let Some(w) = want_forced {
        EXPECT_EQ!(
            path,
            w,
            "{} memory with MSCCLPP_IB_MR_PATH={:?}",
            what,
            forced
        );
    }
    if let Some(e) = expect_env(expect_var) {
        EXPECT_EQ!(
            path_name(path),
            e.trim(),
            "{} memory's path ({})",
            what,
            expect_var
        );
    }
    EXPECT_EQ!(
        reg.ib_registration_path(Transport::Ib1),
        None,
        "a transport not registered"
    );
}

TEST!(IbRegistrationTest, CpuMemoryPath, |_ctx| {
    require_ib();
    check_path("CPU", Device::CPU, "MSCCLPP_TEST_EXPECT_REG_CPU");
});

TEST!(IbRegistrationTest, GpuMemoryPath, |_ctx| {
    require_ib();
    check_path("GPU", gpu_device(), "MSCCLPP_TEST_EXPECT_REG_GPU");
});

TEST!(IbGdrTest, Status, |_ctx| {
    let (status, msg) = gdr_status();
    println!("GDRCopy status: {} ({msg})", status.name());
    EXPECT_FALSE!(
        msg.is_empty(),
        "the status {:?} comes with a message",
        status
    );
    if let Some(e) = expect_env("MSCCLPP_TEST_EXPECT_GDR") {
        let want = match e.trim() {
            "ok" => GdrStatus::Ok,
            "disabled" => GdrStatus::DisabledByEnv,
            "missing" => GdrStatus::DriverMissing,
            "open-failed" => GdrStatus::OpenFailed,
            "too-old" => GdrStatus::DriverTooOld,
            "not-built" => GdrStatus::NotBuilt,
            other => FAIL!(
                "MSCCLPP_TEST_EXPECT_GDR={other}: expected ok, disabled, missing, open-failed, \
                 too-old or not-built"
            ),
        };
        EXPECT_EQ!(status, want, "GDRCopy status ({})", msg);
    }
});

TEST!(IbGdrTest, GpuTokenAfterItsData, |ctx| {
    // HostNoAtomic signals into a token in GPU memory: the receive thread forwards each one
    // (through GDRCopy when its status is ok). Every round the reader must see all the data
    // of the round once the token shows it.
    require_ib();
    let p = pair(ctx);
    let device = gpu_device();
    let t = p.timeout;
    let mut cfg = ib_config(mscclpp::IbMode::HostNoAtomic);
    cfg.device = device;
    let conn = ok!(
        p.comm.connect(cfg, p.peer, 50).get(),
        "connecting to rank {}",
        p.peer
    );
    let n = 16 << 10;
    let flags = Transport::Ib0.into();
    let data = ok!(LocalMemory::alloc(device, n * 8), "allocating the data");
    let token = ok!(LocalMemory::alloc(device, 8), "allocating the token");
    let src = ok!(
        LocalMemory::alloc(Device::CPU, n * 8),
        "allocating the source"
    );
    let data_reg = ok!(
        p.comm.register_memory(data.ptr(), n * 8, flags),
        "registering data"
    );
    let token_reg = ok!(
        p.comm.register_memory(token.ptr(), 8, flags),
        "registering the token"
    );
    let src_reg = ok!(
        p.comm.register_memory(src.ptr(), n * 8, flags),
        "registering the source"
    );
    let peer_data = p.exchange(&data_reg, 51);
    let peer_token = p.exchange(&token_reg, 52);
    p.sync();
    let before = gdr_forwarded_signals();
    let outbound = std::sync::atomic::AtomicU64::new(0);
    let rounds = 50u64;
    for r in 1..=rounds {
        if p.initiator {
            let bytes: Vec<u8> = (0..n).flat_map(|_| r.to_le_bytes()).collect();
            ok!(src.write(0, &bytes), "filling round {r}");
            ok!(
                conn.write(&peer_data, 0, &src_reg, 0, (n * 8) as u64),
                "writing round {r}"
            );
            ok!(
                conn.update_and_sync(&peer_token, 0, &outbound, r),
                "signalling round {r}"
            );
            ok!(conn.flush(t), "flushing round {r}");
        } else {
            ok!(wait_token(&token, |v| v >= r, t), "the token of round {r}");
            let got = ok!(data.to_vec(), "reading round {r}");
            let bad = got
                .chunks_exact(8)
                .filter(|c| {
                    u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) != r
                })
                .count();
            ASSERT_EQ!(
                bad,
                0,
                "round {}: elements not yet equal to the round when its token showed",
                r
            );
        }
        p.sync();
    }
    if !p.initiator {
        let forwarded = gdr_forwarded_signals() - before;
        let (status, msg) = gdr_status();
        println!(
            "GDRCopy {} ({msg}): {forwarded} of {rounds} tokens through it",
            status.name()
        );
        if status == GdrStatus::Ok {
            EXPECT_EQ!(
                forwarded,
                rounds,
                "tokens forwarded through GDRCopy (status ok)"
            );
        } else {
            EXPECT_EQ!(
                forwarded,
                0,
                "tokens through GDRCopy with status {:?}",
                status
            );
        }
    }
    p.sync();
});
