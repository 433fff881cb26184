//! The fold of `worker.*` journal records, and the checks that decide what may be written.
//!
//! Records:
//! - `worker.created` {worker, initial_input?}: the worker and its initial input, together, so
//!   a crash leaves either both or neither;
//! - `worker.input` {worker_id, segments, text}: input accepted for a running worker, to be
//!   delivered by the gaffer process that owns its OS process;
//! - `worker.output` {worker_id, stream, text}: coalesced output chunks;
//! - `worker.status` {worker_id, status, run_state, input_capable, reason?, exit?, diagnostic?};
//! - `worker.stop_requested` {worker_id, reason?}: a stop asked through a process that does not
//!   own the worker;
//! - `worker.start_requested` {worker_id, operation_id}: the `worker.start` operation that gates
//!   a `pending_approval` worker;
//! - `worker.started` {worker_id, operation_id, owner, run_state, input_capable}: that operation
//!   executed and its process runs (only from `pending_approval`).

use std::collections::{BTreeMap, VecDeque};

use crate::store::RecordPayload;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::types::{
    ExitInfo, RunState, Segment, Stream, TranscriptEntry, Worker, WorkerStatus, flatten,
};

pub const CREATED_KIND: &str = "worker.created";
pub const INPUT_KIND: &str = "worker.input";
pub const OUTPUT_KIND: &str = "worker.output";
pub const STATUS_KIND: &str = "worker.status";
pub const STOP_REQUESTED_KIND: &str = "worker.stop_requested";
pub const START_REQUESTED_KIND: &str = "worker.start_requested";
pub const STARTED_KIND: &str = "worker.started";

/// Notification sent when a worker's record changes.
pub const CHANGED_NOTIFICATION: &str = "workers/changed";
/// Notification carrying new transcript text.
pub const OUTPUT_NOTIFICATION: &str = "workers/output";

/// The in-memory transcript keeps at most this many entries per worker (the journal keeps all).
pub const TRANSCRIPT_MAX_ENTRIES: usize = 10_000;
/// ... and at most this much text per worker.
pub const TRANSCRIPT_MAX_BYTES: usize = 8 * 1024 * 1024;

/// A notification produced by folding a record: `(method, params)`.
pub type DomainNotice = (String, Value);

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Transcript {
    pub entries: VecDeque<TranscriptEntry>,
    pub bytes: usize,
    /// Entries dropped from the front to respect the caps.
    pub trimmed: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WorkerState {
    pub workers: BTreeMap<String, Worker>,
    pub transcripts: BTreeMap<String, Transcript>,
}

/// A status change to record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusChange {
    pub worker_id: String,
    pub status: WorkerStatus,
    pub run_state: RunState,
    pub input_capable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostic: Option<String>,
}

impl StatusChange {
    /// A final status: the worker no longer takes input.
    pub fn ended(worker_id: &str, status: WorkerStatus, reason: impl Into<String>) -> Self {
        StatusChange {
            worker_id: worker_id.to_string(),
            status,
            run_state: if status == WorkerStatus::Failed {
                RunState::Errored
            } else {
                RunState::Stopped
            },
            input_capable: false,
            reason: Some(reason.into()),
            exit: None,
            diagnostic: None,
        }
    }
}

/// A `pending_approval` worker's process was started by its authorized operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    pub worker_id: String,
    pub operation_id: String,
    pub owner: super::types::Owner,
    pub run_state: RunState,
    pub input_capable: bool,
}

/// Payload builders: the only way records of this domain are written.
pub mod records {
    use super::*;

    pub fn created(worker: &Worker, initial_input: Option<&[Segment]>) -> (&'static str, Value) {
        let text = initial_input.map(flatten);
        (
            CREATED_KIND,
            json!({ "worker": worker, "initial_input": initial_input, "initial_text": text }),
        )
    }

    pub fn input(
        worker_id: &str,
        segments: &[Segment],
        auth: &super::super::types::InputAuth,
    ) -> (&'static str, Value) {
        (
            INPUT_KIND,
            json!({ "worker_id": worker_id, "segments": segments, "text": flatten(segments), "auth": auth }),
        )
    }

    pub fn output(worker_id: &str, stream: Stream, text: &str) -> (&'static str, Value) {
        (
            OUTPUT_KIND,
            json!({ "worker_id": worker_id, "stream": stream, "text": text }),
        )
    }

    pub fn status(change: &StatusChange) -> (&'static str, Value) {
        (
            STATUS_KIND,
            serde_json::to_value(change).unwrap_or(Value::Null),
        )
    }

    pub fn start_requested(worker_id: &str, operation_id: &str) -> (&'static str, Value) {
        (
            START_REQUESTED_KIND,
            json!({ "worker_id": worker_id, "operation_id": operation_id }),
        )
    }

    pub fn started(start: &Started) -> (&'static str, Value) {
        (
            STARTED_KIND,
            serde_json::to_value(start).unwrap_or(Value::Null),
        )
    }

    pub fn stop_requested(worker_id: &str, reason: Option<&str>) -> (&'static str, Value) {
        (
            STOP_REQUESTED_KIND,
            json!({ "worker_id": worker_id, "reason": reason }),
        )
    }
}

impl WorkerState {
    pub fn get(&self, id: &str) -> Option<&Worker> {
        self.workers.get(id)
    }

    /// Workers in creation order (ids are time-ordered UUIDv7).
    pub fn list(&self) -> impl Iterator<Item = &Worker> {
        self.workers.values()
    }

    /// The initial input `id`'s own `worker.created` record carried (while its transcript
    /// still holds it).
    pub fn initial_input(&self, id: &str) -> Option<Vec<Segment>> {
        let w = self.workers.get(id)?;
        let t = self.transcripts.get(id)?;
        t.entries
            .iter()
            .find(|e| e.seq == w.created_seq && e.stream == Stream::Input)
            .and_then(|e| e.segments.clone())
    }

    /// The first worker `created_by` created under `key`: keys are each client's own (another
    /// client's key tells a caller nothing and blocks nothing), and a later record reusing one
    /// does not take it over.
    pub fn by_idempotency_key(&self, created_by: Option<&str>, key: &str) -> Option<&Worker> {
        self.workers
            .values()
            .filter(|w| w.idempotency_key.as_deref() == Some(key))
            .filter(|w| w.created_by.as_deref() == created_by)
            .min_by_key(|w| w.created_seq)
    }

    /// Transcript entries with `seq > after`, at most `limit`; plus whether more follow.
    pub fn transcript(&self, id: &str, after: u64, limit: usize) -> (Vec<TranscriptEntry>, bool) {
        let Some(t) = self.transcripts.get(id) else {
            return (Vec::new(), false);
        };
        let start = t.entries.partition_point(|e| e.seq <= after);
        let page: Vec<TranscriptEntry> =
            t.entries.iter().skip(start).take(limit).cloned().collect();
        let more = t.entries.len() > start + page.len();
        (page, more)
    }

    /// Input entries with `seq > after` (what the owner has yet to deliver).
    pub fn inputs_after(&self, id: &str, after: u64) -> Vec<TranscriptEntry> {
        let Some(t) = self.transcripts.get(id) else {
            return Vec::new();
        };
        let start = t.entries.partition_point(|e| e.seq <= after);
        t.entries
            .iter()
            .skip(start)
            .filter(|e| e.stream == Stream::Input)
            .cloned()
            .collect()
    }

    /// Folds one journal record (the workspace dispatches `worker.*` here); its notifications
    /// go to every client.
    pub fn apply(
        &mut self,
        rec: &crate::workspace::Record,
        out: &mut Vec<crate::workspace::Notice>,
    ) {
        for (method, params) in self.apply_record(&rec.kind, rec.seq, rec.time_ms, &*rec.payload) {
            out.push(crate::workspace::Notice::everyone(method, params));
        }
    }

    /// Folds one record in and returns the notifications it causes. Records were validated
    /// before they were written; what does not decode is logged and skipped.
    pub fn apply_record(
        &mut self,
        kind: &str,
        seq: u64,
        time_ms: u64,
        payload: &(impl RecordPayload + ?Sized),
    ) -> Vec<DomainNotice> {
        let mut out = Vec::new();
        let result = match kind {
            CREATED_KIND => self.apply_created(seq, time_ms, payload, &mut out),
            INPUT_KIND => self.apply_input(seq, time_ms, payload, &mut out),
            OUTPUT_KIND => self.apply_output(seq, time_ms, payload, &mut out),
            STATUS_KIND => self.apply_status(seq, time_ms, payload, &mut out),
            STOP_REQUESTED_KIND => self.apply_stop_requested(time_ms, payload, &mut out),
            START_REQUESTED_KIND => self.apply_start_requested(time_ms, payload, &mut out),
            STARTED_KIND => self.apply_started(time_ms, payload, &mut out),
            _ => Ok(()),
        };
        if let Err(e) = result {
            tracing::warn!(kind, seq, error = %e, "skipping undecodable worker record");
        }
        out
    }

    fn changed(&self, id: &str, out: &mut Vec<DomainNotice>) {
        if let Some(w) = self.workers.get(id) {
            out.push((
                CHANGED_NOTIFICATION.to_string(),
                json!({ "worker_id": id, "worker": w }),
            ));
        }
    }

    fn push_entry(&mut self, id: &str, entry: TranscriptEntry) {
        // The initial input (its `worker.created` record's own entry) is never trimmed: a
        // create's replay is judged against it, and the worker starts with it.
        let created_seq = self.workers.get(id).map(|w| w.created_seq);
        let t = self.transcripts.entry(id.to_string()).or_default();
        t.bytes += entry.text.len();
        t.entries.push_back(entry);
        while t.entries.len() > TRANSCRIPT_MAX_ENTRIES
            || (t.bytes > TRANSCRIPT_MAX_BYTES && t.entries.len() > 1)
        {
            let kept_first = t
                .entries
                .front()
                .is_some_and(|e| Some(e.seq) == created_seq && e.stream == Stream::Input);
            let oldest = usize::from(kept_first);
            if oldest + 1 >= t.entries.len() {
                break;
            }
            if let Some(old) = t.entries.remove(oldest) {
                t.bytes -= old.text.len();
                t.trimmed += 1;
            }
        }
    }

    fn apply_created(
        &mut self,
        seq: u64,
        time_ms: u64,
        payload: &(impl RecordPayload + ?Sized),
        out: &mut Vec<DomainNotice>,
    ) -> Result<(), serde_json::Error> {
        #[derive(Deserialize)]
        struct Created {
            worker: Worker,
            #[serde(default)]
            initial_input: Option<Vec<Segment>>,
        }
        let rec: Created = payload.decode()?;
        let mut w = rec.worker;
        if self.workers.contains_key(&w.id) {
            tracing::warn!(seq, id = %w.id, "skipping worker.created for an existing worker id");
            return Ok(());
        }
        w.created_seq = seq;
        w.created_ms = time_ms;
        w.updated_ms = time_ms;
        let id = w.id.clone();
        if let Some(segments) = rec.initial_input {
            w.input_count = 1;
            w.last_seq = seq;
            let text = flatten(&segments);
            self.push_entry(
                &id,
                TranscriptEntry {
                    seq,
                    time_ms,
                    stream: Stream::Input,
                    text,
                    segments: Some(segments),
                    auth: None,
                },
            );
        }
        if let Some(diag) = w.diagnostic.clone() {
            w.last_seq = seq;
            self.push_entry(
                &id,
                TranscriptEntry {
                    seq,
                    time_ms,
                    stream: Stream::System,
                    text: diag,
                    segments: None,
                    auth: None,
                },
            );
        }
        self.workers.insert(id.clone(), w);
        self.changed(&id, out);
        Ok(())
    }

    fn apply_input(
        &mut self,
        seq: u64,
        time_ms: u64,
        payload: &(impl RecordPayload + ?Sized),
        out: &mut Vec<DomainNotice>,
    ) -> Result<(), serde_json::Error> {
        #[derive(Deserialize)]
        struct Input {
            worker_id: String,
            segments: Vec<Segment>,
            #[serde(default)]
            auth: Option<super::types::InputAuth>,
        }
        let rec: Input = payload.decode()?;
        let Some(w) = self.workers.get_mut(&rec.worker_id) else {
            return Ok(());
        };
        w.input_count += 1;
        w.last_seq = seq;
        w.updated_ms = time_ms;
        let text = flatten(&rec.segments);
        self.push_entry(
            &rec.worker_id,
            TranscriptEntry {
                seq,
                time_ms,
                stream: Stream::Input,
                text,
                segments: Some(rec.segments),
                auth: rec.auth,
            },
        );
        self.changed(&rec.worker_id, out);
        Ok(())
    }

    fn apply_output(
        &mut self,
        seq: u64,
        time_ms: u64,
        payload: &(impl RecordPayload + ?Sized),
        out: &mut Vec<DomainNotice>,
    ) -> Result<(), serde_json::Error> {
        #[derive(Deserialize)]
        struct Output {
            worker_id: String,
            stream: Stream,
            text: String,
        }
        let rec: Output = payload.decode()?;
        let Some(w) = self.workers.get_mut(&rec.worker_id) else {
            return Ok(());
        };
        w.output_bytes += rec.text.len() as u64;
        w.last_seq = seq;
        w.updated_ms = time_ms;
        out.push((
            OUTPUT_NOTIFICATION.to_string(),
            json!({ "worker_id": rec.worker_id, "seq": seq, "stream": rec.stream, "text": rec.text }),
        ));
        self.push_entry(
            &rec.worker_id,
            TranscriptEntry {
                seq,
                time_ms,
                stream: rec.stream,
                text: rec.text,
                segments: None,
                auth: None,
            },
        );
        Ok(())
    }

    fn apply_status(
        &mut self,
        seq: u64,
        time_ms: u64,
        payload: &(impl RecordPayload + ?Sized),
        out: &mut Vec<DomainNotice>,
    ) -> Result<(), serde_json::Error> {
        let rec: StatusChange = payload.decode()?;
        let Some(w) = self.workers.get_mut(&rec.worker_id) else {
            return Ok(());
        };
        if w.status != rec.status && !w.status.can_become(rec.status) {
            tracing::warn!(seq, id = %rec.worker_id, from = ?w.status, to = ?rec.status, "skipping a status change the state machine does not allow");
            return Ok(());
        }
        if w.status.is_final() && rec.status == w.status {
            // A final status is kept as first recorded (several processes may race to record it).
            return Ok(());
        }
        w.status = rec.status;
        w.run_state = rec.run_state;
        w.input_capable = rec.input_capable && rec.status == WorkerStatus::Running;
        w.updated_ms = time_ms;
        if rec.reason.is_some() {
            w.reason = rec.reason.clone();
        }
        if rec.exit.is_some() {
            w.exit = rec.exit;
        }
        if rec.diagnostic.is_some() {
            w.diagnostic = rec.diagnostic;
        }
        if rec.status.is_final() {
            w.last_seq = seq;
            let note = format!(
                "worker {}: {}",
                if rec.status == WorkerStatus::Failed {
                    "failed"
                } else {
                    "stopped"
                },
                rec.reason.as_deref().unwrap_or("no reason recorded")
            );
            let id = rec.worker_id.clone();
            self.push_entry(
                &id,
                TranscriptEntry {
                    seq,
                    time_ms,
                    stream: Stream::System,
                    text: note,
                    segments: None,
                    auth: None,
                },
            );
        }
        self.changed(&rec.worker_id, out);
        Ok(())
    }

    fn apply_stop_requested(
        &mut self,
        time_ms: u64,
        payload: &(impl RecordPayload + ?Sized),
        out: &mut Vec<DomainNotice>,
    ) -> Result<(), serde_json::Error> {
        #[derive(Deserialize)]
        struct Stop {
            worker_id: String,
            #[serde(default)]
            reason: Option<String>,
        }
        let rec: Stop = payload.decode()?;
        let Some(w) = self.workers.get_mut(&rec.worker_id) else {
            return Ok(());
        };
        if w.status.is_final() {
            return Ok(());
        }
        w.stop_requested = true;
        w.stop_reason = rec.reason.filter(|r| !r.is_empty());
        w.updated_ms = time_ms;
        self.changed(&rec.worker_id, out);
        Ok(())
    }

    fn apply_start_requested(
        &mut self,
        time_ms: u64,
        payload: &(impl RecordPayload + ?Sized),
        out: &mut Vec<DomainNotice>,
    ) -> Result<(), serde_json::Error> {
        #[derive(Deserialize)]
        struct Req {
            worker_id: String,
            operation_id: String,
        }
        let rec: Req = payload.decode()?;
        let Some(w) = self.workers.get_mut(&rec.worker_id) else {
            return Ok(());
        };
        if w.operation_id.is_some() {
            return Ok(());
        }
        w.operation_id = Some(rec.operation_id);
        w.updated_ms = time_ms;
        self.changed(&rec.worker_id, out);
        Ok(())
    }

    fn apply_started(
        &mut self,
        time_ms: u64,
        payload: &(impl RecordPayload + ?Sized),
        out: &mut Vec<DomainNotice>,
    ) -> Result<(), serde_json::Error> {
        let rec: Started = payload.decode()?;
        let Some(w) = self.workers.get_mut(&rec.worker_id) else {
            return Ok(());
        };
        if w.status != WorkerStatus::PendingApproval {
            tracing::warn!(id = %rec.worker_id, "skipping worker.started for a worker that is not pending");
            return Ok(());
        }
        w.status = WorkerStatus::Running;
        w.run_state = rec.run_state;
        w.input_capable = rec.input_capable;
        w.owner = Some(rec.owner);
        w.operation_id = Some(rec.operation_id);
        w.updated_ms = time_ms;
        self.changed(&rec.worker_id, out);
        Ok(())
    }
}
