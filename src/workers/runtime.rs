//! The worker runtime of one gaffer process.
//!
//! It owns the OS processes this gaffer process started and is the only writer of their
//! output and exit records. Several gaffer processes may serve one workspace; each sees every
//! worker through the journal, but only the owner (recorded in the worker) touches the process:
//! - input accepted by any process is journalled (`worker.input`); the owner notices it while
//!   folding and writes it to the process;
//! - a stop asked through a non-owner is journalled (`worker.stop_requested`) and carried out
//!   by the owner;
//! - output is batched per worker and committed at most every [`FLUSH_INTERVAL`], so every
//!   process's clients get `workers/output` in order.
//!
//! Create spawns first and then commits the worker and its initial input as one record: a
//! crash in between leaves no worker (the orphaned process is ended when its pipes close or by
//! the next startup), never half of one. Startup (`restore`) marks running workers whose
//! owning process is gone as stopped; nothing is respawned.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};

use super::backend::{ExecEvent, ExecutionBackend, Outcome};
use super::coalesce::OutputBuffer;
use super::plan::{CreateCheck, WorkerError, check_create, check_input};
use super::procinfo;
use super::request::CreateRequest;
use super::spawned::{InputKey, SpawnRecords, Unproven};
use super::state::{CHANGED_NOTIFICATION, StatusChange, records};
use super::types::{Owner, RunState, Segment, Worker, WorkerStatus};
use crate::bundles;
use crate::secrets::{ScrubStream, Scrubber};
use crate::workspace::{CommitError, NewRecord, Notice, State, Workspace};

/// Longest time output waits before it is journalled.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(50);
/// How often live workers are re-checked for input or stop requests missed as notices.
const RESCAN_INTERVAL: Duration = Duration::from_millis(500);
/// How often running workers of other gaffer processes are checked for a vanished owner.
const SWEEP_INTERVAL: Duration = Duration::from_secs(2);
/// How long `stop` waits for the worker's final status.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// A worker whose OS process this gaffer process holds.
#[derive(Default)]
struct LiveWorker {
    /// Its `worker.created` record is durable; output may be journalled.
    committed: bool,
    buffer: OutputBuffer,
    /// Transcript seq of the last input written to the process.
    delivered_seq: u64,
    /// Journalled input is written to the process only when it verifies under this key, and
    /// each nonce once ([`super::spawned::InputKey`]).
    input_key: Option<InputKey>,
    delivered_nonces: std::collections::HashSet<String>,
    ended: Option<StatusChange>,
    stop_sent: bool,
    /// Injected secret values never leave in output, reasons or diagnostics.
    scrubber: Scrubber,
    stdout: ScrubStream,
    stderr: ScrubStream,
}

impl LiveWorker {
    /// Whether a journalled input entry was accepted by a gaffer process holding this worker's
    /// key, and is not a copy of one already delivered.
    fn authentic(&mut self, worker_id: &str, entry: &super::types::TranscriptEntry) -> bool {
        let (Some(key), Some(auth), Some(segments)) =
            (&self.input_key, &entry.auth, &entry.segments)
        else {
            return false;
        };
        let Ok(text) = serde_json::to_string(segments) else {
            return false;
        };
        key.verifies(worker_id, &text, auth) && self.delivered_nonces.insert(auth.nonce.clone())
    }

    fn scrub_chunk(&mut self, stream: super::types::Stream, text: &str) -> String {
        match stream {
            super::types::Stream::Stderr => self.stderr.push(&self.scrubber, text),
            _ => self.stdout.push(&self.scrubber, text),
        }
    }
}

#[derive(Default)]
struct Inner {
    live: HashMap<String, LiveWorker>,
    /// How workers this process ran ended, as its own backend saw it (a plan's runner trusts
    /// this, not the journal).
    ended: HashMap<String, (WorkerStatus, Option<super::types::ExitInfo>)>,
    started: bool,
}

pub struct WorkerRuntime {
    workspace: Arc<Workspace>,
    backends: Vec<Arc<dyn ExecutionBackend>>,
    me: Owner,
    inner: Mutex<Inner>,
    events_tx: mpsc::UnboundedSender<ExecEvent>,
    events_rx: Mutex<Option<mpsc::UnboundedReceiver<ExecEvent>>>,
    /// Becomes true once the startup restore has run, so answers never show a stale owner.
    restored: tokio::sync::watch::Sender<bool>,
    /// Asks the run loop (the only flusher, which keeps output in order) to flush now.
    flush_now: Arc<tokio::sync::Notify>,
}

fn store_err<E>(e: CommitError<E>) -> Result<E, WorkerError> {
    match e {
        CommitError::Rejected(e) => Ok(e),
        CommitError::Store(e) => {
            tracing::error!(error = %e, "worker runtime: store failure");
            Err(WorkerError::Store(e.to_string()))
        }
    }
}

fn commit_error(e: CommitError<WorkerError>) -> WorkerError {
    match store_err(e) {
        Ok(e) | Err(e) => e,
    }
}

fn new_record((kind, payload): (&'static str, serde_json::Value)) -> NewRecord {
    NewRecord::text(kind, crate::store::raw_payload(payload))
}

impl WorkerRuntime {
    /// A runtime with the process backend. Background work starts with [`Self::start`].
    pub fn new(workspace: Arc<Workspace>) -> Arc<Self> {
        Self::with_backends(workspace, vec![Arc::new(super::ProcessBackend::new())])
    }

    pub fn with_backends(
        workspace: Arc<Workspace>,
        backends: Vec<Arc<dyn ExecutionBackend>>,
    ) -> Arc<Self> {
        let (pid, start_ticks) = procinfo::current();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        Arc::new(WorkerRuntime {
            workspace,
            backends,
            me: Owner {
                process_id: super::new_worker_id(),
                pid,
                start_ticks,
                child_pid: None,
                child_start_ticks: None,
            },
            inner: Mutex::new(Inner::default()),
            events_tx,
            events_rx: Mutex::new(Some(events_rx)),
            restored: tokio::sync::watch::Sender::new(false),
            flush_now: Arc::new(tokio::sync::Notify::new()),
        })
    }

    /// How a worker this process ran ended, once its end is durable; `None` while it runs or
    /// when another process ran it.
    pub fn observed_end(&self, id: &str) -> Option<(WorkerStatus, Option<super::types::ExitInfo>)> {
        self.lock().ended.get(id).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the background tasks (once) and restores the workspace's workers. Needs a Tokio
    /// runtime; without one it does nothing and is retried on the next call.
    pub fn start(self: &Arc<Self>) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        {
            let mut inner = self.lock();
            if inner.started {
                return;
            }
            inner.started = true;
        }
        let Some(rx) = self
            .events_rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return;
        };
        let notices = self.workspace.subscribe();
        let me = Arc::downgrade(self);
        tokio::spawn(run_loop(me, rx, notices, Arc::clone(&self.flush_now)));
        let rt = Arc::clone(self);
        tokio::spawn(async move {
            rt.restore().await;
            rt.restored.send_replace(true);
        });
    }

    /// Starts the runtime if needed and waits (briefly) for the startup restore.
    pub async fn ready(self: &Arc<Self>) {
        self.start();
        let mut rx = self.restored.subscribe();
        let _ = tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|done| *done)).await;
    }

    pub fn workspace(&self) -> &Arc<Workspace> {
        &self.workspace
    }

    /// The identity this process records as owner.
    pub fn owner_identity(&self) -> &Owner {
        &self.me
    }

    fn owns(&self, w: &Worker) -> bool {
        w.owner
            .as_ref()
            .is_some_and(|o| o.process_id == self.me.process_id)
    }

    /// Whether the process recorded as owner of `w` is still running.
    fn owner_alive(&self, w: &Worker) -> bool {
        match &w.owner {
            Some(o) if o.process_id == self.me.process_id => self.lock().live.contains_key(&w.id),
            Some(o) => procinfo::is_alive(o.pid, o.start_ticks),
            None => false,
        }
    }

    /// Marks running workers whose owning process is gone as stopped. Their OS process, if it
    /// somehow survived, is ended: a worker nobody can feed or watch must not keep running.
    pub async fn restore(&self) {
        // Read first, judge after: `owner_alive` takes the runtime lock, which must never be
        // taken inside a workspace read (deliver_pending nests them the other way round).
        let running: Vec<Worker> = self.workspace.read(|s| {
            s.workers
                .list()
                .filter(|w| w.status == WorkerStatus::Running)
                .cloned()
                .collect()
        });
        self.retire_unstartable().await;
        for w in running.into_iter().filter(|w| !self.owner_alive(w)) {
            self.end_orphan_process(&w);
            let pid = w.owner.as_ref().map(|o| o.pid).unwrap_or(0);
            let reason = format!("its gaffer process (pid {pid}) ended; workers are not restarted");
            if let Err(e) = self
                .record_final(
                    &w.id,
                    StatusChange::ended(&w.id, WorkerStatus::Stopped, reason),
                )
                .await
            {
                tracing::warn!(worker = %w.id, error = %e, "could not record a stopped orphan worker");
            }
        }
    }

    /// The machine-local record of the processes started for this workspace's workers.
    pub(super) fn spawn_records(&self) -> SpawnRecords {
        let dir = self.workspace.anchor().map(|a| a.dir().join("workers"));
        SpawnRecords::in_dir(dir)
    }

    /// Ends an orphan's process if it somehow outlived its gaffer (the kernel normally ends it
    /// with it), but only one this machine proves is that worker's own ([`super::spawned`]):
    /// the journal's pid is never reason enough to signal anything.
    fn end_orphan_process(&self, w: &Worker) {
        let Some((pid, ticks)) = w
            .owner
            .as_ref()
            .and_then(|o| Some((o.child_pid?, o.child_start_ticks)))
        else {
            return;
        };
        let records = self.spawn_records();
        match records.prove(&w.id, pid, ticks) {
            Ok(group) => {
                procinfo::kill_group(group, libc::SIGKILL);
            }
            Err(Unproven::Gone) => {}
            Err(why) => {
                tracing::warn!(worker = %w.id, pid, %why, "leaving alone the process the journal names for an orphan worker");
            }
        }
        records.forget(&w.id);
    }

    /// Records a final status unless one is already there.
    async fn record_final(&self, id: &str, change: StatusChange) -> Result<(), WorkerError> {
        let id = id.to_string();
        self.workspace
            .commit(move |s: &State| {
                let still_running = s.workers.get(&id).is_some_and(|w| !w.status.is_final());
                let recs = if still_running {
                    vec![new_record(records::status(&change))]
                } else {
                    vec![]
                };
                Ok::<_, WorkerError>((recs, ()))
            })
            .await
            .map_err(commit_error)
    }

    fn backend_for(
        &self,
        profile: &bundles::Profile,
        decls: &[bundles::Declaration],
    ) -> Result<Arc<dyn ExecutionBackend>, String> {
        let mut why = Vec::new();
        for b in &self.backends {
            match b.can_run(profile, decls) {
                Ok(()) => return Ok(Arc::clone(b)),
                Err(e) => why.push(format!("{}: {e}", b.id())),
            }
        }
        if why.is_empty() {
            why.push("no execution backend is configured".to_string());
        }
        Err(why.join("; "))
    }

    fn backend_named(&self, id: &str) -> Option<Arc<dyn ExecutionBackend>> {
        self.backends.iter().find(|b| b.id() == id).cloned()
    }

    /// `workers/create`: the only place a worker id is issued.
    pub async fn create(self: &Arc<Self>, req: CreateRequest) -> Result<Worker, WorkerError> {
        self.ready().await;
        let fingerprint = req.fingerprint();

        let (check, blob) = self.workspace.read(|s| {
            check_create(&s.workers, &s.bundles, &req, &fingerprint).map(|c| {
                (
                    c,
                    s.bundles
                        .bundles
                        .get(&req.config_bundle.id)
                        .map(|b| b.blob.clone()),
                )
            })
        })?;
        if let CreateCheck::Replay(w) = check {
            return replay_answer(*w);
        }
        let blob = blob.ok_or_else(|| bundles::BundleError::Missing {
            id: req.config_bundle.id.clone(),
        })?;
        let bytes = self.workspace.get_blob(&blob).map_err(|e| {
            tracing::error!(error = %e, bundle = %req.config_bundle.id, "bundle blob unreadable");
            WorkerError::Store(format!(
                "bundle {} could not be read from the store",
                req.config_bundle.id
            ))
        })?;
        let bundle = bundles::from_blob(&bytes)?;
        let profile = bundle
            .profiles
            .iter()
            .find(|p| p.selector == req.profile)
            .cloned()
            .ok_or_else(|| WorkerError::ProfileNotInBundle {
                profile: req.profile.clone(),
                bundle_id: req.config_bundle.id.clone(),
            })?;
        let backend = self
            .backend_for(&profile, &bundle.declarations)
            .map_err(|message| WorkerError::BackendUnavailable {
                profile: req.profile.clone(),
                message,
            })?;

        // The worker is recorded pending; its process starts only when its `worker.start`
        // operation is authorized and executed (see `start`).
        let id = super::new_worker_id();
        let worker = Worker {
            id: id.clone(),
            profile: req.profile.clone(),
            config_bundle: req.config_bundle.clone(),
            display_name: req.display_name.clone(),
            status: WorkerStatus::PendingApproval,
            run_state: RunState::Stopped,
            input_capable: false,
            input_mode: profile.input_mode,
            backend: backend.id().to_string(),
            // The creating process, so a restart can tell a start that was never requested.
            owner: Some(self.me.clone()),
            operation_id: None,
            reason: None,
            diagnostic: None,
            exit: None,
            stop_requested: false,
            stop_reason: None,
            created_by: req.created_by.clone(),
            idempotency_key: req.idempotency_key.clone(),
            request_fingerprint: fingerprint.clone(),
            created_seq: 0,
            created_ms: 0,
            updated_ms: 0,
            last_seq: 0,
            input_count: 0,
            output_bytes: 0,
        };
        let record = new_record(records::created(&worker, req.initial_input.as_deref()));
        let (req2, fp2) = (req.clone(), fingerprint.clone());
        let committed = self
            .workspace
            .commit(
                move |s: &State| match check_create(&s.workers, &s.bundles, &req2, &fp2)? {
                    CreateCheck::Replay(w) => Ok((vec![], Some(*w))),
                    CreateCheck::Fresh => Ok((vec![record], None)),
                },
            )
            .await
            .map_err(commit_error)?;
        if let Some(w) = committed {
            return replay_answer(w);
        }
        self.workspace
            .read(|s| s.workers.get(&id).cloned())
            .ok_or(WorkerError::NotFound { worker_id: id })
    }

    /// `workers/input`: journals the input; the owning process writes it to the worker.
    pub async fn input(
        self: &Arc<Self>,
        worker_id: &str,
        segments: Vec<Segment>,
    ) -> Result<(Worker, u64), WorkerError> {
        self.ready().await;
        // A worker whose owner vanished cannot take input; say so truthfully and record it.
        let stale = self.workspace.read(|s| s.workers.get(worker_id).cloned());
        if let Some(w) = &stale
            && w.status == WorkerStatus::Running
            && !self.owner_alive(w)
        {
            self.restore().await;
        }
        let key = self
            .input_key(worker_id)
            .ok_or_else(|| WorkerError::NotInputCapable {
                worker_id: worker_id.to_string(),
                why: "its process was not started on this machine in this boot, so no input \
                  can be given to it from here"
                    .to_string(),
            })?;
        let text = serde_json::to_string(&segments)
            .map_err(|e| WorkerError::Store(format!("cannot encode the input: {e}")))?;
        let auth = key.sign(worker_id, &text).map_err(|e| {
            WorkerError::Store(format!("no random source for the input nonce: {e}"))
        })?;
        let id = worker_id.to_string();
        let record = new_record(records::input(worker_id, &segments, &auth));
        let seq = self
            .workspace
            .commit(move |s: &State| {
                check_input(&s.workers, &id)?;
                Ok::<_, WorkerError>((vec![record], s.last_seq + 1))
            })
            .await
            .map_err(commit_error)?;
        self.deliver_pending(worker_id);
        let w = self
            .workspace
            .read(|s| s.workers.get(worker_id).cloned())
            .ok_or_else(|| WorkerError::NotFound {
                worker_id: worker_id.to_string(),
            })?;
        Ok((w, seq))
    }

    /// The key input to `worker_id` is signed with: this process's own worker's, else the one
    /// the spawning process on this machine recorded.
    fn input_key(&self, worker_id: &str) -> Option<InputKey> {
        if let Some(live) = self.lock().live.get(worker_id) {
            return live.input_key;
        }
        self.spawn_records().input_key(worker_id)
    }

    /// Writes journalled input this process has not yet given to its worker: the initial input
    /// of its own `worker.created` record, and input records that verify under its key (a
    /// record the agent appended does not, and a copied one is not delivered twice).
    fn deliver_pending(&self, worker_id: &str) {
        let mut inner = self.lock();
        let Some(live) = inner.live.get_mut(worker_id) else {
            return;
        };
        if !live.committed || live.ended.is_some() {
            return;
        }
        let after = live.delivered_seq;
        let (pending, backend, created_seq) = self.workspace.read(|s| {
            let w = s.workers.get(worker_id);
            let backend = w.and_then(|w| self.backend_named(&w.backend));
            let created = w.map(|w| w.created_seq);
            (s.workers.inputs_after(worker_id, after), backend, created)
        });
        let Some(backend) = backend else { return };
        for entry in pending {
            if Some(entry.seq) != created_seq && !live.authentic(worker_id, &entry) {
                tracing::warn!(
                    worker = worker_id,
                    seq = entry.seq,
                    "input record not written to the worker: no process on this machine accepted it"
                );
                live.delivered_seq = entry.seq;
                continue;
            }
            let segments = entry.segments.clone().unwrap_or_else(|| {
                vec![Segment::Text {
                    content: entry.text.clone(),
                }]
            });
            let result = backend.input(worker_id, &segments);
            if result.outcome != Outcome::Accepted {
                tracing::warn!(worker = worker_id, seq = entry.seq, outcome = ?result.outcome, "input not delivered");
            }
            live.delivered_seq = entry.seq;
        }
    }

    /// Carries out a stop requested through another process.
    fn honour_stop_request(&self, worker_id: &str) {
        let requested = self.workspace.read(|s| {
            s.workers
                .get(worker_id)
                .map(|w| (w.stop_requested, w.backend.clone(), w.stop_reason.clone()))
        });
        let Some((true, backend_id, reason)) = requested else {
            return;
        };
        let mut inner = self.lock();
        let Some(live) = inner.live.get_mut(worker_id) else {
            return;
        };
        if live.stop_sent || !live.committed {
            return;
        }
        live.stop_sent = true;
        drop(inner);
        if let Some(b) = self.backend_named(&backend_id) {
            // The caller's reason, as a local stop would record it.
            let reason =
                reason.unwrap_or_else(|| "requested through another gaffer process".into());
            b.stop(worker_id, &reason);
        }
    }

    /// `workers/stop`: ends the worker (here, or by asking its owner) and waits briefly for
    /// the final status.
    pub async fn stop(
        self: &Arc<Self>,
        worker_id: &str,
        reason: Option<String>,
    ) -> Result<Worker, WorkerError> {
        self.ready().await;
        let w = self
            .workspace
            .read(|s| s.workers.get(worker_id).cloned())
            .ok_or_else(|| WorkerError::NotFound {
                worker_id: worker_id.to_string(),
            })?;
        if w.status.is_final() {
            return Ok(w);
        }
        let reason = reason.unwrap_or_default();
        if w.status == WorkerStatus::PendingApproval {
            // No process exists; its start operation will find it no longer pending.
            let why = format!("stopped before it was started {reason}");
            self.record_final(
                worker_id,
                StatusChange::ended(worker_id, WorkerStatus::Stopped, why.trim_end()),
            )
            .await?;
            return self.wait_final(worker_id, STOP_WAIT).await;
        }
        if self.owns(&w) && self.lock().live.contains_key(worker_id) {
            if let Some(l) = self.lock().live.get_mut(worker_id) {
                l.stop_sent = true;
            }
            if let Some(b) = self.backend_named(&w.backend) {
                b.stop(worker_id, &reason);
            }
        } else if self.owner_alive(&w) {
            let id = worker_id.to_string();
            let rec = new_record(records::stop_requested(worker_id, Some(&reason)));
            self.workspace
                .commit(move |s: &State| {
                    let running = s
                        .workers
                        .get(&id)
                        .is_some_and(|w| w.status == WorkerStatus::Running);
                    Ok::<_, WorkerError>((if running { vec![rec] } else { vec![] }, ()))
                })
                .await
                .map_err(commit_error)?;
        } else {
            let why = if reason.is_empty() {
                "stopped on request; its gaffer process had already ended".to_string()
            } else {
                format!("stopped on request: {reason}; its gaffer process had already ended")
            };
            self.record_final(
                worker_id,
                StatusChange::ended(worker_id, WorkerStatus::Stopped, why),
            )
            .await?;
        }
        self.wait_final(worker_id, STOP_WAIT).await
    }

    /// Waits until the worker has a final status (or the time is up) and returns it.
    async fn wait_final(&self, worker_id: &str, limit: Duration) -> Result<Worker, WorkerError> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut notices = self.workspace.subscribe();
        loop {
            let w = self
                .workspace
                .read(|s| s.workers.get(worker_id).cloned())
                .ok_or_else(|| WorkerError::NotFound {
                    worker_id: worker_id.to_string(),
                })?;
            if w.status.is_final() || tokio::time::Instant::now() >= deadline {
                return Ok(w);
            }
            let wake = deadline.min(tokio::time::Instant::now() + Duration::from_millis(50));
            let _ = tokio::time::timeout_at(wake, notices.recv()).await;
        }
    }

    /// Ends every worker this process owns and waits (up to `limit` in all) for their final
    /// statuses to be journalled: the graceful counterpart of the startup sweep, for a gaffer
    /// process that is about to exit.
    pub async fn shutdown(self: &Arc<Self>, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        let live: Vec<String> = self.lock().live.keys().cloned().collect();
        let owned: Vec<(String, String)> = self.workspace.read(|s| {
            live.iter()
                .filter_map(|id| s.workers.get(id).map(|w| (id.clone(), w.backend.clone())))
                .collect()
        });
        for (id, backend) in &owned {
            if let Some(l) = self.lock().live.get_mut(id) {
                l.stop_sent = true;
            }
            if let Some(b) = self.backend_named(backend) {
                b.stop(id, "its gaffer process is shutting down");
            }
        }
        for (id, _) in &owned {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let _ = self.wait_final(id, left).await;
        }
        // The flusher lets go of each worker right after its final status is durable.
        while self.live_count() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Number of workers whose process this gaffer process holds.
    pub fn live_count(&self) -> usize {
        self.lock().live.len()
    }

    fn on_event(&self, ev: ExecEvent) {
        let mut inner = self.lock();
        match ev {
            ExecEvent::Output {
                worker_id,
                stream,
                bytes,
            } => {
                if let Some(l) = inner.live.get_mut(&worker_id) {
                    l.buffer.push(stream, &bytes);
                }
            }
            ExecEvent::Ended {
                worker_id,
                status,
                reason,
                exit,
            } => {
                if let Some(l) = inner.live.get_mut(&worker_id) {
                    let mut change = StatusChange::ended(&worker_id, status, reason);
                    change.exit = exit;
                    l.ended = Some(change);
                }
            }
        }
    }

    /// Journals buffered output and final statuses of committed workers (one commit).
    /// Returns true when something could not be written and the flush should be retried.
    async fn flush(&self) -> bool {
        let mut recs = Vec::new();
        let mut finished = Vec::new();
        {
            let mut inner = self.lock();
            for (id, l) in inner.live.iter_mut() {
                if !l.committed {
                    continue;
                }
                let chunks = if l.ended.is_some() {
                    l.buffer.finish()
                } else {
                    l.buffer.take()
                };
                for (stream, text) in chunks {
                    let text = l.scrub_chunk(stream, &text);
                    if !text.is_empty() {
                        recs.push(new_record(records::output(id, stream, &text)));
                    }
                }
                if let Some(change) = l.ended.clone() {
                    for stream in [super::types::Stream::Stdout, super::types::Stream::Stderr] {
                        let rest = match stream {
                            super::types::Stream::Stderr => l.stderr.finish(&l.scrubber),
                            _ => l.stdout.finish(&l.scrubber),
                        };
                        if !rest.is_empty() {
                            recs.push(new_record(records::output(id, stream, &rest)));
                        }
                    }
                    let change = scrub_change(&l.scrubber, change);
                    recs.push(new_record(records::status(&change)));
                    finished.push(id.clone());
                }
            }
        }
        if recs.is_empty() {
            return false;
        }
        #[derive(serde::Deserialize)]
        struct WorkerOf {
            worker_id: String,
        }
        let result = self
            .workspace
            .commit(move |s: &State| {
                // Status records for a worker that is already final are dropped by the fold;
                // filtering here keeps them out of the journal too.
                let keep: Vec<NewRecord> = recs
                    .into_iter()
                    .filter(|r| {
                        r.kind != super::state::STATUS_KIND
                            || serde_json::from_str::<WorkerOf>(r.payload.get())
                                .ok()
                                .and_then(|w| s.workers.get(&w.worker_id))
                                .is_some_and(|w| w.status == WorkerStatus::Running)
                    })
                    .collect();
                Ok::<_, WorkerError>((keep, ()))
            })
            .await;
        match result {
            // Only now does the worker leave `live`: until its final status is durable this
            // process still answers for it (a sweep must not take it for an orphan).
            Ok(()) => {
                if !finished.is_empty() {
                    let records = self.spawn_records();
                    finished.iter().for_each(|id| records.forget(id));
                }
                let mut inner = self.lock();
                for id in &finished {
                    if let Some(change) = inner.live.remove(id).and_then(|l| l.ended) {
                        inner.ended.insert(id.clone(), (change.status, change.exit));
                    }
                }
                false
            }
            // The final status is rebuilt from `ended` and retried.
            Err(e) => {
                tracing::error!(error = %commit_error(e), "worker output could not be journalled");
                !finished.is_empty()
            }
        }
    }

    /// Reacts to a folded notice: input or a stop request for a worker this process holds.
    fn on_notice(&self, n: &Notice) {
        if &*n.method != CHANGED_NOTIFICATION {
            return;
        }
        let Some(id) = n.params.str_field("worker_id") else {
            return;
        };
        if !self.lock().live.contains_key(id) {
            return;
        }
        self.deliver_pending(id);
        self.honour_stop_request(id);
    }

    fn rescan(&self) {
        let ids: Vec<String> = self.lock().live.keys().cloned().collect();
        for id in ids {
            self.deliver_pending(&id);
            self.honour_stop_request(&id);
        }
    }
}

fn scrub_change(sc: &Scrubber, mut c: StatusChange) -> StatusChange {
    c.reason = c.reason.map(|r| sc.scrub(&r));
    c.diagnostic = c.diagnostic.map(|d| sc.scrub(&d));
    c
}

/// A replayed create answers as the original did.
fn replay_answer(w: Worker) -> Result<Worker, WorkerError> {
    if w.status == WorkerStatus::Failed && w.owner.is_none() {
        return Err(WorkerError::SpawnFailed {
            diagnostic: w
                .diagnostic
                .clone()
                .unwrap_or_else(|| "could not be started".to_string()),
            worker_id: w.id,
        });
    }
    Ok(w)
}

async fn run_loop(
    rt: std::sync::Weak<WorkerRuntime>,
    mut events: mpsc::UnboundedReceiver<ExecEvent>,
    mut notices: crate::fanout::Subscription<Notice>,
    nudge: Arc<tokio::sync::Notify>,
) {
    use tokio::time::{Instant, sleep_until};
    // Output is journalled at most once per FLUSH_INTERVAL: the first output after a quiet
    // spell goes out at once (low latency), a burst waits until the interval is over
    // (coalesced). Nothing ticks while no worker is live, so an idle server stays asleep.
    let mut last_flush = Instant::now() - FLUSH_INTERVAL;
    let mut flush_at: Option<Instant> = None;
    let mut sweep = tokio::time::interval(SWEEP_INTERVAL);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    sweep.tick().await; // startup already ran a restore
    let mut rescan = tokio::time::interval(RESCAN_INTERVAL);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let has_live = match rt.upgrade() {
            Some(rt) => rt.live_count() > 0,
            None => return,
        };
        let due = flush_at.unwrap_or_else(Instant::now);
        tokio::select! {
            ev = events.recv() => {
                let Some(ev) = ev else { return };
                let Some(rt) = rt.upgrade() else { return };
                rt.on_event(ev);
                // Take whatever else is already queued before flushing.
                while let Ok(ev) = events.try_recv() {
                    rt.on_event(ev);
                }
                if last_flush.elapsed() >= FLUSH_INTERVAL {
                    last_flush = Instant::now();
                    flush_at = rt.flush().await.then(|| last_flush + FLUSH_INTERVAL);
                } else if flush_at.is_none() {
                    flush_at = Some(last_flush + FLUSH_INTERVAL);
                }
            }
            _ = sleep_until(due), if flush_at.is_some() => {
                let Some(rt) = rt.upgrade() else { return };
                last_flush = Instant::now();
                flush_at = rt.flush().await.then(|| last_flush + FLUSH_INTERVAL);
            }
            _ = nudge.notified() => {
                let Some(rt) = rt.upgrade() else { return };
                last_flush = Instant::now();
                flush_at = rt.flush().await.then(|| last_flush + FLUSH_INTERVAL);
            }
            n = notices.recv() => {
                let Some(rt) = rt.upgrade() else { return };
                match n {
                    Ok(n) => rt.on_notice(&n),
                    Err(broadcast::error::RecvError::Lagged(_)) => rt.rescan(),
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
            _ = sweep.tick() => {
                // Another gaffer process may have died while this one runs: its workers must
                // not keep showing as running to our clients.
                let Some(rt) = rt.upgrade() else { return };
                rt.restore().await;
            }
            _ = rescan.tick(), if has_live => {
                let Some(rt) = rt.upgrade() else { return };
                rt.rescan();
            }
        }
    }
}

#[cfg(test)]
mod tests;

mod start;
pub use start::StartSpec;
