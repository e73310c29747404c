//! Device code objects compiled by build.rs (nvcc fatbins or hipcc code objects), embedded.
//!
//! Only kernels the library launches (test kernels are in mscclpp-test-kernels); empty on a
//! host-only build and until the first library kernel lands.

include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

/// The code object compiled from `kernels/cuda/src/<stem>.cu` (a subfolder source is
/// `folder/stem`), if this build has one.
pub fn object(stem: &str) -> Option<&'static [u8]> {
    KERNEL_OBJECTS
        .iter()
        .find(|(s, _)| *s == stem)
        .map(|(_, bytes)| *bytes)
}

/// Stems of every embedded code object.
pub fn stems() -> impl Iterator<Item = &'static str> {
    KERNEL_OBJECTS.iter().map(|(s, _)| *s)
}
