//! Worker records, statuses and input segments.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::bundles::{BundleRef, InputMode, ProfileSelector};

/// One piece of input. Tagged by `kind`; any other kind is refused at the boundary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Segment {
    Text {
        content: String,
    },
    /// Pasted text; the optional counters are the client's own bookkeeping.
    Paste {
        content: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chars: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lines: Option<u32>,
    },
    /// A file inside the workspace, by workspace-relative path.
    FileRef {
        path: String,
    },
}

impl Segment {
    /// The text a line-oriented program sees for this segment.
    pub fn flatten(&self) -> String {
        match self {
            Segment::Text { content } | Segment::Paste { content, .. } => content.clone(),
            Segment::FileRef { path } => format!("@{path}"),
        }
    }
}

/// The text of a whole input: its segments, one per line.
pub fn flatten(segments: &[Segment]) -> String {
    segments
        .iter()
        .map(Segment::flatten)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Lifecycle of a worker. `stopped` and `failed` are final: nothing brings such a worker back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkerStatus {
    /// Created, waiting for its `worker.start` operation to be authorized and executed; no
    /// process exists and no input is accepted.
    PendingApproval,
    /// Its process is alive and owned by a gaffer process.
    Running,
    /// Ended normally, by request, or because its owning gaffer process went away.
    Stopped,
    /// Could not be spawned, exited with an error, was killed or timed out.
    Failed,
}

impl WorkerStatus {
    pub fn is_final(self) -> bool {
        matches!(self, WorkerStatus::Stopped | WorkerStatus::Failed)
    }

    /// `pending_approval` → `running` | final; `running` → final.
    pub fn can_become(self, next: WorkerStatus) -> bool {
        match self {
            WorkerStatus::PendingApproval => next != WorkerStatus::PendingApproval,
            WorkerStatus::Running => next.is_final(),
            _ => false,
        }
    }
}

/// What the execution backend reports about the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Alive and accepting input.
    Idle,
    /// Alive but not taking input (e.g. a profile that takes its input as an argument).
    Busy,
    #[default]
    Stopped,
    Errored,
}

/// How a process ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ExitInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
}

/// The gaffer process holding a worker's OS process. Its identity survives pid reuse because
/// the kernel start time is recorded too.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Owner {
    /// Random per gaffer process (UUIDv7).
    pub process_id: String,
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ticks: Option<u64>,
    /// The worker's own OS process (its process group leader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_start_ticks: Option<u64>,
}

/// A worker as recorded and as shown to clients.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Worker {
    /// UUIDv7, issued only by `workers/create`.
    pub id: String,
    pub profile: ProfileSelector,
    pub config_bundle: BundleRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    pub status: WorkerStatus,
    pub run_state: RunState,
    /// True only while a live process can take input.
    pub input_capable: bool,
    pub input_mode: InputMode,
    pub backend: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    /// The `worker.start` operation whose authorized execution starts the process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    /// Why the worker is stopped or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Spawn or restore diagnostic for a failed worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitInfo>,
    #[serde(default)]
    pub stop_requested: bool,
    /// The client that created the worker (agents over MCP may stop only their own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    /// The reason given with a stop asked through another gaffer process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// `sha256:<hex>` of the canonical create request; compared on replay.
    pub request_fingerprint: String,
    pub created_seq: u64,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// Seq of the newest transcript entry.
    pub last_seq: u64,
    pub input_count: u64,
    pub output_bytes: u64,
}

/// Which channel a transcript entry came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Input,
    Stdout,
    Stderr,
    /// gaffer's own notes: spawn failure, exit, stop.
    System,
}

/// One line of a worker's history; `seq` is the journal sequence of the record behind it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TranscriptEntry {
    pub seq: u64,
    pub time_ms: u64,
    pub stream: Stream,
    pub text: String,
    /// The structured input, for `input` entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments: Option<Vec<Segment>>,
    /// The accepting process's proof for an `input` entry (see [`InputAuth`]). Only the owner
    /// reads it, while the worker runs: never sent, never kept in a snapshot.
    #[serde(default, skip_serializing)]
    #[schemars(skip)]
    pub auth: Option<InputAuth>,
}

/// What makes journalled input deliverable: a MAC under the worker's input key, which the
/// process that spawned the worker keeps in memory and in its spawn record outside the
/// workspace ([`super::spawned`]). The agent can append a `worker.input` record, but not one
/// that verifies, and a nonce is delivered once, so a copied record is not input again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputAuth {
    pub nonce: String,
    pub mac: String,
}
