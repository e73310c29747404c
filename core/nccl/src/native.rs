//! The native paths: `mscclpp::collectives` (which also does world size 1 as a copy), the
//! copies of a send to this rank itself on GPUs, and a scratch buffer for results a rank
//! discards (the non-root ranks of `ncclReduce`).
//!
//! A collective is chosen once ([`Native::choose`]): the call converted to the collectives'
//! [`Call`] and the algorithm that takes it, before the call is routed, so a call no algorithm
//! covers goes to the fallback instead of failing late. The same [`Choice`] is then run
//! ([`Native::run`]). The answer depends only on the collective, sizes, types and the world
//! (never on which rank asks), so every rank routes alike.

use std::ffi::c_int;
use std::sync::{Arc, Mutex};

use mscclpp::collectives::{self, Call, Collectives, CollectivesConfig, DataType, ReduceOp};
use mscclpp::{Communicator, Device, LocalMemory};
use mscclpp_hal::prelude::*;
use mscclpp_hal::{Gpu, StreamInterop};

use crate::env;
use crate::error::{NResult, NcclError};

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
    coll: Result<Collectives, String>,
    device: Device,
    /// The opened GPU (None on the host backend), for stream copies.
    gpu: Option<<Gpu as Api>::Device>,
    /// Where non-root ranks of `ncclReduce` put the all-reduce result (grown outside capture).
    scratch: Mutex<Option<Scratch>>,
}

/// Whether a GPU communicator spanning hosts gets the hierarchical collectives: yes, over IB
/// and over Ethernet (whose GPU ranks stage the network bytes and signals in host-mapped
/// memory, so the transport threads make no CUDA call a blocked application thread could
/// hold up; collectives/net.rs), unless [`env::GPU_HIERARCHICAL`] is `0` (`Ok(Err(why))`: they
/// go to the fallback NCCL). The network transport's variable is checked here too, so a wrong
/// value fails the communicator's creation with its name.
fn gpu_hier_enabled() -> NResult<Result<(), String>> {
    if !env::gpu_hierarchical()? {
        return Ok(Err(format!("{}=0", env::GPU_HIERARCHICAL)));
    }
    env::net_transport()?;
    Ok(Ok(()))
}

/// A collective the native path runs: the converted call and what the collectives chose for
/// it (`None`: nothing to do, a count of 0).
#[derive(Clone, Debug)]
pub struct Choice {
    /// The call as the collectives see it.
    pub call: Call,
    /// The collectives' choice (algorithm or plan, its check done).
    pub chosen: Option<collectives::Choice>,
}

/// A buffer for results a rank discards, kept alive by every queued call that writes it.
pub type Scratch = Arc<LocalMemory>;

impl Native {
    /// Sets up the collectives (collective over the communicator). A communicator spanning
    /// hosts gets the hierarchical algorithms (on GPUs as `gpu_hier_enabled` says; without
    /// them its collectives go to the fallback).
    pub fn new(communicator: &Arc<Communicator>, device: Device) -> NResult<Native> {
        let b = communicator.bootstrap();
        let (n, per_node) = (b.nranks(), b.nranks_per_node());
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
            coll,
            device,
            gpu,
            scratch: Mutex::new(None),
        })
    }

    /// `Ok` when the collectives are set up, else why not.
    pub fn available(&self) -> Result<(), String> {
        self.coll.as_ref().map(|_| ()).map_err(Clone::clone)
    }

    /// The choice for `call` ([`Collectives::choose`]: forced, the user's selector, a plan or
    /// the default), or why nothing covers it (the fallback then takes it). The one place a
    /// native collective's algorithm is chosen; [`Native::run`] runs exactly this choice.
    /// `registered`: whether the call's buffers lie in ranges registered on this communicator
    /// (then [`Collectives::choose_registered`] prefers the zero-copy algorithms), asked only
    /// when an algorithm is chosen.
    pub fn choose(&self, call: Call, registered: impl FnOnce() -> bool) -> Result<Choice, String> {
        let coll = self.coll.as_ref().map_err(Clone::clone)?;
        if call.count == 0 {
            return Ok(Choice { call, chosen: None });
        }
        let chosen = if registered() {
            coll.choose_registered(&call)
        } else {
            coll.choose(&call)
        }
        .map_err(|e| format!("no native algorithm can run it: {e}"))?;
        Ok(Choice {
            call,
            chosen: Some(chosen),
        })
    }

    /// Declares `ptr..ptr+size` registered (`ncclCommRegister`, `ncclCommWindowRegister`):
    /// registered whole at the next zero-copy miss outside capture
    /// ([`Collectives::register_buffer`]).
    pub fn declare_buffer(&self, ptr: u64, size: usize) {
        if let Ok(coll) = &self.coll {
            coll.register_buffer(ptr, size);
        }
    }

    /// Whether a call of `count` elements from `send` to `recv` does nothing here: an in-place
    /// call at world size 1, where every collective with a built-in operator is the identity
    /// (the NCCL collectives answer it before routing, so [`Native::choose`] never sees one;
    /// issue 28: NCCL answers it in 0.33 us on the H200).
    pub fn is_noop(&self, send: u64, recv: u64, count: usize) -> bool {
        self.coll
            .as_ref()
            .is_ok_and(|coll| count != 0 && send == recv && coll.nranks() == 1)
    }

    /// Forgets the collectives' registrations and peer mappings of buffers inside
    /// `ptr..ptr+size`, and its declaration (`ncclCommDeregister`).
    pub fn forget_buffers(&self, ptr: u64, size: usize) {
        if let Ok(coll) = &self.coll {
            coll.deregister_buffer(ptr, size);
        }
    }

    /// Runs `choice` (asynchronously on `stream` on GPUs): the choice [`Native::choose`] made.
    ///
    /// # Safety
    /// The call's buffers must be valid for the collective's sizes on the comm's device until
    /// the work on the stream completes.
    pub unsafe fn run(&self, choice: &Choice, stream: u64) -> NResult<()> {
        let coll = self
            .coll
            .as_ref()
            .map_err(|why| NcclError::usage(why.clone()))?;
        let Some(chosen) = &choice.chosen else {
            // A call of no elements: recorded, and compared across the ranks with
            // MSCCLPP_CHECK_CALLS=1 (core's collectives/check.rs).
            return coll.empty_call(&choice.call).map_err(NcclError::from);
        };
        // SAFETY: the caller's buffers and stream, checked by the exported function.
        unsafe { coll.run_choice(chosen, stream) }.map_err(NcclError::from)
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

    /// A scratch buffer of at least `bytes` for results a rank discards (non-root
    /// `ncclReduce`). A larger one replaces it for later calls; calls already holding the
    /// smaller one keep it alive.
    pub fn scratch(&self, bytes: usize) -> NResult<Scratch> {
        let mut g = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = g.as_ref().filter(|m| m.size() >= bytes) {
            return Ok(m.clone());
        }
        let size = bytes.max(1).next_power_of_two().max(1 << 20);
        let m = LocalMemory::alloc(self.device, size).map_err(|e| {
            NcclError::from(e).context(format!(
                "ncclReduce on a non-root rank: allocating a {size}-byte scratch (if this \
                 happened inside CUDA-graph capture, run the same ncclReduce once before \
                 capturing)"
            ))
        })?;
        let m = Arc::new(m);
        *g = Some(m.clone());
        Ok(m)
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
