//! The `plan.*` fold: what the journal says about each launched plan. Like every record, these
//! are a cache of what gaffer did: nothing here verifies evidence or authorizes anything
//! (views verify evidence afresh, see [`super::evidence`]).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::spec::LaunchSpec;
use crate::operations::OperationState;
use crate::operator::signed::OperatorSignature;
use crate::workspace::{Notice, Record};

pub mod kinds {
    pub const CREATED: &str = "plan.created";
    pub const STARTED: &str = "plan.started";
    pub const LANE: &str = "plan.lane";
    pub const EVIDENCE: &str = "plan.evidence";
    pub const WAIVED: &str = "plan.waived";
    pub const STOP_REQUESTED: &str = "plan.stop_requested";
    pub const ENDED: &str = "plan.ended";
}

/// How a lane's run stands, as the plan's runner recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum LaneRun {
    /// Not started: its dependencies or a free slot are not there yet.
    #[default]
    Waiting,
    Running,
    /// Its worker exited with status 0.
    Succeeded,
    /// Its worker could not start, failed, was killed or timed out.
    Failed,
    /// A dependency did not succeed; it never starts.
    Blocked,
    /// Stopped by request, or its gaffer process went away.
    Stopped,
}

impl LaneRun {
    pub fn is_final(self) -> bool {
        !matches!(self, LaneRun::Waiting | LaneRun::Running)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Created {
    pub plan_id: String,
    pub operation_id: String,
    pub client_id: String,
    /// The canonical selection request, for relaunching by digest.
    pub request: Value,
    pub spec: LaunchSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Started {
    pub plan_id: String,
    pub operation_id: String,
    /// Who submitted the launch (the operation's client, as the executing process has it).
    #[serde(default)]
    pub client_id: String,
    /// The process (`pid:started_ms`) that runs the lanes.
    pub executor: String,
    /// The plan as authorized and executed.
    pub spec: LaunchSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaneChange {
    pub plan_id: String,
    pub lane_id: String,
    pub run: LaneRun,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// What an evidence record points at. Only gaffer's own facts verify: the referenced
/// operation, the file's bytes, the lane worker's transcript. A note is a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum EvidenceRef {
    Operation {
        operation_id: String,
    },
    File {
        path: String,
        /// Computed by gaffer when the evidence was recorded.
        sha256: String,
    },
    WorkerOutput {
        worker_id: String,
        from_seq: u64,
        to_seq: u64,
    },
    Note {
        text: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvidenceRecord {
    pub evidence_id: String,
    pub plan_id: String,
    pub lane_id: String,
    /// `e1`, `e2`, … in the lane's expectation order.
    pub expectation: String,
    pub evidence: EvidenceRef,
    /// Who recorded it (the lane's identity, or the operator).
    pub recorded_by: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Waived {
    pub plan_id: String,
    pub operator_signature: OperatorSignature,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StopRequested {
    pub plan_id: String,
    pub reason: String,
    pub by: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ended {
    pub plan_id: String,
    /// True when it ended by a stop (request, or its process going away), not by its lanes.
    pub stopped: bool,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaneEntry {
    pub run: LaneRun,
    pub worker_id: Option<String>,
    pub detail: Option<String>,
}

/// One plan as folded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanEntry {
    pub plan_id: String,
    pub operation_id: String,
    pub client_id: String,
    pub request: Value,
    pub spec: LaunchSpec,
    pub created_ms: u64,
    pub updated_ms: u64,
    pub executor: Option<String>,
    pub lanes: BTreeMap<String, LaneEntry>,
    pub evidence: Vec<EvidenceRecord>,
    pub waivers: Vec<OperatorSignature>,
    pub stop_requested: Option<StopRequested>,
    pub ended: Option<Ended>,
    pub last_seq: u64,
}

/// Evidence records kept per plan (a flood cannot grow memory without bound; the method
/// refuses more, so nothing recorded is dropped silently).
pub const MAX_EVIDENCE: usize = 4096;
/// Waiver records kept per plan (each is verified when a view is built).
pub const MAX_WAIVERS: usize = 256;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PlanState {
    pub plans: BTreeMap<String, PlanEntry>,
    /// Launch order, for lists.
    #[serde(default)]
    pub order: Vec<String>,
}

impl PlanState {
    pub fn get(&self, id: &str) -> Option<&PlanEntry> {
        self.plans.get(id)
    }

    /// Newest first.
    pub fn list(&self) -> impl Iterator<Item = &PlanEntry> {
        self.order.iter().rev().filter_map(|id| self.plans.get(id))
    }

    /// The plan whose selection has this digest, newest first.
    pub fn by_selection_digest(&self, digest: &str) -> Option<&PlanEntry> {
        self.list().find(|p| p.spec.selection_digest == digest)
    }

    /// Folds one `plan.*` record. Who launched a plan is never taken from a plan record: it is
    /// the client of the `plan.launch` operation the plan id derives from, whose record (first
    /// for its random id) was written before anyone could know the id.
    pub fn apply(&mut self, rec: &Record, ops: &OperationState, out: &mut Vec<Notice>) {
        let changed = match rec.kind.as_str() {
            kinds::CREATED => decode::<Created>(rec)
                .and_then(|c| launched_by(ops, &c.plan_id, &c.operation_id).map(|by| (c, by)))
                .and_then(|(c, by)| self.create(rec, Created { client_id: by, ..c })),
            kinds::STARTED => decode::<Started>(rec)
                .and_then(|s| launched_by(ops, &s.plan_id, &s.operation_id).map(|by| (s, by)))
                .and_then(|(s, by)| self.start(rec, Started { client_id: by, ..s })),
            kinds::LANE => decode::<LaneChange>(rec).and_then(|c| {
                let p = self.plans.get_mut(&c.plan_id)?;
                p.spec
                    .lanes
                    .iter()
                    .any(|l| l.lane_id == c.lane_id)
                    .then_some(())?;
                p.lanes.insert(
                    c.lane_id,
                    LaneEntry {
                        run: c.run,
                        worker_id: c.worker_id,
                        detail: c.detail,
                    },
                );
                Some(c.plan_id)
            }),
            kinds::EVIDENCE => decode::<EvidenceRecord>(rec).and_then(|e| {
                let p = self.plans.get_mut(&e.plan_id)?;
                (p.evidence.len() < MAX_EVIDENCE).then_some(())?;
                let id = e.plan_id.clone();
                p.evidence.push(e);
                Some(id)
            }),
            kinds::WAIVED => decode::<Waived>(rec).and_then(|w| {
                let p = self.plans.get_mut(&w.plan_id)?;
                (p.waivers.len() < MAX_WAIVERS).then_some(())?;
                p.waivers.push(w.operator_signature);
                Some(w.plan_id)
            }),
            kinds::STOP_REQUESTED => decode::<StopRequested>(rec).and_then(|s| {
                let p = self.plans.get_mut(&s.plan_id)?;
                let id = s.plan_id.clone();
                p.stop_requested.get_or_insert(s);
                Some(id)
            }),
            kinds::ENDED => decode::<Ended>(rec).and_then(|e| {
                let p = self.plans.get_mut(&e.plan_id)?;
                let id = e.plan_id.clone();
                p.ended.get_or_insert(e);
                Some(id)
            }),
            _ => None,
        };
        if let Some(id) = changed
            && let Some(p) = self.plans.get_mut(&id)
        {
            p.updated_ms = rec.time_ms;
            p.last_seq = rec.seq;
            out.push(Notice::everyone(
                "plans/changed",
                json!({ "plan_id": id, "seq": rec.seq }),
            ));
        }
    }

    fn create(&mut self, rec: &Record, c: Created) -> Option<String> {
        if c.spec.plan_id != c.plan_id {
            return None;
        }
        if let Some(p) = self.plans.get_mut(&c.plan_id) {
            // An allowed launch can start (in the submit's own commit) before its creation
            // record lands: fill in who launched it and the request, nothing else.
            if !p.client_id.is_empty() || p.operation_id != c.operation_id {
                return None;
            }
            p.client_id = c.client_id;
            p.request = c.request;
            return Some(c.plan_id);
        }
        let id = c.plan_id.clone();
        self.order.push(id.clone());
        self.plans.insert(id.clone(), entry(rec, c));
        Some(id)
    }

    fn start(&mut self, rec: &Record, s: Started) -> Option<String> {
        if s.spec.plan_id != s.plan_id {
            return None;
        }
        let id = s.plan_id.clone();
        if !self.plans.contains_key(&id) {
            // Launched through `operations/submit` directly: the started record creates it.
            let created = Created {
                plan_id: id.clone(),
                operation_id: s.operation_id.clone(),
                client_id: s.client_id.clone(),
                request: Value::Null,
                spec: s.spec.clone(),
            };
            self.order.push(id.clone());
            self.plans.insert(id.clone(), entry(rec, created));
        }
        let p = self.plans.get_mut(&id)?;
        // A plan runs once, under the operation that created it.
        if p.executor.is_some() || p.operation_id != s.operation_id {
            return None;
        }
        p.executor = Some(s.executor);
        p.operation_id = s.operation_id;
        p.spec = s.spec;
        Some(id)
    }
}

/// The client that submitted the `plan.launch` operation `plan_id` belongs to; none when the
/// id is not that operation's plan, or the operation is unknown or launches no plan. Only an
/// id gaffer makes counts: `X`, `op_X` and `op_op_X` would all name the plan `pl_X`, and a
/// forged `X` would take over the plan of the genuine `op_X`.
fn launched_by(ops: &OperationState, plan_id: &str, operation_id: &str) -> Option<String> {
    if !crate::util::is_id("op_", operation_id) || plan_id != super::spec::plan_id(operation_id) {
        return None;
    }
    ops.get(operation_id)
        .filter(|op| op.operation == crate::operations::adapters::plan::OPERATION)
        .map(|op| op.client_id.clone())
}

fn entry(rec: &Record, c: Created) -> PlanEntry {
    PlanEntry {
        lanes: c
            .spec
            .lanes
            .iter()
            .map(|l| {
                (
                    l.lane_id.clone(),
                    LaneEntry {
                        run: LaneRun::Waiting,
                        worker_id: None,
                        detail: None,
                    },
                )
            })
            .collect(),
        plan_id: c.plan_id,
        operation_id: c.operation_id,
        client_id: c.client_id,
        request: c.request,
        spec: c.spec,
        created_ms: rec.time_ms,
        updated_ms: rec.time_ms,
        executor: None,
        evidence: Vec::new(),
        waivers: Vec::new(),
        stop_requested: None,
        ended: None,
        last_seq: rec.seq,
    }
}

fn decode<T: serde::de::DeserializeOwned>(rec: &Record) -> Option<T> {
    match rec.decode() {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(kind = %rec.kind, seq = rec.seq, error = %e, "unreadable plan record skipped");
            None
        }
    }
}

/// The identity a lane's connection has: `plan_id/lane_id`. Credential names cannot contain
/// `/`, so no issued client can be a lane.
pub fn lane_client(plan_id: &str, lane_id: &str) -> String {
    format!("{plan_id}/{lane_id}")
}

/// Whether `client` has a lane's form ([`lane_client`]). A submit from one is accepted only
/// while this process runs its lane, so an operation of this form was a lane's.
pub fn is_lane_client(client: &str) -> bool {
    client.contains('/')
}
