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
