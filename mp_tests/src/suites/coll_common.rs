//! Helpers of the collectives suites: one `Collectives` per process (shared by the tests),
//! buffers on the rank's device, fresh data per call, an f64 (floats) or exact (integers)
//! host reference, and poisoned outputs with a guard zone after the end.

use std::sync::{Arc, OnceLock};

use mscclpp::collectives::{
    Algorithm, Call, CollectiveKind, Collectives, CollectivesConfig, DataType, ReduceOp,
};
use mscclpp::{Communicator, Context, Device, GpuBuffer};
use mscclpp_framework::*;
use mscclpp_hal::{prelude::*, Gpu, StreamInterop};

use super::memory_channel::common::{is_gpu_build, ok};
pub(crate) use crate::coll_data::*;
use crate::world::mp_env;

/// Bytes of poison checked after the end of every output.
pub(crate) const GUARD: usize = 64;
/// The poison byte.
pub(crate) const POISON: u8 = 0xA5;

/// The process's collectives and (GPU builds) a stream to run them on.
pub(crate) struct CollEnv {
    pub coll: Arc<Collectives>,
    pub device: Device,
    pub stream: Option<<Gpu as Api>::Stream>,
}

// SAFETY: the stream handle is usable from any thread (the HAL's streams are Send + Sync).
unsafe impl Sync for CollEnv {}

impl CollEnv {
    /// The raw stream handle to pass to the collectives (0 on the host backend).
    pub fn raw_stream(&self) -> u64 {
        raw_stream_of(&self.stream)
    }
    /// Waits for the stream (no-op on the host backend).
    pub fn sync(&self) -> Result<(), String> {
        sync_stream(&self.stream)
    }
}

/// Whether algorithm `a` takes a call of `kind` on `count` elements of `dtype` with `op` on
/// these collectives (its `check` on a probe call): one beyond its scratch is one the selector
/// never picks.
pub(crate) fn takes(
    env: &CollEnv,
    a: &dyn Algorithm,
    kind: CollectiveKind,
    dtype: DataType,
    op: ReduceOp,
    count: usize,
) -> bool {
    let probe = Call {
        kind,
        send: 1,
        recv: 1,
        count,
        dtype,
        op,
        root: 0,
    };
    a.check(env.coll.resources(), &probe).is_ok()
}

/// The raw handle of `stream` (0 on the host backend, which has none).
pub(crate) fn raw_stream_of(stream: &Option<<Gpu as Api>::Stream>) -> u64 {
    stream.as_ref().map_or(0, Gpu::raw_stream)
}

/// Waits (at most the run's timeout) for `stream`; a no-op on the host backend.
pub(crate) fn sync_stream(stream: &Option<<Gpu as Api>::Stream>) -> Result<(), String> {
    match stream {
        Some(s) => Gpu::stream_synchronize(s, mp_env().timeout).map_err(|e| e.to_string()),
        None => Ok(()),
    }
}

/// This rank's device (GPU builds: a visible GPU by local rank; `Err("skip: ...")` without
/// one) and a communicator over the shared bootstrap.
pub(crate) fn rank_device_and_comm() -> Result<(Device, Arc<Communicator>), String> {
    let env = mp_env();
    let device = if is_gpu_build() {
        let n = crate::world::visible_gpus().map_err(|r| format!("skip: {r}"))?;
        Device::gpu((env.placement.local_rank % n) as i32)
    } else {
        Device::CPU
    };
    let context = Context::new().map_err(|e| e.to_string())?;
    Ok((
        device,
        Arc::new(Communicator::new(env.bootstrap.clone(), context)),
    ))
}

/// A new stream on `device` (GPU builds); `None` on the host backend, which has none.
pub(crate) fn new_stream(device: Device) -> Result<Option<<Gpu as Api>::Stream>, String> {
    if !is_gpu_build() {
        return Ok(None);
    }
    let dev = Gpu::open_device(device.id as usize).map_err(|e| e.to_string())?;
    Ok(Some(Gpu::create_stream(&dev).map_err(|e| e.to_string())?))
}

/// Sets up collectives on this rank's device with `config` (its device and host timeout filled
/// in); `Err("skip: ...")` on a GPU build without a GPU. `what` names the setup in errors.
pub(crate) fn new_coll_env(config: CollectivesConfig, what: &str) -> Result<CollEnv, String> {
    let env = mp_env();
    let (device, comm) = rank_device_and_comm()?;
    let cfg = CollectivesConfig {
        device: Some(device),
        host_timeout: env.timeout,
        ..config
    };
    let coll =
        Collectives::with_config(comm, cfg).map_err(|e| format!("setting up {what}: {e}"))?;
    let stream = new_stream(device)?;
    Ok(CollEnv {
        coll: Arc::new(coll),
        device,
        stream,
    })
}

/// The environment a `OnceLock` holds, or the test skips (`skip: ` errors) or fails.
pub(crate) fn env_or_skip(r: &Result<CollEnv, String>) -> &CollEnv {
    match r {
        Ok(e) => e,
        Err(msg) if msg.starts_with("skip: ") => SKIP!("{}", &msg[6..]),
        Err(msg) => FAIL!("{}", msg),
    }
}

/// The shared collectives of this process, set up by the first test that asks (every rank
/// runs the tests in the same order, so the setup is collective). Skips on a GPU build
/// without a GPU.
pub(crate) fn coll_env() -> &'static CollEnv {
    static ENV: OnceLock<Result<CollEnv, String>> = OnceLock::new();
    env_or_skip(ENV.get_or_init(|| new_coll_env(CollectivesConfig::default(), "the collectives")))
}

/// A device buffer of `bytes` plus the guard zone, filled with poison.
pub(crate) fn poisoned(device: Device, bytes: usize) -> GpuBuffer<u8> {
    let b: GpuBuffer<u8> = ok!(
        GpuBuffer::new(device, bytes + GUARD),
        "allocating {} bytes",
        bytes + GUARD
    );
    ok!(
        b.copy_from_host(0, &vec![POISON; bytes + GUARD]),
        "poisoning"
    );
    b
}

/// Two reusable device buffers (send, recv) of at least `bytes` + guard, poisoned over
/// `bytes` + guard. Grown (reallocated) when too small.
pub(crate) fn buffers(device: Device, bytes: usize) -> (GpuBuffer<u8>, GpuBuffer<u8>) {
    static CACHE: std::sync::Mutex<Option<(GpuBuffer<u8>, GpuBuffer<u8>)>> =
        std::sync::Mutex::new(None);
    let mut c = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if c.as_ref().is_none_or(|(s, _)| s.len() < bytes + GUARD) {
        let cap = (bytes + GUARD).max(1 << 16);
        *c = Some((poisoned(device, cap), poisoned(device, cap)));
    }
    let (s, r) = c.clone().unwrap_or_else(|| FAIL!("buffer cache empty"));
    let poison = vec![POISON; bytes + GUARD];
    ok!(s.copy_from_host(0, &poison), "poisoning");
    ok!(r.copy_from_host(0, &poison), "poisoning");
    (s, r)
}

/// Writes `vals` as `dtype` elements at element offset `at` of `buf`.
pub(crate) fn write_values(buf: &GpuBuffer<u8>, at: usize, dtype: DataType, vals: &[f64]) {
    let bytes = encode_all(dtype, vals);
    ok!(
        buf.copy_from_host(at * dtype.size_in_bytes(), &bytes),
        "writing the input"
    );
}

/// Counts mismatches of `got` (element `k` of it = global index `first + k`) against
/// `want(global index)`; the first few are described in `first_errors`.
pub(crate) fn compare(
    dtype: DataType,
    got: &[u8],
    first: usize,
    mut want: impl FnMut(usize) -> f64,
    first_errors: &mut Vec<String>,
) -> usize {
    let s = dtype.size_in_bytes();
    let mut bad = 0;
    for (k, e) in got.chunks_exact(s).enumerate() {
        let (g, w) = (decode(dtype, e), want(first + k));
        if !close(dtype, g, w) {
            bad += 1;
            if first_errors.len() < 3 {
                first_errors.push(format!("element {}: got {g}, expected {w}", first + k));
            }
        }
    }
    bad
}

/// Mismatches of `got` against the all-reduce with `op` of the ranks' inputs `vals` (`vals[r]`
/// rank r's elements); the first few described in `errors`.
pub(crate) fn compare_all_reduce(
    dtype: DataType,
    op: ReduceOp,
    got: &[u8],
    vals: &[Vec<f64>],
    errors: &mut Vec<String>,
) -> usize {
    compare(
        dtype,
        got,
        0,
        |i| {
            let column: Vec<f64> = vals.iter().map(|v| v[i]).collect();
            reference(dtype, op, &column)
        },
        errors,
    )
}

/// Replays `graph`, a captured all-reduce of `count` elements of `dtype` with `op` from `send`
/// into `recv`, `replays` times on the stream of `env`, each time with fresh inputs (the replay
/// index is the call number of [`all_values`]); returns the mismatches, the first few
/// described in `errors`.
pub(crate) fn replay_all_reduce(
    env: &CollEnv,
    graph: &<Gpu as StreamInterop>::Graph,
    (send, recv): (&GpuBuffer<u8>, &GpuBuffer<u8>),
    (dtype, op, count): (DataType, ReduceOp, usize),
    seed: u64,
    replays: u32,
    errors: &mut Vec<String>,
) -> usize {
    let Some(stream) = env.stream.as_ref() else {
        FAIL!("replaying a graph needs a stream")
    };
    let (rank, n) = (env.coll.rank(), env.coll.nranks());
    let mut bad = 0;
    for replay in 0..replays {
        let vals = all_values(dtype, op, seed, replay, n, count);
        write_values(send, 0, dtype, &vals[rank]);
        ok!(Gpu::launch_graph(graph, stream), "replaying");
        ok!(env.sync(), "waiting for the replay");
        let mut got = vec![0u8; count * dtype.size_in_bytes()];
        ok!(recv.copy_to_host(0, &mut got), "reading");
        bad += compare_all_reduce(dtype, op, &got, &vals, errors);
    }
    bad
}

/// Checks the guard zone after `bytes` of `buf` is still poisoned.
pub(crate) fn guard_intact(buf: &GpuBuffer<u8>, bytes: usize) -> bool {
    let mut g = vec![0u8; GUARD];
    ok!(buf.copy_to_host(bytes, &mut g), "reading the guard zone");
    g.iter().all(|&b| b == POISON)
}

/// A seed agreed by all ranks (rank 0's), fresh per test.
pub(crate) fn agreed_seed() -> u64 {
    use std::hash::BuildHasher;
    let mine = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
    let b = &mp_env().bootstrap;
    let got = ok!(b.broadcast(&mine.to_le_bytes(), 0), "broadcasting the seed");
    let arr: [u8; 8] = ok!(<[u8; 8]>::try_from(got.as_slice()), "seed bytes");
    u64::from_le_bytes(arr)
}

/// Whether the exhaustive big-size combinations run (`MSCCLPP_COLL_TEST_EXHAUSTIVE=1`);
/// otherwise big sizes run for one float and one integer type with sum only.
pub(crate) fn exhaustive() -> bool {
    std::env::var("MSCCLPP_COLL_TEST_EXHAUSTIVE").is_ok_and(|v| v == "1")
}

/// The largest world that runs the full matrices and 1000 repeated calls. CI also runs the
/// suites at 8 and 16 ranks on a two-core machine, where one call of a debug build's host
/// backend takes 0.1 to 0.7 s (every rank spins on two cores): above this, [`at_scale`]
/// worlds run a subset that still exercises every algorithm, rank-dependent offsets and odd
/// sizes (collective matrices, repeated calls, small-scratch cases, NVLS cases, executor
/// plans' types, switch-channel leak cycles). `MSCCLPP_COLL_TEST_EXHAUSTIVE=1` runs everything
/// at any size.
pub(crate) const FULL_MATRIX_MAX_RANKS: usize = 4;

/// Whether a world of `n` ranks runs the reduced matrices (see [`FULL_MATRIX_MAX_RANKS`]).
pub(crate) fn at_scale(n: usize) -> bool {
    n > FULL_MATRIX_MAX_RANKS && !exhaustive()
}

/// How many calls the RepeatedCalls tests make on `n` ranks: 1000, or 100 [`at_scale`]
/// (each algorithm still sees every case several times).
pub(crate) fn repeated_calls(n: usize) -> u32 {
    if at_scale(n) {
        100
    } else {
        1000
    }
}

/// The algorithms of `kind` that run inside one node (the registry without the multi-node
/// ones, which MultiNodeTest covers and which a world on one node cannot run on GPUs).
pub(crate) fn single_node_algorithms(
    kind: mscclpp::collectives::CollectiveKind,
) -> Vec<&'static str> {
    use mscclpp::collectives::{algorithm_names, find_algorithm};
    algorithm_names(kind)
        .into_iter()
        .filter(|a| find_algorithm(kind, a).is_ok_and(|x| !x.multi_node()))
        .collect()
}
