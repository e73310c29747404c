//! The default choice of algorithm by collective, message size, world size, ranks per node
//! and GPU architecture (NVLS variants first where NVLS is usable and every rank is on one
//! node, see `nvls::selector_prefs`; else upstream's single-node rules without NVLS: all-reduce
//! up to 16 KiB `allpair_packet`, up to 1 MiB `packet`, larger `rsag`; all-gather,
//! reduce-scatter and broadcast `fullmesh`). The large-size choice is measured: two ranks
//! sharing one H200 (2026-12-01, `coll_perf -np 2` with each algorithm forced, docs/perf.md),
//! `rsag` took 12.3 / 103.0 / 786.4 us at 4 / 32 / 256 MiB where `rsag_pipeline` took 25.5 /
//! 129.5 / 921.1.

use super::types::CollectiveKind;
use super::{algorithm_names, find_algorithm};
use crate::error::{Error, Result};

/// What the selector looks at.
#[derive(Clone, Copy, Debug)]
pub struct Query {
    /// The collective.
    pub kind: CollectiveKind,
    /// Bytes per rank of the call (all-reduce: the buffer; all-gather: what one rank sends).
    pub bytes: usize,
    /// World size.
    pub nranks: usize,
    /// Ranks on this node.
    pub nranks_per_node: usize,
    /// Nodes of the world (the ranks span nodes when > 1).
    pub nnodes: usize,
    /// GPU compute capability ((0, 0) on the host backend).
    pub arch: (u32, u32),
    /// Whether the host backend runs the call.
    pub host: bool,
    /// Whether the NVLS variants may be picked (NVLS usable on the communicator's device; on
    /// the host backend also opted in by `MSCCLPP_NVLS_EMULATION=1`); they are picked only
    /// when every rank is on this node too.
    pub nvls: bool,
}

/// The first registered algorithm of `preferences` (in order), or an error naming them.
fn first_registered(kind: CollectiveKind, preferences: &[&'static str]) -> Result<&'static str> {
    preferences
        .iter()
        .copied()
        .find(|n| find_algorithm(kind, n).is_ok())
        .ok_or_else(|| {
            Error::invalid(format!(
                "{kind}: no algorithm for this call yet (wanted one of {}; registered: {})",
                preferences.join(", "),
                algorithm_names(kind).join(", ")
            ))
        })
}

/// The algorithm for `q`.
pub fn select(q: &Query) -> Result<&'static str> {
    if q.nranks == 1 {
        return Ok("copy");
    }
    if q.nnodes > 1 {
        // Across nodes only the hierarchical algorithms (memory inside the node, port
        // channels between nodes) can run.
        return match q.kind {
            CollectiveKind::AllReduce => first_registered(q.kind, &["hier_rsag_port"]),
            CollectiveKind::AllGather | CollectiveKind::ReduceScatter => {
                first_registered(q.kind, &["hier_port"])
            }
            CollectiveKind::Broadcast => first_registered(q.kind, &["hier_allreduce"]),
        };
    }
    match q.kind {
        CollectiveKind::AllReduce => {
            if let Some(prefs) =
                super::nvls::selector_prefs(q.nvls, q.nranks, q.nranks_per_node, q.bytes)
            {
                return first_registered(q.kind, prefs);
            }
            let prefs: &[&'static str] = if q.bytes <= 16 << 10 {
                &["allpair_packet", "packet", "rsag"]
            } else if q.bytes <= 1 << 20 {
                &["packet", "rsag", "allpair_packet"]
            } else {
                // Not rsag_zero_copy: its registration on a cache miss is collective, so it
                // is only safe where every rank meets the same buffers (forced by the user).
                &["rsag", "rsag_pipeline", "packet"]
            };
            first_registered(q.kind, prefs)
        }
        CollectiveKind::AllGather => first_registered(q.kind, &["fullmesh", "port_channel"]),
        CollectiveKind::ReduceScatter => first_registered(q.kind, &["fullmesh"]),
        CollectiveKind::Broadcast => first_registered(q.kind, &["fullmesh"]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(kind: CollectiveKind, bytes: usize, nranks: usize) -> &'static str {
        let q = Query {
            kind,
            bytes,
            nranks,
            nranks_per_node: nranks,
            nnodes: 1,
            arch: (9, 0),
            host: false,
            nvls: false,
        };
        let name = select(&q).unwrap();
        assert!(
            nranks == 1 || find_algorithm(kind, name).is_ok(),
            "{kind} picks the unregistered {name}"
        );
        name
    }

    #[test]
    fn defaults_by_size() {
        use CollectiveKind::*;
        assert_eq!(pick(AllReduce, 1 << 10, 8), "allpair_packet");
        assert_eq!(pick(AllReduce, 16 << 10, 2), "allpair_packet");
        assert_eq!(pick(AllReduce, 64 << 10, 4), "packet");
        assert_eq!(pick(AllReduce, 1 << 20, 2), "packet");
        assert_eq!(pick(AllReduce, (1 << 20) + 1, 2), "rsag");
        assert_eq!(pick(AllReduce, 1 << 30, 8), "rsag");
        for bytes in [1, 1 << 20, 1 << 30] {
            assert_eq!(pick(AllGather, bytes, 2), "fullmesh");
            assert_eq!(pick(ReduceScatter, bytes, 4), "fullmesh");
            assert_eq!(pick(Broadcast, bytes, 8), "fullmesh");
        }
        assert_eq!(pick(Broadcast, 1 << 20, 1), "copy");
    }

    #[test]
    fn across_nodes() {
        let q = |kind, bytes| Query {
            kind,
            bytes,
            nranks: 16,
            nranks_per_node: 8,
            nnodes: 2,
            arch: (9, 0),
            host: false,
            // Even with NVLS usable, a world spanning nodes takes the hierarchical ones.
            nvls: true,
        };
        for bytes in [1, 1 << 20, 1 << 30] {
            assert_eq!(
                select(&q(CollectiveKind::AllReduce, bytes)).unwrap(),
                "hier_rsag_port"
            );
            for kind in [CollectiveKind::AllGather, CollectiveKind::ReduceScatter] {
                assert_eq!(select(&q(kind, bytes)).unwrap(), "hier_port");
            }
            assert_eq!(
                select(&q(CollectiveKind::Broadcast, bytes)).unwrap(),
                "hier_allreduce"
            );
        }
    }
}
