//! Import and export formats.
