//! Reduce-scatter algorithms, one file each.

pub mod fullmesh;
pub mod hier_port;
pub mod packet;
