//! Running an authorized plan in this process: lane workers are created through the one create
//! path and started under the `plan.launch` operation that authorized them, each with its own
//! connection back to gaffer (its identity is the connection, see [`LaneServer`]); lanes start
//! as the mechanism allows (a free slot, succeeded dependencies, the previous step's outcome)
//! and their ends are recorded. Nothing here survives the process: after a restart a running
//! plan is recorded stopped and nothing relaunches.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::spec::{LaneSpec, LaunchSpec};
use super::state::{Ended, LaneChange, LaneRun, Started, kinds, lane_client};
use crate::patterns::runtime::Mechanism;
use crate::workers::types::{Segment, WorkerStatus};
use crate::workers::{StartSpec, WorkerRuntime};
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
    fn insert(&self, l: LaneIdentity) {
        self.lock().insert(l.client_id.clone(), l);
    }
    fn remove_plan(&self, plan_id: &str) {
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

pub struct PlanRuntime {
    ws: Arc<Workspace>,
    workers: Arc<WorkerRuntime>,
    executor: String,
    lanes: Arc<LaneRegistry>,
    server: OnceLock<Arc<dyn LaneServer>>,
    live: Mutex<HashMap<String, CancellationToken>>,
}

impl PlanRuntime {
    pub fn new(ws: Arc<Workspace>, workers: Arc<WorkerRuntime>, executor: String) -> Arc<Self> {
        Arc::new(PlanRuntime {
            ws,
            workers,
            executor,
            lanes: Arc::new(LaneRegistry::default()),
            server: OnceLock::new(),
            live: Mutex::new(HashMap::new()),
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

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, CancellationToken>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_running_here(&self, plan_id: &str) -> bool {
        self.live().contains_key(plan_id)
    }

    /// Starts running an authorized plan (the `plan.launch` execution). Idempotent.
    pub async fn launch(
        self: &Arc<Self>,
        operation_id: &str,
        spec: LaunchSpec,
        sandbox: crate::sandbox::Setting,
    ) -> Result<(), PlanError> {
        if self.server.get().is_none() {
            return Err(PlanError::Refused(
                "this gaffer process cannot serve lane connections".into(),
            ));
        }
        let token = CancellationToken::new();
        {
            let mut live = self.live();
            if live.contains_key(&spec.plan_id) {
                return Ok(());
            }
            live.insert(spec.plan_id.clone(), token.clone());
        }
        let started = Started {
            plan_id: spec.plan_id.clone(),
            operation_id: operation_id.to_string(),
            executor: self.executor.clone(),
            spec: spec.clone(),
        };
        let plan_id = spec.plan_id.clone();
        let rec = record(kinds::STARTED, &started);
        let fresh = self
            .ws
            .commit(move |s: &State| {
                let fresh = s.plans.get(&plan_id).is_none_or(|p| p.executor.is_none());
                Ok::<_, PlanError>((if fresh { vec![rec] } else { vec![] }, fresh))
            })
            .await?;
        if !fresh {
            self.live().remove(&spec.plan_id);
            return Err(PlanError::Refused(
                "the plan was already started by another gaffer process".into(),
            ));
        }
        let me = Arc::clone(self);
        let op = operation_id.to_string();
        tokio::spawn(async move {
            me.drive(op, spec, sandbox, token).await;
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
        let running_here = self.live().get(plan_id).cloned();
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
        if let Some(t) = running_here {
            t.cancel();
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
            if let Err(e) = self.end_lanes_stopped(&plan_id, &reason).await {
                tracing::warn!(plan = %plan_id, error = %e, "could not record an orphaned plan stopped");
            }
        }
    }

    /// Records every unfinished lane stopped and the plan ended by a stop.
    async fn end_lanes_stopped(&self, plan_id: &str, reason: &str) -> Result<(), PlanError> {
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

    /// The plan's loop: settle ended lanes, start what may start, until every lane is final.
    async fn drive(
        self: Arc<Self>,
        operation_id: String,
        spec: LaunchSpec,
        sandbox: crate::sandbox::Setting,
        stop: CancellationToken,
    ) {
        let mut notices = self.ws.subscribe();
        let mechanism = Mechanism::parse(&spec.mechanism).unwrap_or(Mechanism::Direct);
        loop {
            if stop.is_cancelled() || self.stop_requested(&spec.plan_id) {
                self.stop_lanes(&spec).await;
                break;
            }
            match self.step(&operation_id, &spec, mechanism, sandbox).await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => tracing::warn!(plan = %spec.plan_id, error = %e, "plan step failed"),
            }
            tokio::select! {
                _ = notices.recv() => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = stop.cancelled() => {}
            }
        }
        self.lanes.remove_plan(&spec.plan_id);
        self.live().remove(&spec.plan_id);
    }

    fn stop_requested(&self, plan_id: &str) -> bool {
        self.ws.read(|s| {
            s.plans
                .get(plan_id)
                .is_some_and(|p| p.stop_requested.is_some() || p.ended.is_some())
        })
    }

    async fn stop_lanes(&self, spec: &LaunchSpec) {
        let workers: Vec<String> = self.ws.read(|s| {
            s.plans
                .get(&spec.plan_id)
                .map(|p| {
                    p.lanes
                        .values()
                        .filter(|l| l.run == LaneRun::Running)
                        .filter_map(|l| l.worker_id.clone())
                        .collect()
                })
                .unwrap_or_default()
        });
        for w in workers {
            if let Err(e) = self
                .workers
                .stop(&w, Some("its plan was stopped".into()))
                .await
            {
                tracing::warn!(worker = %w, error = %e, "could not stop a lane worker");
            }
        }
        let reason = self
            .ws
            .read(|s| {
                s.plans
                    .get(&spec.plan_id)
                    .and_then(|p| p.stop_requested.as_ref().map(|r| r.reason.clone()))
            })
            .unwrap_or_else(|| "this gaffer process is shutting down".into());
        if let Err(e) = self
            .end_lanes_stopped(&spec.plan_id, &format!("stopped: {reason}"))
            .await
        {
            tracing::warn!(plan = %spec.plan_id, error = %e, "could not record a stopped plan");
        }
    }

    /// One pass. Returns true once the plan has ended.
    async fn step(
        &self,
        operation_id: &str,
        spec: &LaunchSpec,
        mechanism: Mechanism,
        sandbox: crate::sandbox::Setting,
    ) -> Result<bool, PlanError> {
        let runs = self.settle(spec).await?;
        let next = schedule(mechanism, spec, &runs);
        for (i, change) in next {
            match change {
                LaneRun::Blocked => {
                    let lane = &spec.lanes[i];
                    let failed: Vec<&str> = lane
                        .depends_on
                        .iter()
                        .filter(|d| {
                            runs.get(d.as_str())
                                .is_some_and(|r| r.0.is_final() && r.0 != LaneRun::Succeeded)
                        })
                        .map(String::as_str)
                        .collect();
                    self.record_lane(
                        spec,
                        &lane.lane_id,
                        LaneRun::Blocked,
                        None,
                        Some(format!("blocked: {} did not succeed", failed.join(", "))),
                    )
                    .await?;
                }
                _ => {
                    self.start_lane(operation_id, spec, i, mechanism, sandbox, &runs)
                        .await?
                }
            }
        }
        let runs = self.ws.read(|s| lane_runs(s, &spec.plan_id));
        if !runs.values().all(|r| r.0.is_final()) {
            return Ok(false);
        }
        let rec = record(
            kinds::ENDED,
            &Ended {
                plan_id: spec.plan_id.clone(),
                stopped: false,
                reason: "every lane ended".into(),
            },
        );
        let id = spec.plan_id.clone();
        self.ws
            .commit(move |s: &State| {
                let open = s.plans.get(&id).is_some_and(|p| p.ended.is_none());
                Ok::<_, PlanError>((if open { vec![rec] } else { vec![] }, ()))
            })
            .await?;
        Ok(true)
    }

    /// Records lanes whose worker reached a final status; returns each lane's run and worker.
    async fn settle(&self, spec: &LaunchSpec) -> Result<LaneRuns, PlanError> {
        let ended: Vec<(String, String, LaneRun, String)> = self.ws.read(|s| {
            let Some(p) = s.plans.get(&spec.plan_id) else {
                return Vec::new();
            };
            p.lanes
                .iter()
                .filter(|(_, l)| l.run == LaneRun::Running)
                .filter_map(|(id, l)| {
                    let w = s.workers.get(l.worker_id.as_deref()?)?;
                    if !w.status.is_final() {
                        return None;
                    }
                    let ok = w.status == WorkerStatus::Stopped
                        && w.exit.as_ref().is_some_and(|e| e.code == Some(0));
                    let run = if ok {
                        LaneRun::Succeeded
                    } else {
                        LaneRun::Failed
                    };
                    let detail = w
                        .diagnostic
                        .clone()
                        .or_else(|| w.reason.clone())
                        .unwrap_or_else(|| format!("worker {:?}", w.status).to_lowercase());
                    Some((id.clone(), w.id.clone(), run, detail))
                })
                .collect()
        });
        for (lane_id, worker_id, run, detail) in ended {
            self.record_lane(spec, &lane_id, run, Some(worker_id), Some(detail))
                .await?;
        }
        Ok(self.ws.read(|s| lane_runs(s, &spec.plan_id)))
    }

    async fn record_lane(
        &self,
        spec: &LaunchSpec,
        lane_id: &str,
        run: LaneRun,
        worker_id: Option<String>,
        detail: Option<String>,
    ) -> Result<(), PlanError> {
        let change = LaneChange {
            plan_id: spec.plan_id.clone(),
            lane_id: lane_id.to_string(),
            run,
            worker_id,
            detail,
        };
        let rec = record(kinds::LANE, &change);
        self.ws
            .commit(move |s: &State| {
                let current = s
                    .plans
                    .get(&change.plan_id)
                    .and_then(|p| p.lanes.get(&change.lane_id))
                    .map(|l| l.run);
                let moves = current.is_some_and(|c| !c.is_final() && c != run);
                Ok::<_, PlanError>((if moves { vec![rec] } else { vec![] }, ()))
            })
            .await
            .map_err(PlanError::from)
    }

    /// Creates the lane's worker, opens its connection and starts it under the launch.
    async fn start_lane(
        &self,
        operation_id: &str,
        spec: &LaunchSpec,
        i: usize,
        mechanism: Mechanism,
        sandbox: crate::sandbox::Setting,
        runs: &LaneRuns,
    ) -> Result<(), PlanError> {
        let lane = &spec.lanes[i];
        let identity = LaneIdentity {
            client_id: lane_client(&spec.plan_id, &lane.lane_id),
            plan_id: spec.plan_id.clone(),
            lane_id: lane.lane_id.clone(),
            scope: lane.scope.clone(),
        };
        let input = lane_input(self, lane, mechanism, runs);
        match self
            .spawn_lane(operation_id, spec, lane, &identity, input, sandbox)
            .await
        {
            Ok(worker_id) => {
                self.record_lane(spec, &lane.lane_id, LaneRun::Running, Some(worker_id), None)
                    .await
            }
            Err((worker_id, why)) => {
                tracing::warn!(plan = %spec.plan_id, lane = %lane.lane_id, error = %why, "lane did not start");
                self.record_lane(spec, &lane.lane_id, LaneRun::Failed, worker_id, Some(why))
                    .await
            }
        }
    }

    async fn spawn_lane(
        &self,
        operation_id: &str,
        spec: &LaunchSpec,
        lane: &LaneSpec,
        identity: &LaneIdentity,
        input: String,
        sandbox: crate::sandbox::Setting,
    ) -> Result<String, (Option<String>, String)> {
        let fail = |w: Option<&str>, e: String| (w.map(str::to_string), e);
        let argument_input =
            (lane.profile.input_mode == crate::bundles::InputMode::Argument).then(|| {
                vec![Segment::Text {
                    content: input.clone(),
                }]
            });
        let params = json!({
            "profile": lane.profile.selector,
            "config_bundle": spec.config_bundle,
            "initial_input": input,
            "idempotency_key": format!("{}:{}", spec.plan_id, lane.lane_id),
        });
        let mut req = crate::workers::request::parse_create(&params, Some(self.ws.root()))
            .map_err(|e| fail(None, e.to_string()))?;
        req.created_by = Some(identity.client_id.clone());
        let worker = self
            .workers
            .create(req)
            .await
            .map_err(|e| fail(None, e.to_string()))?;
        let w = Some(worker.id.as_str());
        self.workers
            .link_operation(&worker.id, operation_id)
            .await
            .map_err(|e| fail(w, e.to_string()))?;
        let (ours, theirs) =
            std::os::unix::net::UnixStream::pair().map_err(|e| fail(w, e.to_string()))?;
        let server = self
            .server
            .get()
            .ok_or_else(|| fail(w, "no lane server".into()))?;
        self.lanes.insert(identity.clone());
        server.serve(identity.clone(), ours);
        let start = StartSpec {
            worker_id: worker.id.clone(),
            operation_id: operation_id.to_string(),
            profile: lane.profile.clone(),
            declarations: spec.declarations.clone(),
            argument_input,
            channel: Some(Arc::new(OwnedFd::from(theirs))),
            env: vec![
                ("GAFFER_LANE_FD".into(), LANE_FD.to_string()),
                ("GAFFER_PLAN_ID".into(), spec.plan_id.clone()),
                ("GAFFER_LANE_ID".into(), lane.lane_id.clone()),
                ("GAFFER_LANE_CLIENT".into(), identity.client_id.clone()),
            ],
            sandbox,
        };
        let started = self
            .workers
            .start_worker(start)
            .await
            .map_err(|e| fail(w, e.to_string()))?;
        Ok(started.id)
    }
}

/// The lane's initial input: its prompt contract, and for a continuation step the previous
/// step's outcome.
fn lane_input(rt: &PlanRuntime, lane: &LaneSpec, mechanism: Mechanism, runs: &LaneRuns) -> String {
    let mut text = lane.prompt.clone();
    if mechanism != Mechanism::Continuation {
        return text;
    }
    let Some(prev) = lane.depends_on.first() else {
        return text;
    };
    let worker = runs.get(prev).and_then(|r| r.1.clone());
    let outcome = worker.map(|w| {
        rt.ws.read(|s| {
            let (entries, _) = s.workers.transcript(&w, 0, 10_000);
            let said: Vec<String> = entries
                .iter()
                .filter(|e| e.stream == crate::workers::Stream::Stdout)
                .map(|e| e.text.clone())
                .collect();
            let tail = said.join("");
            let tail: String = tail
                .chars()
                .rev()
                .take(2000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let status = s
                .workers
                .get(&w)
                .map(|w| format!("{:?}", w.status).to_lowercase())
                .unwrap_or_else(|| "unknown".into());
            (status, tail)
        })
    });
    text.push_str(&format!("\n\nPrevious step ({prev}) outcome:\n"));
    match outcome {
        Some((status, tail)) => {
            text.push_str(&format!("status: {status}\noutput:\n{tail}"));
        }
        None => text.push_str("unknown\n"),
    }
    text
}

/// Each lane's run and worker.
pub type LaneRuns = HashMap<String, (LaneRun, Option<String>)>;

fn lane_runs(s: &State, plan_id: &str) -> LaneRuns {
    s.plans
        .get(plan_id)
        .map(|p| {
            p.lanes
                .iter()
                .map(|(id, l)| (id.clone(), (l.run, l.worker_id.clone())))
                .collect()
        })
        .unwrap_or_default()
}

/// Which waiting lanes start now (or become blocked), by mechanism: at most `max_parallel`
/// running at once; a lane with dependencies only after every one of them succeeded, and
/// blocked as soon as one did not.
pub fn schedule(mechanism: Mechanism, spec: &LaunchSpec, runs: &LaneRuns) -> Vec<(usize, LaneRun)> {
    let run_of = |id: &str| runs.get(id).map(|r| r.0).unwrap_or_default();
    let mut running = spec
        .lanes
        .iter()
        .filter(|l| run_of(&l.lane_id) == LaneRun::Running)
        .count();
    let cap = match mechanism {
        Mechanism::Direct | Mechanism::Continuation => 1,
        _ => spec.max_parallel.max(1) as usize,
    };
    let mut out = Vec::new();
    for (i, lane) in spec.lanes.iter().enumerate() {
        if run_of(&lane.lane_id) != LaneRun::Waiting {
            continue;
        }
        let deps: Vec<LaneRun> = lane.depends_on.iter().map(|d| run_of(d)).collect();
        if deps
            .iter()
            .any(|d| d.is_final() && *d != LaneRun::Succeeded)
        {
            out.push((i, LaneRun::Blocked));
            continue;
        }
        if deps.iter().any(|d| *d != LaneRun::Succeeded) || running >= cap {
            continue;
        }
        running += 1;
        out.push((i, LaneRun::Running));
    }
    out
}

fn record<T: serde::Serialize>(kind: &str, payload: &T) -> NewRecord {
    NewRecord {
        kind: kind.to_string(),
        payload: serde_json::to_value(payload).unwrap_or(serde_json::Value::Null),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plans::spec::LaneSpec;

    fn lane(id: &str, deps: &[&str]) -> LaneSpec {
        LaneSpec {
            lane_id: id.into(),
            role: "builder".into(),
            scope: vec![],
            profile: serde_json::from_value(
                json!({"selector": {"kind": "named", "value": "p"}, "command": ["true"]}),
            )
            .unwrap(),
            argv: vec!["true".into()],
            depends_on: deps.iter().map(|d| d.to_string()).collect(),
            prompt: String::new(),
            expectations: vec![],
        }
    }

    fn spec(lanes: Vec<LaneSpec>, max_parallel: u32) -> LaunchSpec {
        LaunchSpec {
            plan_id: "pl_t".into(),
            selection_digest: String::new(),
            objective: String::new(),
            pattern: String::new(),
            overlays: vec![],
            mechanism: String::new(),
            max_parallel,
            config_bundle: crate::bundles::BundleRef {
                id: "b".into(),
                digest: "d".into(),
            },
            declarations: vec![],
            secrets: vec![],
            lanes,
        }
    }

    fn runs(v: &[(&str, LaneRun)]) -> LaneRuns {
        v.iter()
            .map(|(id, r)| (id.to_string(), (*r, None)))
            .collect()
    }

    #[test]
    fn ephemeral_lanes_fill_free_slots_only() {
        let s = spec(vec![lane("a", &[]), lane("b", &[]), lane("c", &[])], 2);
        let r = runs(&[
            ("a", LaneRun::Running),
            ("b", LaneRun::Waiting),
            ("c", LaneRun::Waiting),
        ]);
        assert_eq!(
            schedule(Mechanism::EphemeralWorkers, &s, &r),
            vec![(1, LaneRun::Running)]
        );
        let r = runs(&[
            ("a", LaneRun::Running),
            ("b", LaneRun::Running),
            ("c", LaneRun::Waiting),
        ]);
        assert!(schedule(Mechanism::EphemeralWorkers, &s, &r).is_empty());
    }

    #[test]
    fn graph_tasks_wait_for_success_and_block_on_anything_else() {
        let s = spec(
            vec![lane("a", &[]), lane("b", &["a"]), lane("c", &["b"])],
            3,
        );
        let r = runs(&[
            ("a", LaneRun::Running),
            ("b", LaneRun::Waiting),
            ("c", LaneRun::Waiting),
        ]);
        assert!(schedule(Mechanism::TaskGraph, &s, &r).is_empty());
        let r = runs(&[
            ("a", LaneRun::Succeeded),
            ("b", LaneRun::Waiting),
            ("c", LaneRun::Waiting),
        ]);
        assert_eq!(
            schedule(Mechanism::TaskGraph, &s, &r),
            vec![(1, LaneRun::Running)]
        );
        for end in [LaneRun::Failed, LaneRun::Stopped, LaneRun::Blocked] {
            let r = runs(&[
                ("a", LaneRun::Succeeded),
                ("b", end),
                ("c", LaneRun::Waiting),
            ]);
            assert_eq!(
                schedule(Mechanism::TaskGraph, &s, &r),
                vec![(2, LaneRun::Blocked)]
            );
        }
    }

    #[test]
    fn a_continuation_runs_one_step_at_a_time() {
        let s = spec(vec![lane("a", &[]), lane("b", &["a"])], 1);
        let r = runs(&[("a", LaneRun::Waiting), ("b", LaneRun::Waiting)]);
        assert_eq!(
            schedule(Mechanism::Continuation, &s, &r),
            vec![(0, LaneRun::Running)]
        );
    }
}
