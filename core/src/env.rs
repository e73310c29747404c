//! Environment (placeholder).
