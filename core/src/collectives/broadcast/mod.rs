//! Broadcast algorithms, one file each.

pub mod fullmesh;
pub mod hier_allreduce;
pub mod packet;
