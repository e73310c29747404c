//! Host code objects: none; kernel launch is unsupported on the host backend
//! ([`crate::ModuleApi`] for [`Host`]).

use super::{Host, HostStream};
use crate::{LaunchConfig, ModuleApi, Result};

/// Never constructed: the host backend loads no code objects.
#[derive(Debug)]
pub struct HostModule(());

/// Never constructed: the host backend has no kernels.
#[derive(Clone, Debug)]
pub struct HostKernel(());

fn unsupported<T>(op: &'static str) -> Result<T> {
    crate::unsupported(op, "host", "the host backend runs no device code")
}

impl ModuleApi for Host {
    fn load_module(_dev: &super::HostDevice, _code: &[u8]) -> Result<HostModule> {
        unsupported("load_module")
    }
    fn get_kernel(_module: &HostModule, _name: &str) -> Result<HostKernel> {
        unsupported("get_kernel")
    }
    unsafe fn launch_raw(
        _kernel: &HostKernel,
        _cfg: &LaunchConfig,
        _stream: &HostStream,
        _args: &[u8],
    ) -> Result<()> {
        unsupported("launch")
    }
}
