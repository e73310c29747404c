//! Element-wise reductions of the host interpreter, on raw bytes of a [`DataType`], with the
//! collectives' element rules ([`crate::collectives::host_math`]: integers wrap, 16-bit and
//! fp8 floats accumulate in f32 per step).

use crate::collectives::host_math::{reduce_into, with_elem};
use crate::collectives::{DataType, ReduceOp};
use crate::executor::json::PlanReduceOp;

/// The collectives' operation for a plan's `reduce_op`.
pub(crate) fn op_of(op: PlanReduceOp) -> ReduceOp {
    match op {
        PlanReduceOp::Sum => ReduceOp::Sum,
        PlanReduceOp::Min => ReduceOp::Min,
        PlanReduceOp::Max => ReduceOp::Max,
    }
}

/// `out[i] = op(inputs[0][i], inputs[1][i], ...)` for `bytes / dtype size` elements. `out`
/// may alias an input.
///
/// # Safety
/// Every input is readable and `out` writable for `bytes`.
pub(crate) unsafe fn reduce(
    dtype: DataType,
    op: PlanReduceOp,
    out: *mut u8,
    inputs: &[*const u8],
    bytes: usize,
) {
    let op = op_of(op);
    let n = bytes / dtype.size_in_bytes();
    with_elem!(dtype, T => {
        let ins: Vec<*const T> = inputs.iter().map(|p| p.cast::<T>()).collect();
        // SAFETY: forwarded from the caller; n elements fit in `bytes`.
        unsafe { reduce_into::<T>(op, 1, out.cast::<T>(), &ins, n) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `op(a, b)` over the bytes of two equal-length inputs.
    fn reduce2(dtype: DataType, op: PlanReduceOp, a: &[u8], b: &[u8]) -> Vec<u8> {
        assert_eq!(a.len(), b.len());
        let mut out = vec![0u8; a.len()];
        // SAFETY: `out`, `a` and `b` all hold `a.len()` bytes.
        unsafe {
            reduce(
                dtype,
                op,
                out.as_mut_ptr(),
                &[a.as_ptr(), b.as_ptr()],
                a.len(),
            )
        };
        out
    }

    #[test]
    fn sums_and_extremes() {
        let f32s = |v: [f32; 2]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let out = reduce2(
            DataType::F32,
            PlanReduceOp::Sum,
            &f32s([1.5, -2.0]),
            &f32s([2.0, 5.0]),
        );
        assert_eq!(out, f32s([3.5, 3.0]));
        let out = reduce2(
            DataType::U32,
            PlanReduceOp::Min,
            &7u32.to_le_bytes(),
            &3u32.to_le_bytes(),
        );
        assert_eq!(out, 3u32.to_le_bytes());
        let out = reduce2(DataType::U8, PlanReduceOp::Sum, &[1, 250], &[2, 10]);
        assert_eq!(out, [3, 4], "integers wrap");
    }
}
