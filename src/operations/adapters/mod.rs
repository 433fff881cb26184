//! Built-in providers and the bridge to external provider executables.
