//! Built-in providers and the bridge to external provider executables.

pub mod command;
pub mod common;
pub mod paths;
pub mod workspace;
pub mod external;
