//! The native paths: `mscclpp::collectives` (which also does world size 1 as a copy), plus
//! the mapping of NCCL's calls onto it (`ncclReduce` = all-reduce whose non-root ranks write a
//! scratch buffer; `ncclBcast` = in-place broadcast).
//!
//! [`Native::supports`] asks the selector and the chosen algorithm's own check before a call
//! is routed, so a call no algorithm covers goes to the fallback instead of failing late. The
//! answer depends only on the collective, sizes, types and the world (never on which rank
//! asks), so every rank routes alike.

use std::ffi::c_int;
use std::sync::{Arc, Mutex};

use mscclpp::collectives::{
    Call, CollectiveKind, Collectives, CollectivesConfig, DataType, ReduceOp,
};
use mscclpp::{Communicator, Device, LocalMemory};
use mscclpp_hal::prelude::*;
use mscclpp_hal::{Gpu, StreamInterop};

use crate::error::{NResult, NcclError};
use crate::options::Op;

/// One collective call, its arguments checked.
#[derive(Clone, Copy, Debug)]
pub struct CollArgs {
    /// Which collective.
    pub op: Op,
    /// Send buffer (device address; host address on the host backend).
    pub send: u64,
    /// Receive buffer.
    pub recv: u64,
    /// NCCL's count argument (per rank for all-gather and reduce-scatter).
    pub count: usize,
    /// `ncclDataType_t`.
    pub dtype: c_int,
    /// `ncclRedOp_t` (reductions only).
    pub redop: c_int,
    /// Root rank (broadcast, reduce).
    pub root: usize,
    /// The caller's stream (`cudaStream_t` as an integer).
    pub stream: u64,
}

/// `ncclDataType_t` -> the collectives' type.
pub fn data_type(v: c_int) -> Option<DataType> {
    Some(match v {
        0 => DataType::I8,
        1 => DataType::U8,
        2 => DataType::I32,
        3 => DataType::U32,
        4 => DataType::I64,
        5 => DataType::U64,
        6 => DataType::F16,
        7 => DataType::F32,
        8 => DataType::F64,
        9 => DataType::Bf16,
        10 => DataType::Fp8E4M3,
        11 => DataType::Fp8E5M2,
        _ => return None,
    })
}

/// A built-in `ncclRedOp_t` -> the collectives' op.
pub fn reduce_op(v: c_int) -> Option<ReduceOp> {
    Some(match v {
        0 => ReduceOp::Sum,
        1 => ReduceOp::Prod,
        2 => ReduceOp::Max,
        3 => ReduceOp::Min,
        4 => ReduceOp::Avg,
        _ => return None,
    })
}

/// The native state of one communicator.
pub struct Native {
    rank: usize,
    coll: Result<Collectives, String>,
    device: Device,
    /// The opened GPU (None on the host backend), for stream copies.
    gpu: Option<<Gpu as Api>::Device>,
    /// Where non-root ranks of `ncclReduce` put the all-reduce result (grown outside capture).
    reduce_scratch: Mutex<Option<LocalMemory>>,
}

/// Whether a GPU communicator spanning hosts gets the hierarchical collectives: yes, over IB
/// and over Ethernet (whose GPU ranks stage the network bytes and signals in host-mapped
/// memory, so the transport threads make no CUDA call a blocked application thread could
/// hold up; collectives/net.rs). `MSCCLPP_NCCL_GPU_HIERARCHICAL=0` leaves them to the fallback
/// NCCL, `1` (or unset) runs them; anything else is an error naming the variable. The network
/// transport's variable is checked here too, so a wrong value fails the communicator's
/// creation with its name.
fn gpu_hier_enabled() -> NResult<Result<(), String>> {
    match std::env::var("MSCCLPP_NCCL_GPU_HIERARCHICAL").as_deref() {
        Ok("0") => Ok(Err("MSCCLPP_NCCL_GPU_HIERARCHICAL=0".into())),
        Ok("1") | Ok("") | Err(_) => {
            let env = std::env::var(mscclpp::collectives::net::NET_TRANSPORT_ENV).ok();
            mscclpp::collectives::net::pick_transport(env.as_deref()).map_err(NcclError::from)?;
            Ok(Ok(()))
        }
        Ok(v) => Err(NcclError::usage(format!(
            "MSCCLPP_NCCL_GPU_HIERARCHICAL: expected 0 or 1, got {v:?}"
        ))),
    }
}

impl Native {
    /// Sets up the collectives (collective over the communicator). A communicator spanning
    /// hosts gets the hierarchical algorithms (on GPUs as `gpu_hier_enabled` says; without
    /// them its collectives go to the fallback).
    pub fn new(communicator: &Arc<Communicator>, device: Device) -> NResult<Native> {
        let b = communicator.bootstrap();
        let (rank, n, per_node) = (b.rank(), b.nranks(), b.nranks_per_node());
        let cfg = CollectivesConfig {
            device: Some(device),
            ..CollectivesConfig::default()
        };
        let coll = if per_node == n {
            Ok(Collectives::with_config(communicator.clone(), cfg)
                .map_err(|e| NcclError::from(e).context("setting up the collectives"))?)
        } else if let (mscclpp::DeviceType::Gpu, Err(why)) = (device.kind, gpu_hier_enabled()?) {
            // Every rank takes this branch alike (the variables must be set alike on every
            // rank, as for the collectives' own transport choice), so no rank is left waiting
            // in a collective setup.
            Err(format!(
                "the hierarchical (multi-node) collectives are off on this GPU communicator \
                 ({per_node} of its {n} ranks on this host): {why}"
            ))
        } else {
            // Across nodes: the hierarchical algorithms (memory channels inside the node, port
            // channels between nodes). A failed setup leaves the collectives to the fallback;
            // MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION still sends chosen operations there.
            Collectives::with_config(communicator.clone(), cfg).map_err(|e| {
                format!("setting up the hierarchical collectives ({per_node} of {n} ranks on this host): {e}")
            })
        };
        let gpu = match device.kind {
            mscclpp::DeviceType::Gpu => {
                Some(Gpu::open_device(device.id.max(0) as usize).map_err(|e| {
                    NcclError::from(mscclpp::Error::from(e)).context("opening the GPU")
                })?)
            }
            mscclpp::DeviceType::Cpu => None,
        };
        Ok(Native {
            rank,
            coll,
            device,
            gpu,
            reduce_scratch: Mutex::new(None),
        })
    }

    /// `Ok` when the collectives are set up, else why not.
    pub fn available(&self) -> Result<(), String> {
        self.coll.as_ref().map(|_| ()).map_err(Clone::clone)
    }

    fn call_of(args: &CollArgs) -> Result<Call, String> {
        let kind = match args.op {
            Op::AllReduce | Op::Reduce => CollectiveKind::AllReduce,
            Op::AllGather => CollectiveKind::AllGather,
            Op::ReduceScatter => CollectiveKind::ReduceScatter,
            Op::Broadcast => CollectiveKind::Broadcast,
            other => return Err(format!("{} is not a collective", other.name())),
        };
        let dtype = data_type(args.dtype)
            .ok_or_else(|| format!("datatype {} has no native type", args.dtype))?;
        let op = match args.op {
            Op::AllReduce | Op::Reduce | Op::ReduceScatter => {
                reduce_op(args.redop).ok_or_else(|| {
                    "custom reduction operators (ncclRedOpCreatePreMulSum) have no native path"
                        .to_string()
                })?
            }
            _ => ReduceOp::Sum,
        };
        Ok(Call {
            kind,
            send: args.send,
            recv: args.recv,
            count: args.count,
            dtype,
            op,
            root: args.root,
        })
    }

    /// `Ok` when a native path covers `args`, else why not (the fallback then takes it).
    pub fn supports(&self, args: &CollArgs) -> Result<(), String> {
        let coll = self.coll.as_ref().map_err(Clone::clone)?;
        let mut call = Self::call_of(args)?;
        if call.count == 0 {
            return Ok(());
        }
        // Rank-independent buffers for the check: ncclReduce is out of place on non-roots,
        // and a broadcast's send buffer is unused there.
        if args.op == Op::Reduce && call.send != call.recv {
            call.recv = call.send.wrapping_add(4096);
        }
        if call.send == 0 {
            call.send = call.recv;
        }
        coll.checked_algorithm(&call)
            .map(|_| ())
            .map_err(|e| format!("no native algorithm can run it: {e}"))
    }

    /// Runs `args` natively (asynchronously on its stream on GPUs).
    ///
    /// # Safety
    /// The buffers must be valid for the collective's sizes on the comm's device until the
    /// work on the stream completes.
    pub unsafe fn run(&self, args: &CollArgs) -> NResult<()> {
        let coll = self
            .coll
            .as_ref()
            .map_err(|why| NcclError::usage(why.clone()))?;
        let call = Self::call_of(args).map_err(NcclError::usage)?;
        let (s, r, n, st) = (call.send, call.recv, call.count, args.stream);
        // SAFETY: (all arms) the caller's buffers and stream, checked by the exported function.
        let result = unsafe {
            match args.op {
                Op::AllReduce => coll.all_reduce(s, r, n, call.dtype, call.op, st),
                Op::AllGather => coll.all_gather(s, r, n, call.dtype, st),
                Op::ReduceScatter => coll.reduce_scatter(s, r, n, call.dtype, call.op, st),
                Op::Broadcast => {
                    // Non-root ranks may pass a NULL send buffer (it is not read there).
                    let s = if s == 0 { r } else { s };
                    coll.broadcast(s, r, n, call.dtype, call.root, st)
                }
                Op::Reduce => {
                    let dst = if self.rank == call.root {
                        r
                    } else {
                        self.scratch(call.bytes())?
                    };
                    coll.all_reduce(s, dst, n, call.dtype, call.op, st)
                }
                other => {
                    return Err(NcclError::internal(format!(
                        "{} is not a collective",
                        other.name()
                    )))
                }
            }
        };
        result.map_err(NcclError::from)
    }

    /// Copies `bytes` from `src` to `dst` in `stream` order (nothing when they coincide): a
    /// send to this rank itself.
    ///
    /// # Safety
    /// Both ranges must be valid memory of the comm's device until the stream ran the copy.
    pub unsafe fn copy(&self, dst: u64, src: u64, bytes: usize, stream: u64) -> NResult<()> {
        if bytes == 0 || dst == src {
            return Ok(());
        }
        match &self.gpu {
            None => {
                // SAFETY: the caller's host buffers; `copy` allows overlap.
                unsafe {
                    std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, bytes)
                };
                Ok(())
            }
            Some(dev) => {
                // SAFETY: the caller's live stream of this device and device buffers.
                unsafe {
                    let s = <Gpu as StreamInterop>::borrow_stream(dev, stream);
                    Gpu::memcpy_async(&s, dst, src, bytes)
                }
                .map_err(|e| NcclError::from(mscclpp::Error::from(e)).context("send to self"))
            }
        }
    }

    /// A scratch buffer of at least `bytes` for non-root `ncclReduce` results.
    fn scratch(&self, bytes: usize) -> NResult<u64> {
        let mut g = self
            .reduce_scratch
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(m) = g.as_ref().filter(|m| m.size() >= bytes) {
            return Ok(m.ptr());
        }
        let size = bytes.max(1).next_power_of_two().max(1 << 20);
        let m = LocalMemory::alloc(self.device, size).map_err(|e| {
            NcclError::from(e).context(format!(
                "ncclReduce on a non-root rank: allocating a {size}-byte scratch (if this \
                 happened inside CUDA-graph capture, run the same ncclReduce once before \
                 capturing)"
            ))
        })?;
        let p = m.ptr();
        *g = Some(m);
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi;

    #[test]
    fn every_nccl_type_maps_to_a_type_of_the_same_size() {
        for v in 0..abi::NUM_TYPES {
            let t = data_type(v).expect("a native type");
            assert_eq!(
                Some(t.size_in_bytes()),
                abi::type_size(v),
                "ncclDataType_t {v}"
            );
        }
        assert!(data_type(abi::NUM_TYPES).is_none() && data_type(-1).is_none());
        assert!((0..abi::NUM_OPS).all(|o| reduce_op(o).is_some()));
        assert!(reduce_op(abi::NUM_OPS).is_none());
    }
}
