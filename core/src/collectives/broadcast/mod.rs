//! Broadcast algorithms, one file each.

pub mod fullmesh;
