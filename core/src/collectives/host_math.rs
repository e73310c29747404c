//! Element arithmetic of the host backend's collectives: the same rules as the kernels'
//! `common.hpp` (integers wrap, f16/bf16/fp8 accumulate in f32, avg = sum / nranks at the end).
//!
//! f16/bf16 come from the `half` crate, fp8 e4m3/e5m2 from the `float8` crate (saturating
//! conversions, as CUDA's `__nv_fp8_*` constructors).

use super::types::ReduceOp;

/// An element type the host collectives reduce.
pub(crate) trait HostElem: Copy + Send + Sync + 'static {
    /// The accumulator type.
    type Acc: Copy;
    /// Widens to the accumulator.
    fn to_acc(self) -> Self::Acc;
    /// Narrows from the accumulator.
    fn from_acc(a: Self::Acc) -> Self;
    /// `a op b` (Avg accumulates as Sum).
    fn combine(op: ReduceOp, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// The final step of Avg: `a / n`.
    fn div(a: Self::Acc, n: usize) -> Self::Acc;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl HostElem for $t {
            type Acc = $t;
            fn to_acc(self) -> $t { self }
            fn from_acc(a: $t) -> $t { a }
            fn combine(op: ReduceOp, a: $t, b: $t) -> $t {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                }
            }
            fn div(a: $t, n: usize) -> $t { a.wrapping_div(n as $t) }
        }
    )*};
}
int_elem!(i8, u8, i32, u32, i64, u64);

macro_rules! float_elem {
    ($t:ty, $acc:ty, $to:expr, $from:expr) => {
        impl HostElem for $t {
            type Acc = $acc;
            fn to_acc(self) -> $acc {
                $to(self)
            }
            fn from_acc(a: $acc) -> $t {
                $from(a)
            }
            fn combine(op: ReduceOp, a: $acc, b: $acc) -> $acc {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + b,
                    ReduceOp::Prod => a * b,
                    // As the kernels: `a < b ? a : b` (NaN handling as CUDA's fminf is not needed).
                    ReduceOp::Min => {
                        if b < a {
                            b
                        } else {
                            a
                        }
                    }
                    ReduceOp::Max => {
                        if b > a {
                            b
                        } else {
                            a
                        }
                    }
                }
            }
            fn div(a: $acc, n: usize) -> $acc {
                a / (n as $acc)
            }
        }
    };
}
float_elem!(f32, f32, |x| x, |a| a);
float_elem!(f64, f64, |x| x, |a| a);
float_elem!(half::f16, f32, half::f16::to_f32, half::f16::from_f32);
float_elem!(half::bf16, f32, half::bf16::to_f32, half::bf16::from_f32);
float_elem!(
    float8::F8E4M3,
    f32,
    |x: float8::F8E4M3| x.to_f32(),
    float8::F8E4M3::from_f32
);
float_elem!(
    float8::F8E5M2,
    f32,
    |x: float8::F8E5M2| x.to_f32(),
    float8::F8E5M2::from_f32
);

/// `match $dtype` with one arm per listed data type, which runs `$body` with `$T` bound to the
/// type listed with it, then the `$rest` arms (where the list is not every type).
macro_rules! bind_dtype {
    ($dtype:expr, $T:ident => $body:expr; $($v:ident: $ty:ty),+ $(; $($rest:tt)+)?) => {
        match $dtype {
            $(
                $crate::collectives::DataType::$v => {
                    type $T = $ty;
                    $body
                }
            )+
            $($($rest)+)?
        }
    };
}
pub(crate) use bind_dtype;

/// Runs `$body` with `$T` bound to the Rust type of `$dtype`.
macro_rules! with_elem {
    ($dtype:expr, $T:ident => $body:expr) => {
        $crate::collectives::host_math::bind_dtype!($dtype, $T => $body;
            I8: i8, U8: u8, I32: i32, U32: u32, I64: i64, U64: u64,
            F16: half::f16, F32: f32, F64: f64, Bf16: half::bf16,
            Fp8E4M3: float8::F8E4M3, Fp8E5M2: float8::F8E5M2)
    };
}
pub(crate) use with_elem;

/// `srcs[0][i] op srcs[1][i] op ...` in source order, each element widened by `widen` (Avg
/// accumulates as Sum).
///
/// # Safety
/// Every source is readable at element `i` (unaligned is fine); `srcs` is not empty.
unsafe fn fold_at<S: Copy, T: HostElem>(
    op: ReduceOp,
    srcs: &[*const S],
    i: usize,
    widen: impl Fn(S) -> T::Acc,
) -> T::Acc {
    // SAFETY: the caller's contract.
    unsafe {
        let mut acc = widen(srcs[0].add(i).read_unaligned());
        for p in &srcs[1..] {
            acc = T::combine(op, acc, widen(p.add(i).read_unaligned()));
        }
        acc
    }
}

/// The element of a folded accumulator: Avg's division by `nranks`, then the narrowing.
fn finish<T: HostElem>(op: ReduceOp, nranks: usize, acc: T::Acc) -> T {
    T::from_acc(if op == ReduceOp::Avg {
        T::div(acc, nranks)
    } else {
        acc
    })
}

/// Reduces `n` elements: `out[i] = fold(op, inputs[0][i], inputs[1][i], ...)` in the order
/// given, then Avg's division. `out` may alias one of the inputs.
///
/// # Safety
/// Every input is readable and `out` writable for `n` elements of `T` (unaligned is fine).
pub(crate) unsafe fn reduce_into<T: HostElem>(
    op: ReduceOp,
    nranks: usize,
    out: *mut T,
    inputs: &[*const T],
    n: usize,
) {
    for i in 0..n {
        // SAFETY: the caller's contract; i < n.
        unsafe {
            let acc = fold_at::<T, T>(op, inputs, i, T::to_acc);
            out.add(i).write_unaligned(finish::<T>(op, nranks, acc));
        }
    }
}

/// `dst[i] = srcs[0][i] op srcs[1][i] op ...` for `elems` elements, kept in the accumulation
/// type (the partials of the hierarchical collectives, collectives/hier.rs).
///
/// # Safety
/// Every source holds `elems` readable elements, `dst` as many writable accumulators.
pub(crate) unsafe fn reduce_to_acc<T: HostElem>(
    op: ReduceOp,
    srcs: &[*const T],
    dst: *mut T::Acc,
    elems: usize,
) {
    for i in 0..elems {
        // SAFETY: the caller's contract; i < elems.
        unsafe {
            dst.add(i)
                .write_unaligned(fold_at::<T, T>(op, srcs, i, T::to_acc))
        };
    }
}

/// `dst[i] = srcs[0][i] op srcs[1][i] op ...` for `elems` accumulators, in source order, then
/// Avg's division by `nranks` and the narrowing to `T` (the final step of the hierarchical
/// collectives over their partials).
///
/// # Safety
/// Every source holds `elems` readable accumulators, `dst` as many writable elements.
pub(crate) unsafe fn reduce_from_acc<T: HostElem>(
    op: ReduceOp,
    nranks: usize,
    srcs: &[*const T::Acc],
    dst: *mut T,
    elems: usize,
) {
    for i in 0..elems {
        // SAFETY: the caller's contract; i < elems.
        unsafe {
            let acc = fold_at::<T::Acc, T>(op, srcs, i, |a| a);
            dst.add(i).write_unaligned(finish::<T>(op, nranks, acc));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_rules() {
        assert_eq!(u8::combine(ReduceOp::Sum, 200, 100), 44);
        assert_eq!(i8::combine(ReduceOp::Prod, 100, 3), 44);
        assert_eq!(i32::div(-7, 2), -3);
        assert_eq!(i64::combine(ReduceOp::Min, -1, 5), -1);
    }

    #[test]
    fn reduce_avg_f16() {
        let a = [half::f16::from_f32(1.0), half::f16::from_f32(2.0)];
        let b = [half::f16::from_f32(3.0), half::f16::from_f32(6.0)];
        let mut out = [half::f16::ZERO; 2];
        // SAFETY: arrays of 2 elements.
        unsafe {
            reduce_into(
                ReduceOp::Avg,
                2,
                out.as_mut_ptr(),
                &[a.as_ptr(), b.as_ptr()],
                2,
            )
        };
        assert_eq!(out[0].to_f32(), 2.0);
        assert_eq!(out[1].to_f32(), 4.0);
        let x = float8::F8E4M3::from_f32(1000.0);
        assert_eq!(x.to_f32(), 448.0, "e4m3 saturates");
    }
}
