//! The plans this process runs: launching an authorized plan, stopping one, and recording
//! plans whose process went away stopped (nothing relaunches). What a running plan's lanes
//! did is kept here, in memory, as this process observed it ([`Run`]): the journal's copy is
//! for other processes and the audit trail, and an agent can write it, so neither scheduling
//! nor an attested view ever reads lane state from it. The loop itself is in [`super::drive`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio_util::sync::CancellationToken;

use super::spec::LaunchSpec;
use super::state::{Ended, LaneChange, LaneRun, Started, kinds};
use crate::workers::WorkerRuntime;
use crate::workspace::{CommitError, NewRecord, State, Workspace};

/// Why a plan could not be started, stopped or recorded.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("no plan {0}")]
    NotFound(String),
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Store(#[from] crate::workspace::WorkspaceError),
}

impl From<CommitError<PlanError>> for PlanError {
    fn from(e: CommitError<PlanError>) -> Self {
        match e {
            CommitError::Rejected(e) => e,
            CommitError::Store(e) => PlanError::Store(e),
        }
    }
}

/// A lane's identity and scope, known only to the process that runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneIdentity {
    pub client_id: String,
    pub plan_id: String,
    pub lane_id: String,
    pub scope: Vec<String>,
}

/// Lanes this process runs, by client id. Policy rules that match a lane's scope read it here:
/// a record naming a lane proves nothing.
#[derive(Debug, Default)]
pub struct LaneRegistry {
    lanes: Mutex<HashMap<String, LaneIdentity>>,
}

impl LaneRegistry {
    pub fn get(&self, client_id: &str) -> Option<LaneIdentity> {
        self.lock().get(client_id).cloned()
    }
    pub(super) fn insert(&self, l: LaneIdentity) {
        self.lock().insert(l.client_id.clone(), l);
    }
    pub(super) fn remove_plan(&self, plan_id: &str) {
        self.lock().retain(|_, l| l.plan_id != plan_id);
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, LaneIdentity>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Serves a lane's end of its connection (a JSON-RPC session whose identity is the lane).
pub trait LaneServer: Send + Sync {
    fn serve(&self, lane: LaneIdentity, stream: std::os::unix::net::UnixStream);
}

/// The descriptor number a lane worker finds its connection on.
pub const LANE_FD: i32 = 3;

/// One lane as this process ran it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LaneSeen {
    pub run: LaneRun,
    pub worker_id: Option<String>,
    pub detail: Option<String>,
}

/// This process's own account of a plan it runs (or ran): lane runs it observed and the
/// evidence recorded through its lane connections.
#[derive(Debug, Clone, Default)]
pub struct RunState {
    pub lanes: HashMap<String, LaneSeen>,
    /// Evidence recorded through this process, by id, as it was recorded: a journal record
    /// counts only when it is exactly one of these (a forged record reusing an id does not).
    pub evidence: HashMap<String, super::state::EvidenceRecord>,
    pub ended: bool,
}

pub(super) struct Run {
    pub(super) stop: CancellationToken,
    pub(super) state: Mutex<RunState>,
}

impl Run {
    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, RunState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct PlanRuntime {
    pub(super) ws: Arc<Workspace>,
    pub(super) workers: Arc<WorkerRuntime>,
    executor: String,
    pub(super) lanes: Arc<LaneRegistry>,
    pub(super) server: OnceLock<Arc<dyn LaneServer>>,
    runs: Mutex<HashMap<String, Arc<Run>>>,
}

/// Plans whose account this process keeps after they end (for attested views).
const RUNS_KEPT: usize = 256;

impl PlanRuntime {
    pub fn new(ws: Arc<Workspace>, workers: Arc<WorkerRuntime>, executor: String) -> Arc<Self> {
        Arc::new(PlanRuntime {
            ws,
            workers,
            executor,
            lanes: Arc::new(LaneRegistry::default()),
            server: OnceLock::new(),
            runs: Mutex::new(HashMap::new()),
        })
    }

    pub fn lanes(&self) -> &Arc<LaneRegistry> {
        &self.lanes
    }

    pub fn workspace(&self) -> &Arc<Workspace> {
        &self.ws
    }

    /// Set once by the method layer, which can serve sessions.
    pub fn set_server(&self, server: Arc<dyn LaneServer>) {
        let _ = self.server.set(server);
    }

    fn runs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Run>>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn run(&self, plan_id: &str) -> Option<Arc<Run>> {
        self.runs().get(plan_id).cloned()
    }

    /// This process's account of a plan it ran, if it ran it.
    pub fn attested(&self, plan_id: &str) -> Option<RunState> {
        self.run(plan_id).map(|r| r.state().clone())
    }

    /// Notes evidence recorded through this process (its lane connections or its operator).
    pub fn attest_evidence(&self, rec: &super::state::EvidenceRecord) {
        if let Some(r) = self.run(&rec.plan_id) {
            r.state()
                .evidence
                .insert(rec.evidence_id.clone(), rec.clone());
        }
    }

    /// Starts running an authorized plan (the `plan.launch` execution). Idempotent for the
    /// operation that launched it; any other operation naming the plan is refused.
    pub async fn launch(
        self: &Arc<Self>,
        operation_id: &str,
        client_id: &str,
        spec: LaunchSpec,
        sandbox: crate::sandbox::Setting,
    ) -> Result<(), PlanError> {
        if self.server.get().is_none() {
            return Err(PlanError::Refused(
                "this gaffer process cannot serve lane connections".into(),
            ));
        }
        if spec.plan_id != super::spec::plan_id(operation_id) {
            return Err(PlanError::Refused(
                "the plan is not this operation's".into(),
            ));
        }
        let run = {
            let mut runs = self.runs();
            if runs.contains_key(&spec.plan_id) {
                return Ok(());
            }
            if runs.len() >= RUNS_KEPT {
                let done: Vec<String> = runs
                    .iter()
                    .filter(|(_, r)| r.state().ended)
                    .map(|(id, _)| id.clone())
                    .collect();
                for id in done.into_iter().take(RUNS_KEPT / 2) {
                    runs.remove(&id);
                }
            }
            let state = RunState {
                lanes: spec
                    .lanes
                    .iter()
                    .map(|l| (l.lane_id.clone(), LaneSeen::default()))
                    .collect(),
                ..RunState::default()
            };
            let run = Arc::new(Run {
                stop: CancellationToken::new(),
                state: Mutex::new(state),
            });
            runs.insert(spec.plan_id.clone(), Arc::clone(&run));
            run
        };
        let started = Started {
            plan_id: spec.plan_id.clone(),
            operation_id: operation_id.to_string(),
            client_id: client_id.to_string(),
            executor: self.executor.clone(),
            spec: spec.clone(),
        };
        let plan_id = spec.plan_id.clone();
        let op = operation_id.to_string();
        let rec = record(kinds::STARTED, &started);
        let fresh = self
            .ws
            .commit(move |s: &State| {
                // The folded plan, if any, must be this operation's: lanes run for whoever the
                // fold says launched it.
                let fresh = s
                    .plans
                    .get(&plan_id)
                    .is_none_or(|p| p.executor.is_none() && p.operation_id == op);
                Ok::<_, PlanError>((if fresh { vec![rec] } else { vec![] }, fresh))
            })
            .await;
        if !matches!(fresh, Ok(true)) {
            self.runs().remove(&spec.plan_id);
            fresh?;
            return Err(PlanError::Refused(
                "the plan was already started by another gaffer process".into(),
            ));
        }
        // The fold took the record as this process's run of this operation's plan, launched by
        // the client whose operation executes.
        let taken = self.ws.read(|s| {
            s.plans.get(&spec.plan_id).is_some_and(|p| {
                p.operation_id == operation_id
                    && p.client_id == client_id
                    && p.executor.as_deref() == Some(&self.executor)
            })
        });
        if !taken {
            self.runs().remove(&spec.plan_id);
            return Err(PlanError::Refused(
                "the plan's records name another operation or executor".into(),
            ));
        }
        let me = Arc::clone(self);
        let op = operation_id.to_string();
        tokio::spawn(async move {
            me.drive(op, spec, sandbox, run).await;
        });
        Ok(())
    }

    /// Asks the plan's runner to stop it; when no live process runs it, records it stopped.
    pub async fn stop(&self, plan_id: &str, reason: String, by: String) -> Result<(), PlanError> {
        let stop = super::state::StopRequested {
            plan_id: plan_id.to_string(),
            reason: reason.clone(),
            by,
        };
        let running_here = self.run(plan_id).filter(|r| !r.state().ended);
        let live_executors = self.live_executors();
        let id = plan_id.to_string();
        let stop_rec = record(kinds::STOP_REQUESTED, &stop);
        let ended_rec = record(
            kinds::ENDED,
            &Ended {
                plan_id: id.clone(),
                stopped: true,
                reason: format!("stopped: {reason}"),
            },
        );
        let here = running_here.is_some();
        self.ws
            .commit(move |s: &State| {
                let Some(p) = s.plans.get(&id) else {
                    return Err(PlanError::NotFound(id.clone()));
                };
                if p.ended.is_some() {
                    return Ok((vec![], ()));
                }
                let owner_alive = p
                    .executor
                    .as_ref()
                    .is_some_and(|e| live_executors.contains(e));
                // Nobody will act on a request: the plan is stopped now.
                let recs = if here || owner_alive {
                    vec![stop_rec]
                } else {
                    vec![stop_rec, ended_rec]
                };
                Ok((recs, ()))
            })
            .await?;
        if let Some(r) = running_here {
            r.stop.cancel();
        }
        Ok(())
    }

    fn live_executors(&self) -> Vec<String> {
        crate::operations::live_executors(&self.ws.gaffer_dir().join("peers"))
    }

    /// Plans recorded running by a process that is gone are recorded stopped (their workers
    /// are stopped by the worker runtime's own restore); nothing is relaunched.
    pub async fn restore(&self) {
        let live = self.live_executors();
        let orphans: Vec<(String, String)> = self.ws.read(|s| {
            s.plans
                .list()
                .filter(|p| p.ended.is_none())
                .filter_map(|p| p.executor.clone().map(|e| (p.plan_id.clone(), e)))
                .filter(|(_, e)| *e != self.executor && !live.contains(e))
                .collect()
        });
        for (plan_id, executor) in orphans {
            let reason = format!(
                "its gaffer process ({executor}) ended; lanes are not relaunched without a new request"
            );
            if let Err(e) = self.record_orphan_stopped(&plan_id, &reason).await {
                tracing::warn!(plan = %plan_id, error = %e, "could not record an orphaned plan stopped");
            }
        }
    }

    /// Records the unfinished lanes of a plan nobody runs any more stopped, and the plan ended.
    async fn record_orphan_stopped(&self, plan_id: &str, reason: &str) -> Result<(), PlanError> {
        let id = plan_id.to_string();
        let reason = reason.to_string();
        self.ws
            .commit(move |s: &State| {
                let Some(p) = s.plans.get(&id) else {
                    return Ok((vec![], ()));
                };
                if p.ended.is_some() {
                    return Ok((vec![], ()));
                }
                let mut recs: Vec<NewRecord> = p
                    .lanes
                    .iter()
                    .filter(|(_, l)| !l.run.is_final())
                    .map(|(lane_id, l)| {
                        record(
                            kinds::LANE,
                            &LaneChange {
                                plan_id: id.clone(),
                                lane_id: lane_id.clone(),
                                run: LaneRun::Stopped,
                                worker_id: l.worker_id.clone(),
                                detail: Some(reason.clone()),
                            },
                        )
                    })
                    .collect();
                recs.push(record(
                    kinds::ENDED,
                    &Ended {
                        plan_id: id.clone(),
                        stopped: true,
                        reason: reason.clone(),
                    },
                ));
                Ok::<_, PlanError>((recs, ()))
            })
            .await
            .map_err(PlanError::from)
    }
}

pub(super) fn record<T: serde::Serialize>(kind: &str, payload: &T) -> NewRecord {
    NewRecord::text(
        kind,
        serde_json::value::to_raw_value(payload)
            .unwrap_or_else(|_| serde_json::value::RawValue::NULL.to_owned()),
    )
}
