//! Workers: processes started from a synced bundle profile, fed input, watched live.
//!
//! - [`request`] reads `workers/*` requests at the boundary (field-precise refusals);
//! - [`plan`] decides against the current state (idempotency, bundle identity, containment);
//! - [`state`] is the fold of `worker.*` journal records (workers, transcripts, keys);
//! - [`backend`] is the execution contract and [`process`] its OS-process implementation;
//! - [`coalesce`] batches output, [`procinfo`] tells whether a recorded process still exists;
//! - [`spawned`]: the processes this machine started, outside the workspace (what an orphan
//!   sweep may signal).

pub mod backend;
pub mod coalesce;
pub mod plan;
pub mod process;
pub mod procinfo;
pub mod request;
pub mod runtime;
pub mod spawned;
pub mod state;
pub mod types;

pub use backend::{ExecEvent, ExecResult, ExecutionBackend, Outcome, SpawnRequest, Spawned};
pub use plan::{CreateCheck, WorkerError};
pub use process::ProcessBackend;
pub use request::{CreateRequest, InputRequest};
pub use runtime::{StartSpec, WorkerRuntime};
pub use state::{StatusChange, WorkerState};
pub use types::{
    ExitInfo, Owner, RunState, Segment, Stream, TranscriptEntry, Worker, WorkerStatus,
};

/// A new worker id: a UUIDv7, so ids sort by creation time.
pub fn new_worker_id() -> String {
    uuid::Uuid::now_v7().hyphenated().to_string()
}

#[cfg(test)]
mod tests;
