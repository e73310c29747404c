//! Reduce-scatter algorithms, one file each.

pub mod fullmesh;
