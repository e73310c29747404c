//! The environment variables this crate reads itself, each with its one parser, its default
//! and its documentation here (the core library's variables, e.g. `MSCCLPP_NCCL_LIB_PATH`,
//! are read by `mscclpp::env()`).
//!
//! Every variable is read when a communicator is created, not once per process: a program may
//! change one between two inits (the C tests do). A bad value is an error naming the variable,
//! what came and what was expected.

use mscclpp::collectives::net::{pick_transport, NET_TRANSPORT_ENV};
use mscclpp::Transport;

use crate::error::{NResult, NcclError};

/// `MSCCLPP_NCCL_GPU_HIERARCHICAL`: whether a GPU communicator spanning hosts gets the
/// hierarchical collectives. `1` (the default) runs them, `0` leaves them to the fallback NCCL.
/// Set it alike on every rank.
pub const GPU_HIERARCHICAL: &str = "MSCCLPP_NCCL_GPU_HIERARCHICAL";

/// `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION`: a comma list of operations sent to the fallback
/// NCCL even where a native path exists (any case, `_` and `-` ignored; `all` names every
/// operation; each operation's name and aliases come from the operation itself, see
/// [`FallbackName`]). Unset: none.
pub const FORCE_FALLBACK: &str = "MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION";

/// The network transport of the hierarchical collectives (`MSCCLPP_COLL_NET_TRANSPORT`:
/// `ib` or `ethernet`; unset: IB when available). The collectives read it themselves; this
/// crate checks it up front so a wrong value fails the communicator's creation with its name.
pub const NET_TRANSPORT: &str = NET_TRANSPORT_ENV;

/// The variable's value; `None` when unset (or not valid Unicode, which no valid value is).
fn read(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// [`GPU_HIERARCHICAL`]: `Ok(true)` for `1`, empty or unset; `Ok(false)` for `0`.
pub fn gpu_hierarchical() -> NResult<bool> {
    match read(GPU_HIERARCHICAL).as_deref() {
        None | Some("") | Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(v) => Err(NcclError::usage(format!(
            "{GPU_HIERARCHICAL}: expected 0 or 1, got {v:?}"
        ))),
    }
}

/// Warns (once per process) about a malformed value of this library's own variables, which
/// only multi-node GPU communicators read: a single-node job would otherwise never hear of it.
pub fn warn_malformed() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Err(e) = gpu_hierarchical() {
            mscclpp::log_warn!(
                "NCCL",
                "{} (read only by communicators spanning hosts)",
                e.msg
            );
        }
    });
}

/// [`NET_TRANSPORT`]: the transport it names (or, unset, the one available); parsed by
/// core's `Env` (`mscclpp::env::Env::coll_net_transport`), read now.
pub fn net_transport() -> NResult<Transport> {
    let choice = mscclpp::Env::current()
        .coll_net_transport()
        .map_err(NcclError::from)?;
    Ok(pick_transport(choice))
}

/// An operation's names in [`FORCE_FALLBACK`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FallbackName {
    /// Its name (`allreduce`, ...).
    pub name: &'static str,
    /// Other names accepted for it (`send` and `recv` for `sendrecv`).
    pub aliases: &'static [&'static str],
}

impl FallbackName {
    /// An operation known by `name` alone.
    pub const fn single(name: &'static str) -> FallbackName {
        FallbackName { name, aliases: &[] }
    }
}

/// The operations [`FORCE_FALLBACK`] names (their [`FallbackName::name`]s).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForcedOps(Vec<&'static str>);

impl ForcedOps {
    /// Whether the operation called `name` is forced to the fallback.
    pub fn has(&self, name: &str) -> bool {
        self.0.contains(&name)
    }

    /// Parses a comma list against the operations `known`; an unknown name is an error
    /// listing the valid ones.
    pub fn parse(list: &str, known: &[FallbackName]) -> NResult<ForcedOps> {
        let mut set: Vec<&'static str> = Vec::new();
        for raw in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let norm: String = raw
                .chars()
                .filter(|c| *c != '_' && *c != '-')
                .flat_map(char::to_lowercase)
                .collect();
            let found: Vec<&'static str> = if norm == "all" {
                known.iter().map(|k| k.name).collect()
            } else {
                known
                    .iter()
                    .filter(|k| k.name == norm || k.aliases.contains(&norm.as_str()))
                    .map(|k| k.name)
                    .take(1)
                    .collect()
            };
            if found.is_empty() {
                let names = known.iter().map(|k| k.name);
                let aliases = known.iter().flat_map(|k| k.aliases.iter().copied());
                let valid: Vec<&str> = names.chain(aliases).collect();
                return Err(NcclError::arg(format!(
                    "{FORCE_FALLBACK}={list}: unknown operation {raw:?}; expected a comma list \
                     of {} or all",
                    valid.join(", ")
                )));
            }
            for name in found {
                if !set.contains(&name) {
                    set.push(name);
                }
            }
        }
        Ok(ForcedOps(set))
    }
}

/// [`FORCE_FALLBACK`] parsed against the operations `known` (empty when unset).
pub fn forced_fallback(known: &[FallbackName]) -> NResult<ForcedOps> {
    match read(FORCE_FALLBACK) {
        Some(v) => ForcedOps::parse(&v, known),
        None => Ok(ForcedOps::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: [FallbackName; 4] = [
        FallbackName::single("allreduce"),
        FallbackName::single("allgather"),
        FallbackName::single("reducescatter"),
        FallbackName {
            name: "sendrecv",
            aliases: &["send", "recv"],
        },
    ];

    #[test]
    fn parses_names_aliases_and_rejects_unknown() {
        let s = ForcedOps::parse("AllReduce, all_gather,send", &KNOWN).unwrap();
        assert!(s.has("allreduce") && s.has("allgather") && s.has("sendrecv"));
        assert!(!s.has("reducescatter"));
        let all = ForcedOps::parse("all", &KNOWN).unwrap();
        assert!(KNOWN.iter().all(|k| all.has(k.name)));
        assert_eq!(ForcedOps::parse("", &KNOWN).unwrap(), ForcedOps::default());
        let e = ForcedOps::parse("allreduce,allredcue", &KNOWN).unwrap_err();
        assert_eq!(e.code, crate::abi::INVALID_ARGUMENT);
        assert!(
            e.msg.contains("\"allredcue\"")
                && e.msg.contains("reducescatter, sendrecv, send, recv or all"),
            "{}",
            e.msg
        );
    }
}
