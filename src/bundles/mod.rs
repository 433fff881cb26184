//! bundles (being built).
