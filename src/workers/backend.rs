//! The execution backend contract: what the worker runtime asks of whatever runs a worker.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::types::{ExitInfo, RunState, Segment, Stream, WorkerStatus};
use crate::bundles::{Declaration, Profile};

/// How a backend answered one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Accepted,
    /// Alive but cannot take this now.
    Busy,
    /// Refused (e.g. the worker is not live here).
    Rejected,
    /// Tried and failed.
    Errored,
    /// This backend does not do that at all.
    Unsupported,
}

/// A backend's answer: outcome, resulting run state, and a short explanation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResult {
    pub outcome: Outcome,
    pub run_state: RunState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl ExecResult {
    pub fn new(outcome: Outcome, run_state: RunState, message: impl Into<Option<String>>) -> Self {
        ExecResult {
            outcome,
            run_state,
            message: message.into(),
        }
    }

    pub fn accepted(run_state: RunState) -> Self {
        ExecResult::new(Outcome::Accepted, run_state, None)
    }
}

/// Everything a backend needs to start a worker. No paths or credentials from the request
/// reach here: the program comes from the pinned bundle and the directory is the workspace.
pub struct SpawnRequest<'a> {
    pub worker_id: &'a str,
    pub profile: &'a Profile,
    pub declarations: &'a [Declaration],
    /// Used at spawn only by profiles that take their input as an argument; stdin profiles get
    /// their initial input through [`ExecutionBackend::input`] once the worker is recorded.
    pub initial_input: Option<&'a [Segment]>,
    pub workspace_root: &'a Path,
    /// Values of the declared secrets, read by the runtime (which also scrubs them).
    pub secrets: &'a [crate::secrets::Secret],
    /// Inherited by the child as descriptor 3 (a lane's connection), if any.
    pub channel: Option<&'a std::os::fd::OwnedFd>,
    /// Extra variables (lane names).
    pub env: &'a [(String, String)],
    /// The trusted policy's word on the sandbox.
    pub sandbox: crate::sandbox::Setting,
}

/// A started worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spawned {
    pub run_state: RunState,
    pub input_capable: bool,
    pub child_pid: Option<u32>,
    pub child_start_ticks: Option<u64>,
}

/// What a running worker reports back, in order per worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecEvent {
    Output {
        worker_id: String,
        stream: Stream,
        bytes: Vec<u8>,
    },
    /// Sent once, after the last output.
    Ended {
        worker_id: String,
        status: WorkerStatus,
        reason: String,
        exit: Option<ExitInfo>,
    },
}

/// A way of running workers. Calls are cheap and do not block: long work happens in tasks
/// that report through the event channel given to `spawn`.
pub trait ExecutionBackend: Send + Sync {
    fn id(&self) -> &'static str;

    /// Whether this backend can run `profile` with the bundle's `declarations` (and why not).
    fn can_run(&self, profile: &Profile, declarations: &[Declaration]) -> Result<(), String>;

    /// Starts a worker. Must be called inside a Tokio runtime.
    fn spawn(
        &self,
        req: SpawnRequest<'_>,
        events: mpsc::UnboundedSender<ExecEvent>,
    ) -> Result<Spawned, String>;

    /// Delivers one input to a live worker.
    fn input(&self, worker_id: &str, segments: &[Segment]) -> ExecResult;

    /// Ends a live worker; its `Ended` event follows.
    fn stop(&self, worker_id: &str, reason: &str) -> ExecResult;

    /// Interrupts the current work without ending the worker.
    fn cancel(&self, worker_id: &str) -> ExecResult;

    /// Re-attaches to a worker after a restart.
    fn restore(&self, worker_id: &str) -> ExecResult;
}
