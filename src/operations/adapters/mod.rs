//! Built-in providers and the bridge to external provider executables.

pub mod command;
pub mod common;
pub mod external;
pub mod handle;
pub mod paths;
pub mod plan;
pub mod worker;
pub mod workspace;
