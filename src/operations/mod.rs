//! operations (being built).
