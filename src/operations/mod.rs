//! Operations: side effects an agent asks for, gated by workspace policy and human approval,
//! executed at most once through a provider adapter and reconciled when the outcome is unknown.
//!
//! - [`canonical`]: strict JSON parsing, RFC 8785 text, token-exact comparison.
//! - [`lifecycle`]: the eight states, allowed transitions, stable error codes.
//! - [`policy`]: `.gaffer/policy.yaml` rules and the decision order.
//! - [`plan`]: the immutable, digest-identified plan an approval is bound to.
//! - [`operator`]: the operator key (outside the workspace) and decision signatures.
//! - [`adapter`]: the provider contract and the catalog-checked registry.
//! - [`adapters`]: built-in providers (workspace files, commands) and external ones.
//! - [`state`]: the journal fold of operations and approvals.

pub mod adapter;
pub mod adapters;
pub mod canonical;
pub mod lifecycle;
pub mod operator;
pub mod plan;
pub mod policy;
pub mod state;

pub use operator::authenticate_operator;
pub use state::OperationState;
