//! Starting a `pending_approval` worker: only the executing, authorized `worker.start`
//! operation calls this, with the profile and declarations taken from its plan.

use std::sync::Arc;

use super::{LiveWorker, WorkerRuntime, commit_error, new_record};
use crate::bundles::{self, Declaration, Profile};
use crate::operations::lifecycle::OpState;
use crate::secrets::{self, Scrubber};
use crate::workers::backend::SpawnRequest;
use crate::workers::plan::WorkerError;
use crate::workers::spawned::InputKey;
use crate::workers::state::{Started, StatusChange, records};
use crate::workers::types::{Owner, Segment, Worker, WorkerStatus};
use crate::workspace::State;

/// Where a pending worker's gating operation stands.
enum Gate {
    /// Not decided or still executing: the start may yet come.
    Open,
    /// Succeeded: its executor starts the worker (a plan's lanes, one after another).
    Succeeded,
    /// Denied, expired, cancelled or failed: nothing will start it.
    Ended,
}

/// What an authorized plan says to run.
#[derive(Debug, Clone)]
pub struct StartSpec {
    pub worker_id: String,
    pub operation_id: String,
    pub profile: Profile,
    pub declarations: Vec<Declaration>,
    /// The initial input, for profiles that take it as an argument.
    pub argument_input: Option<Vec<Segment>>,
    /// A connection the worker inherits as descriptor 3 (a plan lane's link back to gaffer).
    pub channel: Option<Arc<std::os::fd::OwnedFd>>,
    /// Variables set besides the base environment (lane names; never secrets).
    pub env: Vec<(String, String)>,
    /// The trusted policy's word on the sandbox.
    pub sandbox: crate::sandbox::Setting,
}

impl WorkerRuntime {
    /// Records which operation gates a pending worker.
    pub async fn link_operation(
        &self,
        worker_id: &str,
        operation_id: &str,
    ) -> Result<(), WorkerError> {
        let rec = new_record(records::start_requested(worker_id, operation_id));
        let id = worker_id.to_string();
        self.workspace
            .commit(move |s: &State| {
                let pending = s.workers.get(&id).is_some_and(|w| {
                    w.status == WorkerStatus::PendingApproval && w.operation_id.is_none()
                });
                Ok::<_, WorkerError>((if pending { vec![rec] } else { vec![] }, ()))
            })
            .await
            .map_err(commit_error)
    }

    /// Spawns the worker's process and records it running (or failed, with the reason).
    pub async fn start_worker(self: &Arc<Self>, spec: StartSpec) -> Result<Worker, WorkerError> {
        self.ready().await;
        let id = spec.worker_id.clone();
        let pending = self.workspace.read(|s| {
            s.workers
                .get(&id)
                .map(|w| w.status == WorkerStatus::PendingApproval)
        });
        match pending {
            None => return Err(WorkerError::NotFound { worker_id: id }),
            Some(false) => {
                return Err(WorkerError::NotInputCapable {
                    worker_id: id,
                    why: "it is no longer pending approval".to_string(),
                });
            }
            Some(true) => {}
        }
        let secrets = secrets::resolve(&spec.declarations);
        let key = InputKey::new().map_err(|e| format!("no random source for the input key: {e}"));
        let spawned = match (&secrets, &key) {
            (Ok(found), Ok(key)) => self.spawn_live(&spec, found, *key),
            (Err(e), _) => Err(e.to_string()),
            (_, Err(e)) => Err(e.clone()),
        };
        if let (Ok(s), Ok(key)) = (&spawned, &key)
            && let Some(pid) = s.child_pid
        {
            // Before the start is durable: a sweep that finds it orphaned can then prove it, and
            // another gaffer process on this machine can sign input for it.
            self.spawn_records()
                .remember(&id, pid, s.child_start_ticks, key);
        }
        let record = match &spawned {
            Ok(s) => new_record(records::started(&Started {
                worker_id: id.clone(),
                operation_id: spec.operation_id.clone(),
                owner: Owner {
                    child_pid: s.child_pid,
                    child_start_ticks: s.child_start_ticks,
                    ..self.me.clone()
                },
                run_state: s.run_state,
                input_capable: s.input_capable,
            })),
            Err(diag) => {
                let mut change =
                    StatusChange::ended(&id, WorkerStatus::Failed, "could not be started");
                change.diagnostic = Some(diag.clone());
                new_record(records::status(&change))
            }
        };
        let id2 = id.clone();
        let recorded = self
            .workspace
            .commit(move |s: &State| {
                let pending = s
                    .workers
                    .get(&id2)
                    .is_some_and(|w| w.status == WorkerStatus::PendingApproval);
                Ok::<_, WorkerError>((if pending { vec![record] } else { vec![] }, pending))
            })
            .await;
        if !matches!(recorded, Ok(true)) {
            // Stopped meanwhile, or not durable: the process must not outlive the decision.
            if self.lock().live.remove(&id).is_some()
                && let Some(b) = self.backend_named_for(&id)
            {
                b.stop(&id, "its start was not recorded");
            }
            self.spawn_records().forget(&id);
            recorded.map_err(commit_error)?;
            return Err(WorkerError::NotInputCapable {
                worker_id: id,
                why: "it stopped before it could start".to_string(),
            });
        }
        if let Err(diagnostic) = spawned {
            return Err(WorkerError::SpawnFailed {
                worker_id: id,
                diagnostic,
            });
        }
        if let Some(l) = self.lock().live.get_mut(&id) {
            l.committed = true;
            if spec.profile.input_mode == bundles::InputMode::Argument {
                // The initial input went in as an argument; nothing to deliver on stdin.
                l.delivered_seq = u64::MAX;
            }
        }
        self.deliver_pending(&id);
        self.flush_now.notify_one();
        self.workspace
            .read(|s| s.workers.get(&id).cloned())
            .ok_or(WorkerError::NotFound { worker_id: id })
    }

    fn spawn_live(
        &self,
        spec: &StartSpec,
        secrets: &[secrets::Secret],
        input_key: InputKey,
    ) -> Result<crate::workers::backend::Spawned, String> {
        let backend = self.backend_for(&spec.profile, &spec.declarations)?;
        let live = LiveWorker {
            scrubber: Scrubber::new(secrets),
            input_key: Some(input_key),
            ..LiveWorker::default()
        };
        let scrubber = live.scrubber.clone();
        self.lock().live.insert(spec.worker_id.clone(), live);
        let spawned = backend.spawn(
            SpawnRequest {
                worker_id: &spec.worker_id,
                profile: &spec.profile,
                declarations: &spec.declarations,
                initial_input: spec.argument_input.as_deref(),
                workspace_root: self.workspace.root(),
                secrets,
                channel: spec.channel.as_deref(),
                env: &spec.env,
                sandbox: spec.sandbox,
            },
            self.events_tx.clone(),
        );
        spawned.map_err(|diag| {
            self.lock().live.remove(&spec.worker_id);
            scrubber.scrub(&diag)
        })
    }

    fn backend_named_for(
        &self,
        worker_id: &str,
    ) -> Option<Arc<dyn crate::workers::ExecutionBackend>> {
        let backend = self
            .workspace
            .read(|s| s.workers.get(worker_id).map(|w| w.backend.clone()))?;
        self.backend_named(&backend)
    }

    /// Pending workers that can never start become stopped: their creating process died
    /// before requesting the start, or their start operation ended without starting them
    /// (denied, expired, cancelled, failed). Nothing is ever started here.
    ///
    /// A plan's launch is one operation that succeeds before its later lanes start; their
    /// workers wait under it, and only their creator's death makes them unstartable.
    pub(super) async fn retire_unstartable(&self) {
        let pending: Vec<(Worker, Option<Gate>)> = self.workspace.read(|s| {
            s.workers
                .list()
                .filter(|w| w.status == WorkerStatus::PendingApproval)
                .map(|w| {
                    let gate = w.operation_id.as_deref().map(|id| {
                        match s.operations.get(id).map(|o| o.state) {
                            Some(OpState::Succeeded) => Gate::Succeeded,
                            Some(st) if st.is_terminal() => Gate::Ended,
                            _ => Gate::Open,
                        }
                    });
                    (w.clone(), gate)
                })
                .collect()
        });
        for (w, gate) in pending {
            let why = match gate {
                Some(Gate::Ended) => "its start operation ended without starting it",
                Some(Gate::Succeeded) if !self.creator_alive(&w) => {
                    "its gaffer process ended before it started the worker"
                }
                None if !self.creator_alive(&w) => {
                    "its gaffer process ended before the start was requested"
                }
                _ => continue,
            };
            if let Err(e) = self
                .record_final(
                    &w.id,
                    StatusChange::ended(&w.id, WorkerStatus::Stopped, why),
                )
                .await
            {
                tracing::warn!(worker = %w.id, error = %e, "could not retire a pending worker");
            }
        }
    }

    fn creator_alive(&self, w: &Worker) -> bool {
        w.owner.as_ref().is_some_and(|o| {
            o.process_id == self.me.process_id
                || crate::workers::procinfo::is_alive(o.pid, o.start_ticks)
        })
    }
}
