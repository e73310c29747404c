//! The test kernels (`kernels/cuda/test_kernels/*.cu`: the FIFO, semaphore, memory-channel and
//! port-channel test kernels of mp_unit_tests and the HAL's `hal_test`), compiled by this
//! crate's build script for the GPU backend the HAL is built with and embedded here, so the
//! library itself ships none. Empty on a host-only build.

include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

/// The code object compiled from `kernels/cuda/test_kernels/<stem>.cu`, if this build has one.
pub fn object(stem: &str) -> Option<&'static [u8]> {
    KERNEL_OBJECTS
        .iter()
        .find(|(s, _)| *s == stem)
        .map(|(_, bytes)| *bytes)
}

/// Stems of every embedded test code object.
pub fn stems() -> impl Iterator<Item = &'static str> {
    KERNEL_OBJECTS.iter().map(|(s, _)| *s)
}
