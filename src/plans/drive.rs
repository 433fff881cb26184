//! A running plan's loop: settle lanes whose worker ended (as this process's worker runtime
//! observed it), start what the mechanism allows, record each change, until every lane is
//! final or the plan is stopped. Lane workers are created through the one create path and
//! started under the `plan.launch` operation that authorized them, each with a connection
//! back to gaffer as descriptor 3 whose session identity is the lane.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::runner::{LANE_FD, LaneIdentity, LaneSeen, PlanError, PlanRuntime, Run, record};
use super::schedule::{LaneRuns, schedule};
use super::spec::{LaneSpec, LaunchSpec};
use super::state::{Ended, LaneChange, LaneRun, kinds, lane_client};
use crate::patterns::runtime::Mechanism;
use crate::sandbox::Setting;
use crate::workers::StartSpec;
use crate::workers::types::{Segment, WorkerStatus};
use crate::workspace::State;

/// Characters of the previous step's output a continuation step is given.
const OUTCOME_TAIL: usize = 2000;

impl PlanRuntime {
    pub(super) async fn drive(
        self: Arc<Self>,
        operation_id: String,
        spec: LaunchSpec,
        sandbox: Setting,
        run: Arc<Run>,
    ) {
        let mut notices = self.ws.subscribe();
        let mechanism = Mechanism::parse(&spec.mechanism).unwrap_or(Mechanism::Direct);
        loop {
            if run.stop.is_cancelled() || self.stop_requested(&spec.plan_id) {
                self.stop_lanes(&spec, &run).await;
                break;
            }
            match self
                .step(&operation_id, &spec, mechanism, sandbox, &run)
                .await
            {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => tracing::warn!(plan = %spec.plan_id, error = %e, "plan step failed"),
            }
            tokio::select! {
                _ = notices.recv() => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = run.stop.cancelled() => {}
            }
        }
        run.state().ended = true;
        self.lanes.remove_plan(&spec.plan_id);
    }

    /// A stop asked through any process (a forged request can only stop a plan).
    fn stop_requested(&self, plan_id: &str) -> bool {
        self.ws.read(|s| {
            s.plans
                .get(plan_id)
                .is_some_and(|p| p.stop_requested.is_some())
        })
    }

    /// Stops every lane worker this run started and records the plan stopped.
    async fn stop_lanes(&self, spec: &LaunchSpec, run: &Run) {
        let running: Vec<String> = run
            .state()
            .lanes
            .values()
            .filter(|l| l.run == LaneRun::Running)
            .filter_map(|l| l.worker_id.clone())
            .collect();
        for w in running {
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
        let reason = format!("stopped: {reason}");
        let open: Vec<(String, Option<String>)> = run
            .state()
            .lanes
            .iter()
            .filter(|(_, l)| !l.run.is_final())
            .map(|(id, l)| (id.clone(), l.worker_id.clone()))
            .collect();
        for (lane_id, worker) in open {
            let r = self
                .record_lane(
                    spec,
                    run,
                    &lane_id,
                    LaneRun::Stopped,
                    worker,
                    Some(reason.clone()),
                )
                .await;
            if let Err(e) = r {
                tracing::warn!(plan = %spec.plan_id, error = %e, "could not record a stopped lane");
            }
        }
        if let Err(e) = self.record_end(spec, true, &reason).await {
            tracing::warn!(plan = %spec.plan_id, error = %e, "could not record a stopped plan");
        }
    }

    /// One pass. Returns true once the plan has ended.
    async fn step(
        &self,
        operation_id: &str,
        spec: &LaunchSpec,
        mechanism: Mechanism,
        sandbox: Setting,
        run: &Run,
    ) -> Result<bool, PlanError> {
        self.settle(spec, run).await?;
        let runs = runs_of(run);
        for (i, change) in schedule(mechanism, spec, &runs) {
            let lane = &spec.lanes[i];
            if change == LaneRun::Blocked {
                let failed: Vec<&str> = lane
                    .depends_on
                    .iter()
                    .filter(|d| {
                        runs.get(d.as_str())
                            .is_some_and(|r| r.0.is_final() && r.0 != LaneRun::Succeeded)
                    })
                    .map(String::as_str)
                    .collect();
                let why = format!("blocked: {} did not succeed", failed.join(", "));
                self.record_lane(spec, run, &lane.lane_id, LaneRun::Blocked, None, Some(why))
                    .await?;
            } else {
                self.start_lane(operation_id, spec, run, lane, mechanism, sandbox, &runs)
                    .await?;
            }
        }
        if !run.state().lanes.values().all(|l| l.run.is_final()) {
            return Ok(false);
        }
        self.record_end(spec, false, "every lane ended").await?;
        Ok(true)
    }

    async fn record_end(
        &self,
        spec: &LaunchSpec,
        stopped: bool,
        reason: &str,
    ) -> Result<(), PlanError> {
        let rec = record(
            kinds::ENDED,
            &Ended {
                plan_id: spec.plan_id.clone(),
                stopped,
                reason: reason.to_string(),
            },
        );
        let id = spec.plan_id.clone();
        self.ws
            .commit(move |s: &State| {
                let open = s.plans.get(&id).is_some_and(|p| p.ended.is_none());
                Ok::<_, PlanError>((if open { vec![rec] } else { vec![] }, ()))
            })
            .await
            .map_err(PlanError::from)
    }

    /// Lanes whose worker this process saw end become succeeded (exit 0) or failed.
    async fn settle(&self, spec: &LaunchSpec, run: &Run) -> Result<(), PlanError> {
        let running: Vec<(String, String)> = run
            .state()
            .lanes
            .iter()
            .filter(|(_, l)| l.run == LaneRun::Running)
            .filter_map(|(id, l)| l.worker_id.clone().map(|w| (id.clone(), w)))
            .collect();
        for (lane_id, worker_id) in running {
            let Some((status, exit)) = self.workers.observed_end(&worker_id) else {
                continue;
            };
            let ok =
                status == WorkerStatus::Stopped && exit.as_ref().is_some_and(|e| e.code == Some(0));
            let detail = match (&exit, status) {
                (Some(e), _) if e.code.is_some() => {
                    format!("exited with status {}", e.code.unwrap_or(-1))
                }
                (Some(e), _) if e.signal.is_some() => {
                    format!("killed by signal {}", e.signal.unwrap_or(0))
                }
                (_, s) => format!("worker {s:?}").to_lowercase(),
            };
            let run_to = if ok {
                LaneRun::Succeeded
            } else {
                LaneRun::Failed
            };
            self.record_lane(spec, run, &lane_id, run_to, Some(worker_id), Some(detail))
                .await?;
        }
        Ok(())
    }

    /// Moves a lane in this run's account and journals the move.
    async fn record_lane(
        &self,
        spec: &LaunchSpec,
        run: &Run,
        lane_id: &str,
        to: LaneRun,
        worker_id: Option<String>,
        detail: Option<String>,
    ) -> Result<(), PlanError> {
        {
            let mut st = run.state();
            let Some(l) = st.lanes.get_mut(lane_id) else {
                return Ok(());
            };
            if l.run.is_final() || l.run == to {
                return Ok(());
            }
            *l = LaneSeen {
                run: to,
                worker_id: worker_id.clone().or(l.worker_id.clone()),
                detail: detail.clone(),
            };
        }
        let change = LaneChange {
            plan_id: spec.plan_id.clone(),
            lane_id: lane_id.to_string(),
            run: to,
            worker_id,
            detail,
        };
        let rec = record(kinds::LANE, &change);
        self.ws
            .commit(move |_: &State| Ok::<_, PlanError>((vec![rec], ())))
            .await
            .map_err(PlanError::from)
    }

    #[allow(clippy::too_many_arguments)]
    async fn start_lane(
        &self,
        operation_id: &str,
        spec: &LaunchSpec,
        run: &Run,
        lane: &LaneSpec,
        mechanism: Mechanism,
        sandbox: Setting,
        runs: &LaneRuns,
    ) -> Result<(), PlanError> {
        let identity = LaneIdentity {
            client_id: lane_client(&spec.plan_id, &lane.lane_id),
            plan_id: spec.plan_id.clone(),
            lane_id: lane.lane_id.clone(),
            scope: lane.scope.clone(),
        };
        let input = self.lane_input(lane, mechanism, runs);
        let (to, worker, detail) = match self
            .spawn_lane(operation_id, spec, lane, &identity, input, sandbox)
            .await
        {
            Ok(w) => (LaneRun::Running, Some(w), None),
            Err((w, why)) => {
                tracing::warn!(plan = %spec.plan_id, lane = %lane.lane_id, error = %why, "lane did not start");
                (LaneRun::Failed, w, Some(why))
            }
        };
        self.record_lane(spec, run, &lane.lane_id, to, worker, detail)
            .await
    }

    async fn spawn_lane(
        &self,
        operation_id: &str,
        spec: &LaunchSpec,
        lane: &LaneSpec,
        identity: &LaneIdentity,
        input: String,
        sandbox: Setting,
    ) -> Result<String, (Option<String>, String)> {
        let argument_input =
            (lane.profile.input_mode == crate::bundles::InputMode::Argument).then(|| {
                vec![Segment::Text {
                    content: input.clone(),
                }]
            });
        // No idempotency key: nobody else can name (and squat) a lane's worker.
        let params = json!({
            "profile": lane.profile.selector,
            "config_bundle": spec.config_bundle,
            "initial_input": input,
        });
        let mut req = crate::workers::request::parse_create(&params, Some(self.ws.root()))
            .map_err(|e| (None, e.to_string()))?;
        req.created_by = Some(identity.client_id.clone());
        let worker = self
            .workers
            .create(req)
            .await
            .map_err(|e| (None, e.to_string()))?;
        let started = self
            .start_created(
                operation_id,
                spec,
                (lane, identity),
                &worker.id,
                argument_input,
                sandbox,
            )
            .await;
        if let Err(why) = &started {
            // Nothing else will start it: a worker left pending would wait forever.
            let reason = Some(format!("its lane could not start: {why}"));
            if let Err(e) = self.workers.stop(&worker.id, reason).await {
                tracing::warn!(worker = %worker.id, error = %e, "could not retire a lane worker");
            }
        }
        started.map_err(|why| (Some(worker.id.clone()), why))
    }

    /// Links a created lane worker to the launch, gives it its channel and starts it.
    async fn start_created(
        &self,
        operation_id: &str,
        spec: &LaunchSpec,
        (lane, identity): (&LaneSpec, &LaneIdentity),
        worker_id: &str,
        argument_input: Option<Vec<Segment>>,
        sandbox: Setting,
    ) -> Result<String, String> {
        self.workers
            .link_operation(worker_id, operation_id)
            .await
            .map_err(|e| e.to_string())?;
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(|e| e.to_string())?;
        let server = self.server.get().ok_or("no lane server")?;
        self.lanes.insert(identity.clone());
        server.serve(identity.clone(), ours);
        let start = StartSpec {
            worker_id: worker_id.to_string(),
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
            .map_err(|e| e.to_string())?;
        Ok(started.id)
    }

    /// The lane's initial input: its prompt contract, and for a continuation step on stdin the
    /// previous step's outcome (never into argv, which the approval pinned).
    fn lane_input(&self, lane: &LaneSpec, mechanism: Mechanism, runs: &LaneRuns) -> String {
        let mut text = lane.prompt.clone();
        let on_stdin = lane.profile.input_mode != crate::bundles::InputMode::Argument;
        let prev = lane.depends_on.first();
        let (Mechanism::Continuation, true, Some(prev)) = (mechanism, on_stdin, prev) else {
            return text;
        };
        let (run, worker) = runs.get(prev).cloned().unwrap_or_default();
        let tail = worker
            .map(|w| {
                self.ws.read(|s| {
                    let (entries, _) = s.workers.transcript(&w, 0, 10_000);
                    let said: String = entries
                        .iter()
                        .filter(|e| e.stream == crate::workers::Stream::Stdout)
                        .map(|e| e.text.as_str())
                        .collect();
                    let skip = said.chars().count().saturating_sub(OUTCOME_TAIL);
                    said.chars().skip(skip).collect::<String>()
                })
            })
            .unwrap_or_default();
        text.push_str(&format!(
            "\n\nPrevious step ({prev}) outcome:\nstatus: {}\noutput:\n{tail}",
            format!("{run:?}").to_lowercase()
        ));
        text
    }
}

fn runs_of(run: &Run) -> LaneRuns {
    run.state()
        .lanes
        .iter()
        .map(|(id, l)| (id.clone(), (l.run, l.worker_id.clone())))
        .collect()
}
