//! Plans: a selected worker pattern launched as running lanes. `plans/launch` derives the
//! launch plan (the selector's lanes mapped onto a pinned bundle's profiles), puts it through
//! the gate as one `plan.launch` operation, and, once authorized, runs its lanes under the
//! chosen mechanism with a connection each whose identity is the lane. An evidence ledger,
//! verified from gaffer's own facts, decides when a plan is done.

mod drive;
pub mod evidence;
pub mod runner;
pub mod schedule;
pub mod spec;
pub mod state;
pub mod view;

pub use runner::{LaneIdentity, LaneRegistry, LaneServer, PlanRuntime};
pub use spec::{LaunchError, LaunchSpec, LaunchTarget};
pub use state::PlanState;
