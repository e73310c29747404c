//! libibverbs loaded at run time (placeholder).
