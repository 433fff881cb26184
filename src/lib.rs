//! gaffer: a workspace-local agent operations server spoken to over JSON-RPC on stdio.
//!
//! The crate is laid out by concept (see ARCHITECTURE.md):
//! - [`rpc`] is the protocol core (framing, sessions, the router); it knows no domain types.
//! - [`store`] is the durable journal, snapshots and blobs under `<workspace>/.gaffer/`.
//! - [`workspace`] folds the journal into state and is the one place mutations happen.
//! - [`patterns`], [`bundles`], [`workers`] and [`operations`] are the domains.
//! - [`methods`] binds the domains to the router: one typed handler per method.

pub mod anchor;
pub mod bundles;
pub mod cli;
pub mod clients;
pub mod fanout;
pub mod jcs;
pub mod json_out;
pub mod methods;
pub mod operations;
pub mod operator;
pub mod patterns;
pub mod peers;
pub mod plans;
pub mod rpc;
pub mod runtime;
pub mod sandbox;
pub mod secrets;
pub mod store;
pub mod util;
pub mod workers;
pub mod workspace;
