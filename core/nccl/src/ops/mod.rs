//! The collective and point-to-point operations of `nccl.h`, from the C arguments to the
//! native or the fallback path. Each call kind is described in one place: [`collective`] (the
//! collectives) or [`point_to_point`] (send/recv and the calls made of them); what they share
//! (routing, the [`work::Work`] a call becomes, running a batch of it) is in [`work`].

pub mod collective;
pub mod point_to_point;
pub mod work;

use crate::env::FallbackName;

/// Every operation's names in `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION`.
pub fn fallback_names() -> Vec<FallbackName> {
    let coll = collective::ALL.iter().map(|c| c.name);
    coll.chain(point_to_point::ALL.iter().map(|p| p.name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::ForcedOps;

    #[test]
    fn every_operation_has_one_distinct_name_in_the_documented_order() {
        let names: Vec<&str> = fallback_names().iter().map(|n| n.name).collect();
        assert_eq!(
            names,
            [
                "allreduce",
                "allgather",
                "reducescatter",
                "broadcast",
                "reduce",
                "sendrecv",
                "alltoall",
                "gather",
                "scatter"
            ]
        );
        // ncclSend and ncclRecv are routed under one name: both ends must agree.
        assert_eq!(point_to_point::SEND.name, point_to_point::RECV.name);
        let forced = ForcedOps::parse("recv, ReduceScatter", &fallback_names()).unwrap();
        assert!(forced.has(point_to_point::SEND.name.name));
        assert!(forced.has(collective::REDUCE_SCATTER.name.name));
        assert!(!forced.has(collective::REDUCE.name.name));
        let e = ForcedOps::parse("allredcue", &fallback_names()).unwrap_err();
        assert!(
            e.msg.contains(
                "expected a comma list of allreduce, allgather, reducescatter, broadcast, \
                 reduce, sendrecv, alltoall, gather, scatter, send, recv or all"
            ),
            "{}",
            e.msg
        );
    }
}
