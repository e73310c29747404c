//! The default choice of algorithm by collective, message size, world size, ranks per node
//! and GPU architecture (upstream's single-node rules without NVLS: all-reduce up to 16 KiB
//! `allpair_packet`, up to 1 MiB `packet`, larger `rsag`).

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
    /// Ranks on this host.
    pub nranks_per_node: usize,
    /// GPU compute capability ((0, 0) on the host backend).
    pub arch: (u32, u32),
    /// Whether the host backend runs the call.
    pub host: bool,
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
    match q.kind {
        CollectiveKind::AllReduce => {
            let prefs: &[&'static str] = if q.bytes <= 16 << 10 {
                &["allpair_packet", "packet", "rsag"]
            } else if q.bytes <= 1 << 20 {
                &["packet", "rsag", "allpair_packet"]
            } else {
                &["rsag", "rsag_pipeline", "packet"]
            };
            first_registered(q.kind, prefs)
        }
        CollectiveKind::AllGather => first_registered(q.kind, &["fullmesh", "port_channel"]),
        CollectiveKind::ReduceScatter => first_registered(q.kind, &["packet", "rsag", "fullmesh"]),
        CollectiveKind::Broadcast => first_registered(q.kind, &["packet", "fullmesh"]),
    }
}
