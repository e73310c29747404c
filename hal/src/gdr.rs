//! GDRCopy loaded at run time (placeholder).
