//! Host code objects: none; kernel launch is unsupported on the host backend.

use crate::{Error, Result};

/// Never constructed: the host backend loads no code objects.
#[derive(Debug)]
pub struct HostModule(());

/// Never constructed: the host backend has no kernels.
#[derive(Clone, Debug)]
pub struct HostKernel(());

pub(super) fn unsupported<T>(op: &'static str) -> Result<T> {
    Err(Error::Unsupported {
        op,
        backend: "host",
        reason: "the host backend runs no device code".into(),
    })
}
