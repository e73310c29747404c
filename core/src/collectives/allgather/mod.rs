//! All-gather algorithms, one file each (upstream names).

pub mod fullmesh;
