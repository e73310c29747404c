//! Bootstrap (placeholder).
