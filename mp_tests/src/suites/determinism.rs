//! DeterminismTest: the deterministic mode (`MSCCLPP_DETERMINISTIC`,
//! core/src/collectives/deterministic.rs) on this suite's own `Collectives` (switched on with
//! `set_deterministic`). Random f32/f16/bf16 data (full mantissas, exponents spread over 2^-8
//! to 2^8, so the order of the additions changes the bits: the test checks it does) are summed
//! by every all-reduce algorithm that folds in rank order, forced in turn (across nodes: the
//! mode's `gather_fold`), and by the default choice; every result must equal, bit for bit, the
//! reference fold `((x0 + x1) + x2) ...` in f32 narrowed once. Reduce-scatter likewise. In the
//! mode, forcing an algorithm that adds in another order (NVLS) is refused.

use std::sync::OnceLock;

use half::{bf16, f16};
use mscclpp::collectives::deterministic::{rank_order_names, GATHER_FOLD};
use mscclpp::collectives::{Call, CollectiveKind, CollectivesConfig, DataType, ReduceOp};
use mscclpp::GpuBuffer;
use mscclpp_framework::*;

use super::coll_common::{agreed_seed, at_scale, env_or_skip, new_coll_env, CollEnv};
use super::memory_channel::common::{is_gpu_build, ok};

fn det_env() -> &'static CollEnv {
    static ENV: OnceLock<Result<CollEnv, String>> = OnceLock::new();
    let e = env_or_skip(ENV.get_or_init(|| {
        new_coll_env(
            CollectivesConfig::default(),
            "the deterministic collectives",
        )
    }));
    e.coll.set_deterministic(true);
    e
}

/// The largest count of the tests.
const MAX_COUNT: usize = 40_003;

/// Two device buffers (send, recv) for the whole process, big enough for every call here
/// (allocated once: the zero-copy algorithm maps the ranks' buffers at their first use).
fn buffers(env: &CollEnv, bytes: usize) -> (&'static GpuBuffer<u8>, &'static GpuBuffer<u8>) {
    type Pair = (GpuBuffer<u8>, GpuBuffer<u8>);
    static BUFS: OnceLock<Result<Pair, String>> = OnceLock::new();
    let cap = MAX_COUNT * env.coll.nranks() * 4;
    if bytes > cap {
        FAIL!("{bytes} bytes: the test buffers hold {cap}");
    }
    let r = BUFS.get_or_init(|| {
        let a = || GpuBuffer::<u8>::new(env.device, cap).map_err(|e| e.to_string());
        Ok((a()?, a()?))
    });
    match r {
        Ok((s, r)) => (s, r),
        Err(m) => FAIL!("allocating the test buffers: {m}"),
    }
}

/// A value of rank `rank`, element `i`: random sign, mantissa and exponent in [-8, 8].
fn value(seed: u64, rank: usize, i: usize) -> f32 {
    let mut x = seed
        ^ (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (i as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    let mant = (x & 0xFF_FFFF) as f32 / (1u64 << 24) as f32 + 0.5;
    let exp = ((x >> 24) % 17) as i32 - 8;
    let sign = if (x >> 40) & 1 == 1 { -1.0 } else { 1.0 };
    sign * mant * 2f32.powi(exp)
}

/// `v` in `dtype` (f32, f16, bf16), as bytes.
fn encode(dtype: DataType, v: f32, out: &mut Vec<u8>) {
    match dtype {
        DataType::F16 => out.extend_from_slice(&f16::from_f32(v).to_le_bytes()),
        DataType::Bf16 => out.extend_from_slice(&bf16::from_f32(v).to_le_bytes()),
        _ => out.extend_from_slice(&v.to_le_bytes()),
    }
}

/// Element `b` of `dtype` widened to f32.
fn widen(dtype: DataType, b: &[u8]) -> f32 {
    match dtype {
        DataType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f32(),
        DataType::Bf16 => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
    }
}

/// Every rank's input of `count` elements, as `dtype` bytes (index: rank).
fn inputs(dtype: DataType, seed: u64, n: usize, count: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|r| {
            let mut b = Vec::with_capacity(count * dtype.size_in_bytes());
            for i in 0..count {
                encode(dtype, value(seed, r, i), &mut b);
            }
            b
        })
        .collect()
}

/// The reference: element `i` folded over the ranks in `order` in f32, narrowed once.
fn fold(dtype: DataType, ins: &[Vec<u8>], i: usize, order: impl Iterator<Item = usize>) -> Vec<u8> {
    let s = dtype.size_in_bytes();
    let mut acc: Option<f32> = None;
    for r in order {
        let v = widen(dtype, &ins[r][i * s..(i + 1) * s]);
        acc = Some(match acc {
            None => v,
            Some(a) => a + v,
        });
    }
    let mut out = Vec::with_capacity(s);
    encode(dtype, acc.unwrap_or(0.0), &mut out);
    out
}

const DTYPES: [DataType; 3] = [DataType::F32, DataType::F16, DataType::Bf16];

/// Runs `call` with `name` (`None`: the mode's own choice) on `env`; `Ok(false)` when the
/// algorithm refuses the size (its check).
fn run(env: &CollEnv, call: &Call, name: Option<&str>) -> Result<bool, String> {
    let choice = match name {
        Some(n) => match env.coll.choose_named(call, n) {
            Ok(c) => c,
            Err(e) if e.to_string().contains("expected") => return Ok(false),
            Err(e) => return Err(e.to_string()),
        },
        None => env.coll.choose(call).map_err(|e| e.to_string())?,
    };
    // SAFETY: the caller's buffers hold the call's elements until the stream is synchronised.
    unsafe { env.coll.run_choice(&choice, env.raw_stream()) }.map_err(|e| e.to_string())?;
    env.sync()?;
    Ok(true)
}

/// Every rank-order algorithm of `kind` (and the default choice) on random data of each type,
/// bitwise against the reference fold.
fn bitwise(kind: CollectiveKind) {
    let env = det_env();
    let (rank, n) = (env.coll.rank(), env.coll.nranks());
    if n < 2 {
        SKIP!("needs at least 2 ranks (one rank copies)");
    }
    let spans = env.coll.resources().topo().nnodes > 1;
    if spans && is_gpu_build() {
        SKIP!("across nodes the mode's gather_fold runs on the host backend only (GPU: refused)");
    }
    let mut names: Vec<Option<&str>> = vec![None];
    if !spans {
        let all = rank_order_names(kind).unwrap_or(&[]);
        names.extend(all.iter().filter(|&&a| a != "copy").map(|&a| Some(a)));
    }
    let seed = agreed_seed();
    let counts: &[usize] = if at_scale(n) {
        &[4099]
    } else {
        &[1027, MAX_COUNT]
    };
    let mut ran = 0;
    let mut ran_names: Vec<&str> = Vec::new();
    let mut order_matters = 0;
    let mut bad = Vec::new();
    for &dtype in &DTYPES {
        for &count in counts {
            let s = dtype.size_in_bytes();
            let total = if kind == CollectiveKind::ReduceScatter {
                count * n
            } else {
                count
            };
            let ins = inputs(dtype, seed ^ count as u64, n, total);
            let window = if kind == CollectiveKind::ReduceScatter {
                rank * count
            } else {
                0
            };
            let want: Vec<u8> = (window..window + count)
                .flat_map(|i| fold(dtype, &ins, i, 0..n))
                .collect();
            if dtype == DataType::F32 && n > 2 {
                order_matters += (window..window + count)
                    .filter(|&i| fold(dtype, &ins, i, (0..n).rev()) != fold(dtype, &ins, i, 0..n))
                    .count();
            }
            let (send, recv) = buffers(env, total * s);
            for name in &names {
                ok!(send.copy_from_host(0, &ins[rank]), "writing the input");
                ok!(recv.copy_from_host(0, &vec![0xA5; count * s]), "poisoning");
                let call = Call {
                    kind,
                    send: send.data(),
                    recv: recv.data(),
                    count,
                    dtype,
                    op: ReduceOp::Sum,
                    root: 0,
                };
                let label = name.unwrap_or("the mode's choice");
                match run(env, &call, *name) {
                    Ok(true) => {
                        ran += 1;
                        if !ran_names.contains(&label) {
                            ran_names.push(label);
                        }
                    }
                    Ok(false) => continue,
                    Err(e) => FAIL!("{kind} {label} of {count} {dtype}: {e}"),
                }
                let mut got = vec![0u8; count * s];
                ok!(recv.copy_to_host(0, &mut got), "reading the result");
                if let Some(i) =
                    (0..count).find(|&i| got[i * s..(i + 1) * s] != want[i * s..(i + 1) * s])
                {
                    bad.push(format!(
                        "{label} {count} {dtype}: element {} got {:?}, the rank-order fold is {:?}",
                        window + i,
                        &got[i * s..(i + 1) * s],
                        &want[i * s..(i + 1) * s]
                    ));
                }
            }
        }
    }
    EXPECT_GE!(ran, DTYPES.len(), "calls that ran");
    if rank == 0 {
        println!(
            "{kind}: {ran} calls bitwise-checked, through {}",
            ran_names.join(", ")
        );
    }
    if n > 2 {
        // (Two ranks: a + b == b + a, every order gives the same bits.)
        EXPECT_GT!(
            order_matters,
            0,
            "elements whose f32 sum depends on the order (the data must tell)"
        );
    }
    EXPECT_TRUE!(bad.is_empty(), "rank {rank}: {}", bad.join("; "));
}

TEST!(
    DeterminismTest,
    AllReduceEveryAlgorithmBitwiseEqual,
    |_ctx| {
        let kind = CollectiveKind::AllReduce;
        bitwise(kind);
    }
);

TEST!(DeterminismTest, ReduceScatterBitwiseEqual, |_ctx| {
    let kind = CollectiveKind::ReduceScatter;
    bitwise(kind);
});

TEST!(DeterminismTest, OtherOrdersRefused, |_ctx| {
    let env = det_env();
    if env.coll.nranks() < 2 {
        SKIP!("needs at least 2 ranks");
    }
    let kind = CollectiveKind::AllReduce;
    if env.coll.resources().topo().nnodes > 1 {
        let got = ok!(env.coll.algorithm_for(kind, 1 << 20), "selecting");
        EXPECT_EQ!(got, GATHER_FOLD, "across nodes the mode folds by gathering");
        return;
    }
    ok!(
        env.coll.force_algorithm(kind, Some("nvls_packet")),
        "forcing nvls_packet"
    );
    let got = env.coll.algorithm_for(kind, 1024);
    ok!(env.coll.force_algorithm(kind, None), "un-forcing");
    match got {
        Ok(a) => FAIL!("nvls_packet forced in the deterministic mode gave {a}"),
        Err(e) => {
            let m = e.to_string();
            EXPECT_TRUE!(
                m.contains("MSCCLPP_DETERMINISTIC") && m.contains("rsag"),
                "{m}"
            );
        }
    }
    for bytes in [1024usize, 1 << 20, 64 << 20] {
        let a = ok!(env.coll.algorithm_for(kind, bytes), "selecting");
        EXPECT_TRUE!(
            rank_order_names(kind).unwrap_or(&[]).contains(&a),
            "{bytes} bytes: {a}"
        );
    }
});
