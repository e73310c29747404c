//! Helpers of the collectives suites: one `Collectives` per process (shared by the tests),
//! buffers on the rank's device, fresh data per call, an f64 (floats) or exact (integers)
//! host reference, and poisoned outputs with a guard zone after the end.

use std::sync::{Arc, OnceLock};

use mscclpp::collectives::{Collectives, CollectivesConfig, DataType, ReduceOp};
use mscclpp::{Communicator, Context, Device, GpuBuffer};
use mscclpp_framework::*;
use mscclpp_hal::{Api, Gpu, StreamInterop};

use super::memory_channel::common::{is_gpu_build, ok, test_pattern};
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
        self.stream.as_ref().map_or(0, Gpu::raw_stream)
    }
    /// Waits for the stream (no-op on the host backend).
    pub fn sync(&self) -> Result<(), String> {
        match &self.stream {
            Some(s) => Gpu::stream_synchronize(s, mp_env().timeout).map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }
}

/// The shared collectives of this process, set up by the first test that asks (every rank
/// runs the tests in the same order, so the setup is collective). Skips on a GPU build
/// without a GPU.
pub(crate) fn coll_env() -> &'static CollEnv {
    static ENV: OnceLock<Result<CollEnv, String>> = OnceLock::new();
    let r = ENV.get_or_init(|| {
        let env = mp_env();
        let device = if is_gpu_build() {
            let n = crate::world::visible_gpus().map_err(|r| format!("skip: {r}"))?;
            Device::gpu((env.placement.local_rank % n) as i32)
        } else {
            Device::CPU
        };
        let context = Context::new().map_err(|e| e.to_string())?;
        let comm = Arc::new(Communicator::new(env.bootstrap.clone(), context));
        let cfg = CollectivesConfig {
            device: Some(device),
            host_timeout: env.timeout,
            ..Default::default()
        };
        let coll = Collectives::with_config(comm, cfg)
            .map_err(|e| format!("setting up the collectives: {e}"))?;
        let stream = if is_gpu_build() {
            let dev = Gpu::open_device(device.id as usize).map_err(|e| e.to_string())?;
            Some(Gpu::create_stream(&dev).map_err(|e| e.to_string())?)
        } else {
            None
        };
        Ok(CollEnv {
            coll: Arc::new(coll),
            device,
            stream,
        })
    });
    match r {
        Ok(e) => e,
        Err(msg) if msg.starts_with("skip: ") => SKIP!("{}", &msg[6..]),
        Err(msg) => FAIL!("{}", msg),
    }
}

/// A deterministic value of `dtype` for element `i` of `rank` in call `call`, as f64, in a
/// range where `op` over 8 ranks stays exact (integers) or well-conditioned (floats).
pub(crate) fn gen_value(
    dtype: DataType,
    op: ReduceOp,
    seed: u64,
    call: u32,
    rank: usize,
    i: usize,
) -> f64 {
    let h = test_pattern(seed ^ ((rank as u64) << 40), call, i as u64);
    let unit = f64::from(h % 1024) / 1024.0;
    let v = if dtype.is_float() {
        match op {
            ReduceOp::Prod => 0.5 + unit,
            _ => (unit - 0.5) * 8.0,
        }
    } else {
        let signed = matches!(dtype, DataType::I8 | DataType::I32 | DataType::I64);
        let r = f64::from(h % 16);
        match (op, signed) {
            (ReduceOp::Prod, true) => r - 8.0,
            (ReduceOp::Prod, false) => r,
            (_, true) => r - 8.0,
            (_, false) => r,
        }
    };
    // Round through the type so the reference sees exactly what the kernel sees.
    quantize(dtype, v)
}

/// `v` rounded to `dtype` (what encoding and decoding it gives).
pub(crate) fn quantize(dtype: DataType, v: f64) -> f64 {
    match dtype {
        DataType::F16 => half::f16::from_f64(v).to_f64(),
        DataType::F32 => f64::from(v as f32),
        DataType::F64 => v,
        DataType::Bf16 => half::bf16::from_f64(v).to_f64(),
        DataType::Fp8E4M3 => float8::F8E4M3::from_f64(v).to_f64(),
        DataType::Fp8E5M2 => float8::F8E5M2::from_f64(v).to_f64(),
        _ => v,
    }
}

/// Appends `v` as the bytes of one `dtype` element.
pub(crate) fn encode_into(dtype: DataType, v: f64, out: &mut Vec<u8>) {
    match dtype {
        DataType::I8 => out.extend((v as i8).to_le_bytes()),
        DataType::U8 => out.extend((v as u8).to_le_bytes()),
        DataType::I32 => out.extend((v as i32).to_le_bytes()),
        DataType::U32 => out.extend((v as u32).to_le_bytes()),
        DataType::I64 => out.extend((v as i64).to_le_bytes()),
        DataType::U64 => out.extend((v as u64).to_le_bytes()),
        DataType::F16 => out.extend(half::f16::from_f64(v).to_le_bytes()),
        DataType::F32 => out.extend((v as f32).to_le_bytes()),
        DataType::F64 => out.extend(v.to_le_bytes()),
        DataType::Bf16 => out.extend(half::bf16::from_f64(v).to_le_bytes()),
        DataType::Fp8E4M3 => out.push(float8::F8E4M3::from_f64(v).to_bits()),
        DataType::Fp8E5M2 => out.push(float8::F8E5M2::from_f64(v).to_bits()),
    }
}

/// One `dtype` element at the start of `b` as f64 (integers exactly).
pub(crate) fn decode(dtype: DataType, b: &[u8]) -> f64 {
    let a2 = || [b[0], b[1]];
    let a4 = || [b[0], b[1], b[2], b[3]];
    let a8 = || [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
    match dtype {
        DataType::I8 => f64::from(b[0] as i8),
        DataType::U8 => f64::from(b[0]),
        DataType::I32 => f64::from(i32::from_le_bytes(a4())),
        DataType::U32 => f64::from(u32::from_le_bytes(a4())),
        DataType::I64 => i64::from_le_bytes(a8()) as f64,
        DataType::U64 => u64::from_le_bytes(a8()) as f64,
        DataType::F16 => half::f16::from_le_bytes(a2()).to_f64(),
        DataType::F32 => f64::from(f32::from_le_bytes(a4())),
        DataType::F64 => f64::from_le_bytes(a8()),
        DataType::Bf16 => half::bf16::from_le_bytes(a2()).to_f64(),
        DataType::Fp8E4M3 => float8::F8E4M3::from_bits(b[0]).to_f64(),
        DataType::Fp8E5M2 => float8::F8E5M2::from_bits(b[0]).to_f64(),
    }
}

fn int_bits(dtype: DataType) -> (u32, bool) {
    let signed = matches!(dtype, DataType::I8 | DataType::I32 | DataType::I64);
    ((dtype.size_in_bytes() * 8) as u32, signed)
}

/// Wraps an integer to the width and signedness of `dtype`.
fn wrap(dtype: DataType, v: i128) -> i128 {
    let (bits, signed) = int_bits(dtype);
    let m = v.rem_euclid(1i128 << bits);
    if signed && m >= 1i128 << (bits - 1) {
        m - (1i128 << bits)
    } else {
        m
    }
}

/// The reference reduction of `vals` (one per rank) under `op` for `dtype`.
pub(crate) fn reference(dtype: DataType, op: ReduceOp, vals: &[f64]) -> f64 {
    let n = vals.len();
    if dtype.is_float() {
        let r = match op {
            ReduceOp::Sum | ReduceOp::Avg => vals.iter().sum::<f64>(),
            ReduceOp::Prod => vals.iter().product::<f64>(),
            ReduceOp::Min => vals.iter().copied().fold(f64::INFINITY, f64::min),
            ReduceOp::Max => vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        };
        if op == ReduceOp::Avg {
            r / n as f64
        } else {
            r
        }
    } else {
        let iv: Vec<i128> = vals.iter().map(|v| *v as i128).collect();
        let r = match op {
            ReduceOp::Sum | ReduceOp::Avg => wrap(dtype, iv.iter().sum()),
            ReduceOp::Prod => iv.iter().fold(1i128, |a, b| wrap(dtype, a * b)),
            ReduceOp::Min => *iv.iter().min().unwrap_or(&0),
            ReduceOp::Max => *iv.iter().max().unwrap_or(&0),
        };
        let r = if op == ReduceOp::Avg {
            r / n as i128
        } else {
            r
        };
        r as f64
    }
}

/// Whether `got` matches `want` for `dtype` (integers exactly; floats within what one final
/// rounding to `dtype` after f32 accumulation can lose).
pub(crate) fn close(dtype: DataType, got: f64, want: f64) -> bool {
    let rel = match dtype {
        DataType::F64 => 1e-12,
        DataType::F32 => 1e-5,
        DataType::F16 => 2e-3,
        DataType::Bf16 => 1.6e-2,
        DataType::Fp8E4M3 => 0.13,
        DataType::Fp8E5M2 => 0.26,
        _ => return got == want,
    };
    (got - want).abs() <= rel * want.abs().max(1.0) + 1e-6
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

/// Every rank's values of `count` elements for `call` (index: rank, element).
pub(crate) fn all_values(
    dtype: DataType,
    op: ReduceOp,
    seed: u64,
    call: u32,
    n: usize,
    count: usize,
) -> Vec<Vec<f64>> {
    (0..n)
        .map(|r| {
            (0..count)
                .map(|i| gen_value(dtype, op, seed, call, r, i))
                .collect()
        })
        .collect()
}

/// Writes `vals` as `dtype` elements at element offset `at` of `buf`.
pub(crate) fn write_values(buf: &GpuBuffer<u8>, at: usize, dtype: DataType, vals: &[f64]) {
    let mut bytes = Vec::with_capacity(vals.len() * dtype.size_in_bytes());
    for v in vals {
        encode_into(dtype, *v, &mut bytes);
    }
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
