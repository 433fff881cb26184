//! workers (being built).
