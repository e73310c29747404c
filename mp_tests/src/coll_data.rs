//! Data of the collective checks, shared by the suites and `coll_perf`: deterministic values
//! per (seed, call, rank, element) in ranges where every op stays exact (integers) or well
//! conditioned (floats), their encoding, the f64 / exact reference and the tolerance.

use mscclpp::collectives::{DataType, ReduceOp};

/// A 32-bit mix of the inputs (the suites' `test_pattern` hash).
fn mix(seed: u64, call: u32, i: u64) -> u32 {
    let mut x = (seed as u32)
        ^ ((seed >> 32) as u32)
        ^ call.wrapping_mul(0x9E37_79B9)
        ^ (i as u32).wrapping_mul(0x85EB_CA6B)
        ^ ((i >> 32) as u32).wrapping_mul(0xC2B2_AE35);
    x ^= x >> 16;
    x = x.wrapping_mul(0x7FEB_352D);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846C_A68B);
    x ^= x >> 16;
    x
}

/// A deterministic value of `dtype` for element `i` of `rank` in call `call`, as f64, in a
/// range where `op` over 8 ranks stays exact (integers) or well-conditioned (floats).
pub fn gen_value(
    dtype: DataType,
    op: ReduceOp,
    seed: u64,
    call: u32,
    rank: usize,
    i: usize,
) -> f64 {
    value_of(dtype, op, per_rank(mix(seed, call, i as u64), rank))
}

/// The per-rank hash derived from an element's hash (one multiply: cheap, so the reference,
/// which needs every rank's value of every element, costs one `mix` per element).
fn per_rank(h: u32, rank: usize) -> u32 {
    let x = (h ^ (rank as u32).wrapping_mul(0x9E37_79B9)).wrapping_mul(0x85EB_CA6B);
    x ^ (x >> 15)
}

fn value_of(dtype: DataType, op: ReduceOp, h: u32) -> f64 {
    let unit = f64::from(h % 1024) / 1024.0;
    let v = if dtype.is_float() {
        match op {
            ReduceOp::Prod => 0.5 + unit,
            _ => (unit - 0.5) * 8.0,
        }
    } else {
        let signed = matches!(dtype, DataType::I8 | DataType::I32 | DataType::I64);
        let r = f64::from(h % 16);
        if signed {
            r - 8.0
        } else {
            r
        }
    };
    // Round through the type so the reference sees exactly what the kernel sees.
    quantize(dtype, v)
}

/// `v` rounded to `dtype` (what encoding and decoding it gives).
pub fn quantize(dtype: DataType, v: f64) -> f64 {
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
pub fn encode_into(dtype: DataType, v: f64, out: &mut Vec<u8>) {
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
pub fn decode(dtype: DataType, b: &[u8]) -> f64 {
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
pub fn reference(dtype: DataType, op: ReduceOp, vals: &[f64]) -> f64 {
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
        let iv = vals.iter().map(|v| *v as i128);
        let r = match op {
            ReduceOp::Sum | ReduceOp::Avg => wrap(dtype, iv.sum()),
            ReduceOp::Prod => iv.fold(1i128, |a, b| wrap(dtype, a * b)),
            ReduceOp::Min => iv.min().unwrap_or(0),
            ReduceOp::Max => iv.max().unwrap_or(0),
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
pub fn close(dtype: DataType, got: f64, want: f64) -> bool {
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

/// Every rank's values of `count` elements for `call` (index: rank, element).
pub fn all_values(
    dtype: DataType,
    op: ReduceOp,
    seed: u64,
    call: u32,
    n: usize,
    count: usize,
) -> Vec<Vec<f64>> {
    values_in(dtype, op, seed, call, n, 0..count)
}

/// Every rank's values of the elements in `range` only (index: rank, element - range.start):
/// what [`all_values`] holds there. A reduce-scatter rank checks only its own window, so it
/// needs n x count values, not n x n x count (at 16 ranks, most of a call's time).
pub fn values_in(
    dtype: DataType,
    op: ReduceOp,
    seed: u64,
    call: u32,
    n: usize,
    range: std::ops::Range<usize>,
) -> Vec<Vec<f64>> {
    let mut out = vec![Vec::with_capacity(range.len()); n];
    for i in range {
        let h = mix(seed, call, i as u64);
        for (r, v) in out.iter_mut().enumerate() {
            v.push(value_of(dtype, op, per_rank(h, r)));
        }
    }
    out
}

/// The values of `rank` alone: `all_values(..)[rank]`.
pub fn rank_values(
    dtype: DataType,
    op: ReduceOp,
    seed: u64,
    call: u32,
    rank: usize,
    count: usize,
) -> Vec<f64> {
    (0..count)
        .map(|i| value_of(dtype, op, per_rank(mix(seed, call, i as u64), rank)))
        .collect()
}

/// `vals` as the bytes of `dtype` elements.
pub fn encode_all(dtype: DataType, vals: &[f64]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(vals.len() * dtype.size_in_bytes());
    for v in vals {
        encode_into(dtype, *v, &mut bytes);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_single_ranks_match_all_values() {
        for (dtype, op) in [
            (DataType::F16, ReduceOp::Sum),
            (DataType::I32, ReduceOp::Prod),
            (DataType::U8, ReduceOp::Max),
        ] {
            let (n, count) = (5, 37);
            let all = all_values(dtype, op, 42, 7, n, count);
            let win = values_in(dtype, op, 42, 7, n, 10..19);
            for r in 0..n {
                assert_eq!(win[r], all[r][10..19], "rank {r} {dtype} {op}");
                assert_eq!(rank_values(dtype, op, 42, 7, r, count), all[r]);
            }
            // Another call gives other values.
            assert_ne!(all_values(dtype, op, 42, 8, n, count), all);
        }
    }
}
