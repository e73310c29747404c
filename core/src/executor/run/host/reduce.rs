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

    #[test]
    fn sums_and_extremes() {
        let a: [f32; 2] = [1.5, -2.0];
        let b: [f32; 2] = [2.0, 5.0];
        let mut out = [0f32; 2];
        // SAFETY: arrays of 8 bytes.
        unsafe {
            reduce(
                DataType::F32,
                PlanReduceOp::Sum,
                out.as_mut_ptr().cast(),
                &[a.as_ptr().cast(), b.as_ptr().cast()],
                8,
            )
        };
        assert_eq!(out, [3.5, 3.0]);
        let (a, b) = (7u32.to_le_bytes(), 3u32.to_le_bytes());
        let mut out = [0u8; 4];
        // SAFETY: 4-byte arrays.
        unsafe {
            reduce(
                DataType::U32,
                PlanReduceOp::Min,
                out.as_mut_ptr(),
                &[a.as_ptr(), b.as_ptr()],
                4,
            )
        };
        assert_eq!(u32::from_le_bytes(out), 3);
        let (a, b) = ([1u8, 250], [2u8, 10]);
        let mut out = [0u8; 2];
        // SAFETY: 2-byte arrays.
        unsafe {
            reduce(
                DataType::U8,
                PlanReduceOp::Sum,
                out.as_mut_ptr(),
                &[a.as_ptr(), b.as_ptr()],
                2,
            )
        };
        assert_eq!(out, [3, 4], "integers wrap");
    }
}
