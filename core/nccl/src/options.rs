//! Environment options of the NCCL library: which operations `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION`
//! sends to the fallback NCCL, and the timeouts.

use std::time::Duration;

/// The operations of the NCCL interface, as routing sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `ncclAllReduce`.
    AllReduce,
    /// `ncclAllGather`.
    AllGather,
    /// `ncclReduceScatter`.
    ReduceScatter,
    /// `ncclBroadcast` / `ncclBcast`.
    Broadcast,
    /// `ncclReduce`.
    Reduce,
    /// `ncclSend` / `ncclRecv` (always routed together: both ends must agree).
    SendRecv,
    /// `ncclAlltoAll`.
    AllToAll,
    /// `ncclGather`.
    Gather,
    /// `ncclScatter`.
    Scatter,
}

impl Op {
    /// Every operation, in the order [`OpSet`] bits use.
    pub const ALL: [Op; 9] = [
        Op::AllReduce,
        Op::AllGather,
        Op::ReduceScatter,
        Op::Broadcast,
        Op::Reduce,
        Op::SendRecv,
        Op::AllToAll,
        Op::Gather,
        Op::Scatter,
    ];

    /// The name `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION` uses.
    pub fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "allreduce",
            Op::AllGather => "allgather",
            Op::ReduceScatter => "reducescatter",
            Op::Broadcast => "broadcast",
            Op::Reduce => "reduce",
            Op::SendRecv => "sendrecv",
            Op::AllToAll => "alltoall",
            Op::Gather => "gather",
            Op::Scatter => "scatter",
        }
    }

    fn bit(self) -> u32 {
        1 << (Op::ALL.iter().position(|&o| o == self).unwrap_or(0) as u32)
    }
}

/// A set of [`Op`]s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpSet(u32);

impl OpSet {
    /// Whether `op` is in the set.
    pub fn has(self, op: Op) -> bool {
        self.0 & op.bit() != 0
    }

    /// Parses a comma list of operation names (any case; `_`/`-` ignored; `send` and `recv`
    /// mean `sendrecv`; `all` means every operation). An unknown name is an error listing the
    /// valid ones.
    pub fn parse(list: &str) -> Result<OpSet, String> {
        let mut set = OpSet(0);
        for raw in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let norm: String = raw
                .chars()
                .filter(|c| *c != '_' && *c != '-')
                .flat_map(char::to_lowercase)
                .collect();
            let op = match norm.as_str() {
                "all" => {
                    set = OpSet(Op::ALL.iter().fold(0, |m, o| m | o.bit()));
                    continue;
                }
                "send" | "recv" | "sendrecv" => Op::SendRecv,
                other => match Op::ALL.iter().find(|o| o.name() == other) {
                    Some(&o) => o,
                    None => {
                        let valid: Vec<&str> = Op::ALL.iter().map(|o| o.name()).collect();
                        return Err(format!(
                            "MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION={list}: unknown operation \
                             {raw:?}; expected a comma list of {}, send, recv or all",
                            valid.join(", ")
                        ));
                    }
                },
            };
            set.0 |= op.bit();
        }
        Ok(set)
    }

    /// The set named by `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION` (empty when unset).
    pub fn from_env() -> Result<OpSet, String> {
        match std::env::var("MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION") {
            Ok(v) => OpSet::parse(&v),
            Err(_) => Ok(OpSet(0)),
        }
    }
}

/// Bound on communicator init (bootstrap, connections, fallback init).
pub const INIT_TIMEOUT: Duration = Duration::from_secs(300);
/// Bound on a blocking point-to-point exchange that makes no progress.
pub const P2P_STALL_TIMEOUT: Duration = Duration::from_secs(120);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_aliases_and_rejects_unknown() {
        let s = OpSet::parse("AllReduce, all_gather,send").unwrap();
        assert!(s.has(Op::AllReduce) && s.has(Op::AllGather) && s.has(Op::SendRecv));
        assert!(!s.has(Op::Broadcast) && !s.has(Op::Reduce));
        let all = OpSet::parse("all").unwrap();
        assert!(Op::ALL.iter().all(|&o| all.has(o)));
        assert_eq!(OpSet::parse("").unwrap(), OpSet::default());
        let e = OpSet::parse("allreduce,allredcue").unwrap_err();
        assert!(
            e.contains("\"allredcue\"") && e.contains("reducescatter"),
            "{e}"
        );
    }
}
