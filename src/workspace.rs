//! workspace
