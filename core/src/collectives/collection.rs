//! The algorithm collection of one communicator: what builds it (builders), the native
//! algorithms' builder, the process-wide builder hook, and the lookup by kind and name.
//!
//! Every algorithm object belongs to one communicator: a [`AlgorithmBuilder`] makes it from a
//! [`BuildContext`] (the communicator's shared [`Resources`]) and the object keeps its own
//! typed state (the port-channel algorithms their proxy and channels, the NVLS variants their
//! multicast scratch), built lazily at the first call that needs it. Native algorithms, the
//! algorithms a user adds (per communicator through `Collectives::builder`, or for every
//! communicator created afterwards through [`register_global`]) and the execution plans of the
//! plan directory (`plan.rs`) live in one [`Collection`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

use super::algorithm::Algorithm;
use super::copy::Copy;
use super::setup::Resources;
use super::types::CollectiveKind;
use super::{allgather, allreduce, broadcast, reduce_scatter, zero_copy};
use super::{nvls::NvlsShared, port::PortChannels};
use crate::communicator::Communicator;
use crate::error::{Error, Result};
use crate::transport::Device;

/// What a builder gets to set its algorithms up (during `Collectives` construction, on every
/// rank in the same order; a builder may talk to its peers through `comm()`'s bootstrap).
pub struct BuildContext<'a> {
    pub(crate) comm: &'a Arc<Communicator>,
    pub(crate) res: &'a Resources,
}

impl<'a> BuildContext<'a> {
    /// The communicator.
    pub fn comm(&self) -> &'a Arc<Communicator> {
        self.comm
    }
    /// The shared per-communicator resources (scratch buffers every peer maps, semaphores,
    /// LL flags, topology, configuration); the same object the algorithm's calls get.
    pub fn resources(&self) -> &'a Resources {
        self.res
    }
    /// The device the collectives run on.
    pub fn device(&self) -> Device {
        self.res.device()
    }
    /// This rank.
    pub fn rank(&self) -> usize {
        self.res.rank()
    }
    /// World size.
    pub fn nranks(&self) -> usize {
        self.res.nranks()
    }
}

/// Makes algorithm objects for one communicator (a factory; its algorithms own their state).
/// Closures `Fn(&BuildContext) -> Result<Arc<dyn Algorithm>>` are builders of one algorithm.
pub trait AlgorithmBuilder: Send + Sync {
    /// The algorithms for the communicator of `ctx` (collective when they set anything up:
    /// every rank builds in the same order).
    fn build(&self, ctx: &BuildContext<'_>) -> Result<Vec<Arc<dyn Algorithm>>>;
}

impl<F> AlgorithmBuilder for F
where
    F: Fn(&BuildContext<'_>) -> Result<Arc<dyn Algorithm>> + Send + Sync,
{
    fn build(&self, ctx: &BuildContext<'_>) -> Result<Vec<Arc<dyn Algorithm>>> {
        Ok(vec![self(ctx)?])
    }
}

/// The native algorithms of every collective (one file each under `allreduce/`, `allgather/`,
/// `reduce_scatter/`, `broadcast/`, plus `copy` at world size 1), freshly built: the
/// port-channel algorithms share one lazily built proxy, the NVLS variants one NVLS state.
pub fn native_algorithms() -> Vec<Arc<dyn Algorithm>> {
    let port = Arc::new(PortChannels::default());
    let nvls = Arc::new(NvlsShared::default());
    vec![
        Arc::new(Copy(CollectiveKind::AllReduce)),
        Arc::new(Copy(CollectiveKind::AllGather)),
        Arc::new(Copy(CollectiveKind::ReduceScatter)),
        Arc::new(Copy(CollectiveKind::Broadcast)),
        Arc::new(allreduce::allpair_packet::AllpairPacket),
        Arc::new(allreduce::hier_rsag_port::HierRsagPort),
        Arc::new(allreduce::packet::Packet),
        Arc::new(allreduce::rsag::Rsag),
        Arc::new(allreduce::rsag_pipeline::RsagPipeline),
        Arc::new(allreduce::rsag_port_channel::RsagPortChannel { port: port.clone() }),
        Arc::new(allreduce::rsag_zero_copy::RsagZeroCopy),
        Arc::new(allreduce::nvls_packet::NvlsPacket { nvls: nvls.clone() }),
        Arc::new(allreduce::nvls_zero_copy::NvlsZeroCopy { nvls: nvls.clone() }),
        Arc::new(allreduce::nvls_warp_pipeline::NvlsWarpPipeline { nvls: nvls.clone() }),
        Arc::new(allreduce::nvls_block_pipeline::NvlsBlockPipeline { nvls }),
        Arc::new(allgather::fullmesh::Fullmesh),
        Arc::new(allgather::packet::Packet),
        Arc::new(allgather::hier_port::HierPort),
        Arc::new(allgather::port_channel::PortChannel { port }),
        Arc::new(reduce_scatter::fullmesh::Fullmesh),
        Arc::new(reduce_scatter::packet::Packet),
        Arc::new(reduce_scatter::hier_port::HierPort),
        Arc::new(broadcast::fullmesh::Fullmesh),
        Arc::new(broadcast::packet::Packet),
        Arc::new(broadcast::hier_allreduce::HierAllreduce),
        // Zero-copy all-gather, reduce-scatter and broadcast on registered buffers.
        Arc::new(zero_copy::ZeroCopyAllGather),
        Arc::new(zero_copy::ZeroCopyReduceScatter),
        Arc::new(zero_copy::ZeroCopyBroadcast),
    ]
}

/// The builder of the native algorithms (first in every collection).
#[derive(Clone, Copy, Debug, Default)]
pub struct NativeAlgorithms;

impl AlgorithmBuilder for NativeAlgorithms {
    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Vec<Arc<dyn Algorithm>>> {
        Ok(native_algorithms())
    }
}

/// The process-wide builders ([`register_global`]).
fn global_builders() -> &'static Mutex<Vec<Arc<dyn AlgorithmBuilder>>> {
    static G: OnceLock<Mutex<Vec<Arc<dyn AlgorithmBuilder>>>> = OnceLock::new();
    G.get_or_init(|| Mutex::new(Vec::new()))
}

/// Adds `builder` to every `Collectives` created afterwards in this process (after the native
/// algorithms, before the ones a `Collectives::builder` adds), e.g. so that the communicators
/// the NCCL crate creates pick an application's algorithm up when it is linked as a Rust
/// library (upstream's `AlgorithmCollectionBuilder` singleton; `libmscclpp_nccl.so` has its
/// own copy of this crate: register there with its `mscclppNcclRegisterAlgorithm`). Every
/// rank must register the same builders.
pub fn register_global(builder: impl AlgorithmBuilder + 'static) {
    global_builders()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Arc::new(builder));
}

/// The process-wide builders registered so far, in order.
pub(crate) fn global() -> Vec<Arc<dyn AlgorithmBuilder>> {
    global_builders()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// `name` as a `&'static str`: each distinct name is stored once for the process (plan and
/// user algorithm names live as long as the algorithm lists that show them).
pub(crate) fn intern(name: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut set = NAMES
        .get_or_init(|| Mutex::new(HashSet::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(n) = set.get(name) {
        return n;
    }
    let n: &'static str = Box::leak(name.to_owned().into_boxed_str());
    set.insert(n);
    n
}

/// The algorithms of one communicator (natives, global builders, the communicator's own
/// builders, plans), unique by (kind, name).
#[derive(Clone, Default)]
pub struct Collection {
    algos: Vec<Arc<dyn Algorithm>>,
}

impl std::fmt::Debug for Collection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.algos.iter().map(|a| (a.kind(), a.name())))
            .finish()
    }
}

impl Collection {
    /// Adds `algo`; a second algorithm of the same kind and name is an error naming both.
    pub fn add(&mut self, algo: Arc<dyn Algorithm>) -> Result<()> {
        if let Some(old) = self.find(algo.kind(), algo.name()) {
            return Err(Error::invalid(format!(
                "{} algorithm `{}`: expected a name not yet in the collection (taken by {})",
                algo.kind(),
                algo.name(),
                old.description()
            )));
        }
        self.algos.push(algo);
        Ok(())
    }

    /// Every algorithm, in the order they were added.
    pub fn all(&self) -> &[Arc<dyn Algorithm>] {
        &self.algos
    }

    /// The algorithm `name` of `kind`, if any.
    pub fn find(&self, kind: CollectiveKind, name: &str) -> Option<&Arc<dyn Algorithm>> {
        self.algos
            .iter()
            .find(|a| a.kind() == kind && a.name() == name)
    }

    /// The algorithm `name` of `kind`, or an error listing the valid names.
    pub fn get(&self, kind: CollectiveKind, name: &str) -> Result<&Arc<dyn Algorithm>> {
        self.find(kind, name).ok_or_else(|| {
            Error::invalid(format!(
                "{kind} algorithm `{name}`: expected one of {}",
                self.names(kind).join(", ")
            ))
        })
    }

    /// Names of the algorithms of `kind`.
    pub fn names(&self, kind: CollectiveKind) -> Vec<&'static str> {
        self.algos
            .iter()
            .filter(|a| a.kind() == kind)
            .map(|a| a.name())
            .collect()
    }
}

/// The native algorithms as one process-wide list, for names, kinds and checks (tests, the
/// environment's forcing); a communicator runs its own collection's objects.
pub(crate) fn native_catalogue() -> &'static Collection {
    static C: OnceLock<Collection> = OnceLock::new();
    C.get_or_init(|| Collection {
        algos: native_algorithms(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natives_are_unique_and_a_clash_is_an_error() {
        let mut c = Collection::default();
        for a in native_algorithms() {
            c.add(a).unwrap();
        }
        assert_eq!(c.all().len(), native_catalogue().all().len());
        assert!(c.find(CollectiveKind::AllReduce, "rsag").is_some());
        let e = c
            .add(Arc::new(allreduce::rsag::Rsag))
            .unwrap_err()
            .to_string();
        assert!(e.contains("rsag") && e.contains("expected a name"), "{e}");
        let e = c
            .get(CollectiveKind::Broadcast, "nope")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("fullmesh") && e.contains("nope"), "{e}");
        // The same name of another collective is fine.
        assert!(c.find(CollectiveKind::AllGather, "fullmesh").is_some());
        assert!(c.find(CollectiveKind::ReduceScatter, "fullmesh").is_some());
    }

    #[test]
    fn interned_names_are_stored_once() {
        let x = intern(&String::from("plan_a"));
        let y = intern("plan_a");
        assert!(std::ptr::eq(x, y));
        assert_ne!(intern("plan_b"), x);
    }
}
