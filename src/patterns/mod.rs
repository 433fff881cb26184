//! patterns (being built).
