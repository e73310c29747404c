//! Checks of the C arguments every kind of call shares: element types, byte sizes that must
//! not overflow, non-NULL buffers and rank numbers. Each failure is an `ncclInvalidArgument`
//! naming the argument and what was expected.

use std::ffi::c_int;

use crate::abi;
use crate::error::{NResult, NcclError};

/// Element size of `dtype`, or `ncclInvalidArgument`.
pub fn elem_size(dtype: c_int) -> NResult<usize> {
    abi::type_size(dtype).ok_or_else(|| {
        NcclError::arg(format!(
            "datatype {dtype}: expected an ncclDataType_t in 0..{} (ncclInt8 .. ncclFloat8e5m2)",
            abi::NUM_TYPES
        ))
    })
}

/// `count * size(dtype) * factor` bytes, or `ncclInvalidArgument` when it overflows.
pub fn byte_len(what: &str, count: usize, dtype: c_int, factor: usize) -> NResult<usize> {
    let size = elem_size(dtype)?;
    count
        .checked_mul(size)
        .and_then(|b| b.checked_mul(factor))
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            NcclError::arg(format!(
                "{what}: count {count} of {} x {factor} overflows the address space: expected \
                 a count whose byte size fits in isize",
                abi::type_name(dtype)
            ))
        })
}

/// `ncclInvalidArgument` unless `ptr` is non-NULL (when `bytes > 0`).
pub fn need_ptr(name: &str, ptr: u64, bytes: usize) -> NResult<()> {
    if ptr == 0 && bytes > 0 {
        return Err(NcclError::arg(format!(
            "{name} is NULL: expected a buffer of {bytes} bytes"
        )));
    }
    Ok(())
}

/// `ncclInvalidArgument` unless `rank` names one of `nranks` ranks.
pub fn check_rank(what: &str, rank: c_int, nranks: usize) -> NResult<usize> {
    usize::try_from(rank)
        .ok()
        .filter(|&r| r < nranks)
        .ok_or_else(|| NcclError::arg(format!("{what} {rank}: expected a rank in 0..{nranks}")))
}

/// `ncclInvalidArgument` unless the output pointer `p` (argument `name`) is non-NULL.
pub fn out<T>(name: &str, p: *mut T) -> NResult<*mut T> {
    if p.is_null() {
        Err(NcclError::arg(format!(
            "{name} is NULL: expected a pointer to write the result to"
        )))
    } else {
        Ok(p)
    }
}
