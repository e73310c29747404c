//! The kernels this crate launches, by typed name: every `kernels/cuda/src/**/*.cu` (the
//! collectives' and the executor's device code) is compiled by `build.rs` for the HAL's GPU
//! backend and embedded here, and named by a module tree generated from the sources.
//!
//! A source `a/b.cu` is the module `a::b`: `OBJECT` (its [`CodeObject`]) and one const per
//! `extern "C"` kernel ([`Kernel`]) or per family of `<base>_<dtype>_<op>` instances
//! ([`Family`], e.g. from `MSCCLPP_COLL_INSTANCES`), named after the kernel or the base in
//! upper case; a source with one kernel or family also has it under the file's name in its
//! folder's module, e.g. [`collectives::allgather::FULLMESH`] or
//! [`collectives::allreduce::RSAG`]`.instance(dtype, op)`. Each folder module has `OBJECTS`,
//! every code object below it. The names are the same on every backend; the host backend (and
//! a build with `MSCCLPP_SKIP_DEVICE_CODE=1`) embeds no code, and a launch then says so.

use crate::collectives::types::{DataType, ReduceOp};
use crate::error::{Error, Result};

/// One compiled source of `kernels/cuda/src` (a fatbin or an AMD code object).
#[derive(Clone, Copy, Debug)]
pub struct CodeObject {
    stem: &'static str,
    code: Option<&'static [u8]>,
}

impl CodeObject {
    /// The object of source `stem` (its path below `kernels/cuda/src` without `.cu`), with
    /// its bytes when this build compiled it.
    pub const fn new(stem: &'static str, code: Option<&'static [u8]>) -> CodeObject {
        CodeObject { stem, code }
    }

    /// The source's path below `kernels/cuda/src` without `.cu` (`collectives/copy`).
    pub const fn stem(&self) -> &'static str {
        self.stem
    }

    /// The embedded bytes (for `Api::load_module`); `None` on the host backend or when device
    /// code was skipped.
    pub const fn code(&self) -> Option<&'static [u8]> {
        self.code
    }
}

/// One `extern "C"` kernel of a code object.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    object: &'static CodeObject,
    name: &'static str,
}

impl Kernel {
    /// Kernel `name` of `object`.
    pub const fn new(object: &'static CodeObject, name: &'static str) -> Kernel {
        Kernel { object, name }
    }

    /// The code object that defines it.
    pub const fn object(&self) -> &'static CodeObject {
        self.object
    }

    /// Its (unmangled) name.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

/// Kernels `<base>_<dtype>_<op>` of one code object: one instance per data type and
/// reduction op the source instantiates.
#[derive(Clone, Copy, Debug)]
pub struct Family {
    object: &'static CodeObject,
    base: &'static str,
    instances: &'static [(&'static str, &'static str, &'static str)],
}

impl Family {
    /// The family `base` of `object` with its `(dtype, op, kernel name)` instances.
    pub const fn new(
        object: &'static CodeObject,
        base: &'static str,
        instances: &'static [(&'static str, &'static str, &'static str)],
    ) -> Family {
        Family {
            object,
            base,
            instances,
        }
    }

    /// The common prefix of the instances' names.
    pub const fn base(&self) -> &'static str {
        self.base
    }

    /// The instance for `dtype` and `op`; an error naming both when the source has none
    /// (e.g. NVLS kernels exist for f32/f16/bf16 sums only).
    pub fn instance(&self, dtype: DataType, op: ReduceOp) -> Result<Kernel> {
        let (d, o) = (dtype.kernel_name(), op.name());
        self.instances
            .iter()
            .find(|(id, io, _)| *id == d && *io == o)
            .map(|(_, _, name)| Kernel::new(self.object, name))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "kernel family `{}` ({}): expected an instance for {d} / {o}, the source instantiates none",
                    self.base, self.object.stem
                ))
            })
    }

    /// Every instance.
    pub fn instances(&self) -> impl Iterator<Item = Kernel> + '_ {
        self.instances
            .iter()
            .map(|(_, _, name)| Kernel::new(self.object, name))
    }
}

include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_generated_for_every_source() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/cuda/src");
        for o in OBJECTS {
            let file = src.join(format!("{}.cu", o.stem()));
            assert!(file.is_file(), "{} names no source", o.stem());
        }
        let in_folder = |list: &[&CodeObject], folder: &str| {
            list.iter()
                .all(|o| std::path::Path::new(o.stem()).starts_with(folder))
        };
        assert!(in_folder(collectives::OBJECTS, "collectives"));
        assert!(in_folder(executor::OBJECTS, "executor"));
        assert!(in_folder(p2p::OBJECTS, "p2p"));
        assert_eq!(
            collectives::OBJECTS.len() + executor::OBJECTS.len() + p2p::OBJECTS.len(),
            OBJECTS.len()
        );
        let fullmesh = collectives::allgather::FULLMESH;
        assert_eq!(fullmesh.name(), "allgather_fullmesh");
        assert_eq!(
            fullmesh.object().stem(),
            collectives::allgather::fullmesh::OBJECT.stem()
        );
        assert!(fullmesh.object().stem().ends_with("allgather/fullmesh"));
        assert_eq!(executor::EXECUTOR.name(), "executor_kernel");
        assert_eq!(collectives::copy::COLL_COPY.name(), "coll_copy");
    }

    #[test]
    fn coll_instances_cover_every_dtype_and_op() {
        // MSCCLPP_COLL_INSTANCES families: every DataType x ReduceOp (build.rs's vocabulary
        // agrees with types.rs).
        for fam in [
            collectives::allreduce::RSAG,
            collectives::allreduce::PACKET,
            collectives::reduce_scatter::FULLMESH,
        ] {
            assert_eq!(
                fam.instances().count(),
                DataType::ALL.len() * ReduceOp::ALL.len()
            );
            for d in DataType::ALL {
                for o in ReduceOp::ALL {
                    let k = fam.instance(d, o).expect("instance");
                    assert_eq!(
                        k.name(),
                        format!("{}_{}_{}", fam.base(), d.kernel_name(), o.name())
                    );
                }
            }
        }
    }

    #[test]
    fn partial_families_refuse_missing_instances() {
        let nvls = collectives::allreduce::NVLS_PACKET;
        assert!(nvls.instance(DataType::F32, ReduceOp::Sum).is_ok());
        let zc = collectives::allreduce::NVLS_ZERO_COPY;
        assert_eq!(zc.instances().count(), 3);
        let err = zc
            .instance(DataType::I8, ReduceOp::Max)
            .expect_err("no i8 max");
        assert!(err.to_string().contains("i8 / max"), "{err}");
        let r2 = collectives::copy::COLL_REDUCE2;
        assert_eq!(
            r2.instance(DataType::Bf16, ReduceOp::Sum)
                .expect("bf16 sum")
                .name(),
            "coll_reduce2_bf16_sum"
        );
    }
}
