//! DeviceAbortTest: the process's abort word (`mscclpp_hal::abort`) ends a device-side wait
//! that nothing else would end. Single-process (each rank runs it on its own).
//!
//! - RaisedWordEndsABlockedWait (GPU builds): `abort_wait_forever` of
//!   kernels/cuda/test_kernels/abort_tests.cu spins on a flag nobody sets; once the host raises
//!   the word the kernel leaves its wait within a second (no trap), and the stream's
//!   synchronisation reports the abort naming the peer. After the word is lowered, the same
//!   wait with the flag set completes normally.
//! - RaisedWordEndsAnEmulatedWait (every build): the host emulation's counterpart, a
//!   `device_emu` semaphore wait on a token nobody signals.
//! - CommunicatorAbortRaisesTheWordUntilDropped (every build): `Communicator::abort` raises it
//!   (an emulated wait ends as aborted) and dropping the communicator lowers it.

use std::time::{Duration, Instant};

use mscclpp::device_emu;
use mscclpp::ErrorCode;
use mscclpp_framework::*;
use mscclpp_hal::abort;
use mscclpp_hal::{prelude::*, Gpu, LaunchConfig, MemoryKind};

use super::memory_channel::common::{is_gpu_build, ok};
use crate::world::mp_env;

/// The rank the tests pretend died (no rank of the run: only the message names it).
const FAKE_DEAD_PEER: usize = 77;

/// Little-endian u64 number `i` of `b`.
fn word(b: &[u8; 16], i: usize) -> u64 {
    u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]))
}

/// Waits until an earlier test's raise is gone (the word is per process).
fn word_down_first() {
    ASSERT_TRUE!(
        abort::wait_lowered(Duration::from_secs(20)),
        "the abort word was still up from earlier work after 20 s: {:?}",
        abort::raised()
    );
}

#[repr(C)]
#[derive(Clone, Copy)]
struct WaitArgs {
    flag: u64,
    out: u64,
}

TEST!(DeviceAbortTest, RaisedWordEndsABlockedWait, |_ctx| {
    if !is_gpu_build() {
        SKIP!("a GPU build runs the kernel; the host backend's counterpart is RaisedWordEndsAnEmulatedWait");
    }
    let n = match Gpu::device_count() {
        Ok(n) => n,
        Err(e @ mscclpp_hal::Error::NoDriver { .. }) => SKIP!("no GPU driver: {e}"),
        Err(e) => FAIL!("counting devices: {e}"),
    };
    if n == 0 {
        SKIP!("no GPU on this machine");
    }
    word_down_first();
    let ordinal = mp_env().placement.local_rank % n;
    let dev = ok!(Gpu::open_device(ordinal), "opening GPU {ordinal}");
    let code = match mscclpp_test_kernels::object("abort_tests") {
        Some(c) => c,
        None => FAIL!("this build embeds no code object `abort_tests`"),
    };
    let module = ok!(Gpu::load_module(&dev, code), "loading abort_tests");
    let kernel = ok!(
        Gpu::get_kernel(&module, "abort_wait_forever"),
        "finding abort_wait_forever"
    );
    let flag = ok!(Gpu::alloc(&dev, 8, MemoryKind::Device), "flag");
    let out = ok!(Gpu::alloc(&dev, 16, MemoryKind::Device), "out");
    ok!(Gpu::memset(&dev, &flag, 0, 0, 8), "zeroing the flag");
    ok!(Gpu::memset(&dev, &out, 0, 0, 16), "zeroing out");
    let stream = ok!(Gpu::create_stream(&dev), "stream");
    let args = WaitArgs {
        flag: flag.device_ptr(),
        out: out.device_ptr(),
    };
    // SAFETY: WaitArgs mirrors the kernel's two pointers; both buffers outlive the stream's work
    // (it is synchronised below before they drop).
    let launched = unsafe { Gpu::launch(&kernel, &LaunchConfig::linear(1, 1), &stream, &args) };
    ok!(launched, "launching abort_wait_forever");
    // Blocked: nothing sets the flag.
    let e = Gpu::stream_synchronize(&stream, Duration::from_millis(500));
    ASSERT_TRUE!(
        matches!(e, Err(mscclpp_hal::Error::Timeout { .. })),
        "expected the kernel still waiting after 0.5 s, got {:?}",
        e
    );
    let t0 = Instant::now();
    let hold = abort::raise(Some(FAKE_DEAD_PEER), "DeviceAbortTest: a peer died");
    let r = Gpu::stream_synchronize(&stream, Duration::from_secs(10));
    let took = t0.elapsed();
    match r {
        Err(mscclpp_hal::Error::Aborted { peer, ref why, .. }) => {
            EXPECT_EQ!(peer, Some(FAKE_DEAD_PEER));
            EXPECT_TRUE!(why.contains("a peer died"), "{}", why);
            let msg = r.as_ref().unwrap_err().to_string();
            EXPECT_TRUE!(msg.contains(&format!("rank {FAKE_DEAD_PEER}")), "{}", msg);
        }
        other => FAIL!(
            "expected Aborted naming rank {FAKE_DEAD_PEER}, got {:?}",
            other
        ),
    }
    ASSERT_LT!(
        took,
        Duration::from_secs(1),
        "the raised word took {:?} to end the wait",
        took
    );
    let mut got = [0u8; 16];
    ok!(Gpu::read(&dev, &out, 0, &mut got), "reading out");
    EXPECT_EQ!(
        word(&got, 0),
        1,
        "the kernel left its wait with the flag still unset"
    );
    EXPECT_EQ!(word(&got, 1), 1, "the kernel saw the word raised");
    drop(hold);
    ASSERT_TRUE!(
        abort::wait_lowered(Duration::from_secs(15)),
        "the word stayed up after the hold was dropped"
    );
    // The word down, the same wait finishes normally once the flag is set.
    ok!(
        Gpu::write(&dev, &flag, 0, &1u64.to_le_bytes()),
        "setting the flag"
    );
    // SAFETY: as above.
    let launched = unsafe { Gpu::launch(&kernel, &LaunchConfig::linear(1, 1), &stream, &args) };
    ok!(launched, "launching abort_wait_forever again");
    ok!(
        Gpu::stream_synchronize(&stream, Duration::from_secs(10)),
        "the wait with the flag set"
    );
    ok!(Gpu::read(&dev, &out, 0, &mut got), "reading out");
    EXPECT_EQ!(word(&got, 0), 2, "the flag was seen set");
    EXPECT_EQ!(word(&got, 1), 0, "the word was down");
});

TEST!(DeviceAbortTest, RaisedWordEndsAnEmulatedWait, |_ctx| {
    word_down_first();
    let mut token: u64 = 0;
    let mut expected: u64 = 0;
    let raiser = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        (
            abort::raise(Some(FAKE_DEAD_PEER), "DeviceAbortTest: a peer died"),
            t,
        )
    });
    // SAFETY: both words are live locals private to this wait (nobody signals the token).
    let r =
        unsafe { device_emu::semaphore::wait(&mut token, &mut expected, Duration::from_secs(30)) };
    let after = Instant::now();
    let (hold, raised_at) = match raiser.join() {
        Ok(x) => x,
        Err(_) => FAIL!("the raising thread panicked"),
    };
    let e = match r {
        Err(e) => e,
        Ok(()) => FAIL!("the wait succeeded with nobody signalling"),
    };
    EXPECT_EQ!(e.code(), ErrorCode::RemoteError, "{}", e);
    EXPECT_TRUE!(
        e.to_string().contains(&format!("rank {FAKE_DEAD_PEER}")),
        "{}",
        e
    );
    let took = after.saturating_duration_since(raised_at);
    EXPECT_LT!(
        took,
        Duration::from_secs(1),
        "the raised word took {:?}",
        took
    );
    drop(hold);
    ASSERT_TRUE!(
        abort::wait_lowered(Duration::from_secs(15)),
        "the word stayed up"
    );
    // Down again: a signalled wait succeeds.
    token = 2;
    // SAFETY: as above.
    let r =
        unsafe { device_emu::semaphore::wait(&mut token, &mut expected, Duration::from_secs(5)) };
    ok!(r, "a signalled wait after the word went down");
});

TEST!(
    DeviceAbortTest,
    CommunicatorAbortRaisesTheWordUntilDropped,
    |_ctx| {
        word_down_first();
        let env = mp_env();
        let ctx = ok!(mscclpp::Context::new(), "context");
        let comm = mscclpp::Communicator::new(env.bootstrap.clone(), ctx);
        EXPECT_FALSE!(comm.is_aborted());
        comm.abort("DeviceAbortTest");
        EXPECT_TRUE!(comm.is_aborted());
        let r = match abort::raised() {
            Some(r) => r,
            None => FAIL!("Communicator::abort left the word down"),
        };
        EXPECT_EQ!(r.peer, None);
        EXPECT_TRUE!(r.why.contains("Communicator::abort on rank"), "{}", r.why);
        // An emulated device wait ends at once, as aborted.
        let (mut token, mut expected) = (0u64, 0u64);
        let t0 = Instant::now();
        // SAFETY: both words are live locals private to this wait.
        let e = unsafe {
            device_emu::semaphore::wait(&mut token, &mut expected, Duration::from_secs(30))
        };
        EXPECT_LT!(t0.elapsed(), Duration::from_secs(1));
        match e {
            Err(e) => EXPECT_EQ!(e.code(), ErrorCode::Aborted, "{}", e),
            Ok(()) => FAIL!("the wait succeeded with nobody signalling"),
        }
        comm.abort("twice is once");
        drop(comm);
        ASSERT_TRUE!(
            abort::wait_lowered(Duration::from_secs(15)),
            "the word stayed up after the communicator was dropped"
        );
    }
);
