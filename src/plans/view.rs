//! What `plans/get` and `plans/list` show: plan and lane states with every expectation's
//! evidence verified now (see [`super::evidence`]).

use schemars::JsonSchema;
use serde::Serialize;

use super::evidence::{self, Verdict};
use super::state::{EvidenceRef, LaneRun, PlanEntry, lane_client};
use crate::operations::lifecycle::OpState;
use crate::operator::OperatorPublic;
use crate::workspace::State;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PlanStatus {
    /// Its `plan.launch` operation waits for policy or the operator.
    PendingApproval,
    /// Authorized; the lanes are being started.
    Starting,
    Running,
    /// Every lane is done: its worker succeeded and each expectation has verified evidence or
    /// a waiver.
    Completed,
    /// Every lane ended, but something is missing (see `missing`).
    Incomplete,
    /// The journal says every lane is done, but no process that ran the plan vouches for it
    /// here (the journal alone proves nothing); an operator's waivers can complete it.
    Unattested,
    Stopped,
    /// The launch was denied, expired, cancelled or failed; nothing ran.
    Refused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LaneStatus {
    Waiting,
    Running,
    /// Its worker succeeded; evidence is still missing.
    Ended,
    Done,
    Failed,
    Blocked,
    Stopped,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EvidenceView {
    pub evidence_id: String,
    #[schemars(with = "serde_json::Value")]
    pub evidence: EvidenceRef,
    pub recorded_by: String,
    #[serde(flatten)]
    pub verdict: Verdict,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExpectationStatus {
    Missing,
    /// Only notes or evidence that does not verify.
    Claimed,
    Verified,
    Waived,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ExpectationView {
    pub id: String,
    pub text: String,
    pub status: ExpectationStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiver_reason: Option<String>,
    pub evidence: Vec<EvidenceView>,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct LaneView {
    pub lane_id: String,
    /// The identity the lane's connection has (`plan_id/lane_id`).
    pub client_id: String,
    pub role: String,
    pub scope: Vec<String>,
    pub profile: String,
    pub argv: Vec<String>,
    pub depends_on: Vec<String>,
    pub status: LaneStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    pub expectations: Vec<ExpectationView>,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct PlanView {
    pub plan_id: String,
    pub status: PlanStatus,
    /// This process ran the plan and shows its own account of it.
    pub attested: bool,
    pub operation_id: String,
    pub operation_state: Option<OpState>,
    pub objective: String,
    pub selection_digest: String,
    pub pattern: String,
    pub overlays: Vec<String>,
    pub mechanism: String,
    pub max_parallel: u32,
    pub config_bundle: crate::bundles::BundleRef,
    pub lanes: Vec<LaneView>,
    /// What keeps the plan from completing, one line each.
    pub missing: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub created_ms: u64,
    pub updated_ms: u64,
}

/// Facts a view needs besides the state.
pub struct ViewCtx<'a> {
    pub files: &'a evidence::FileDigests,
    pub key: Option<&'a OperatorPublic>,
    pub workspace_id: Option<&'a str>,
    pub facts: evidence::Facts<'a>,
}

pub fn plan_view(s: &State, cx: &ViewCtx<'_>, p: &PlanEntry) -> PlanView {
    let op = s.operations.get(&p.operation_id);
    let waivers = evidence::waivers(p, cx.key, cx.workspace_id);
    let lanes: Vec<LaneView> = p
        .spec
        .lanes
        .iter()
        .map(|l| lane_view(s, cx, p, l, &waivers))
        .collect();
    let attested = matches!(cx.facts, evidence::Facts::Attested { .. });
    let all_waived = lanes.iter().all(|l| {
        l.expectations
            .iter()
            .all(|e| e.status == ExpectationStatus::Waived)
    });
    let mut missing = Vec::new();
    for l in &lanes {
        match l.status {
            LaneStatus::Done => {}
            LaneStatus::Ended => {
                for e in l.expectations.iter().filter(|e| {
                    !matches!(
                        e.status,
                        ExpectationStatus::Verified | ExpectationStatus::Waived
                    )
                }) {
                    missing.push(format!(
                        "{} {}: no verified evidence for \"{}\"",
                        l.lane_id, e.id, e.text
                    ));
                }
            }
            other => missing.push(format!("{}: {}", l.lane_id, lane_status_word(other))),
        }
    }
    let all_ended = lanes
        .iter()
        .all(|l| !matches!(l.status, LaneStatus::Waiting | LaneStatus::Running));
    let (status, reason) = match &cx.facts {
        evidence::Facts::Attested { run, .. } => {
            attested_status(run, p, &lanes, missing.is_empty())
        }
        evidence::Facts::Journal => {
            journal_status(p, op, all_ended, missing.is_empty(), all_waived)
        }
    };
    PlanView {
        plan_id: p.plan_id.clone(),
        status,
        attested,
        operation_id: p.operation_id.clone(),
        operation_state: op.map(|o| o.state),
        objective: p.spec.objective.clone(),
        selection_digest: p.spec.selection_digest.clone(),
        pattern: p.spec.pattern.clone(),
        overlays: p.spec.overlays.clone(),
        mechanism: p.spec.mechanism.clone(),
        max_parallel: p.spec.max_parallel,
        config_bundle: p.spec.config_bundle.clone(),
        lanes,
        missing,
        reason,
        created_ms: p.created_ms,
        updated_ms: p.updated_ms,
    }
}

/// A plan this process runs or ran: its own account says whether it ended and how.
fn attested_status(
    run: &super::runner::RunState,
    p: &PlanEntry,
    lanes: &[LaneView],
    nothing_missing: bool,
) -> (PlanStatus, Option<String>) {
    let reason = p.ended.as_ref().map(|e| e.reason.clone());
    if !run.ended {
        return (PlanStatus::Running, None);
    }
    if lanes.iter().any(|l| l.status == LaneStatus::Stopped) {
        (PlanStatus::Stopped, reason)
    } else if nothing_missing {
        (PlanStatus::Completed, None)
    } else {
        (PlanStatus::Incomplete, reason)
    }
}

/// A plan another process ran: the journal's account, which never completes a plan on its
/// own (only the operator's waivers of every expectation do).
fn journal_status(
    p: &PlanEntry,
    op: Option<&crate::operations::state::Operation>,
    all_ended: bool,
    nothing_missing: bool,
    all_waived: bool,
) -> (PlanStatus, Option<String>) {
    let unattested = || {
        (
            PlanStatus::Unattested,
            Some("the process that ran this plan does not vouch for it here; its journal records alone prove nothing".into()),
        )
    };
    match (&p.ended, &p.executor, op.map(|o| o.state)) {
        (Some(e), _, _) if e.stopped => (PlanStatus::Stopped, Some(e.reason.clone())),
        (Some(_), _, _) if nothing_missing && all_waived => (PlanStatus::Completed, None),
        (Some(_), _, _) if nothing_missing => unattested(),
        (Some(e), _, _) => (PlanStatus::Incomplete, Some(e.reason.clone())),
        (None, Some(_), _) if all_ended && nothing_missing && all_waived => {
            (PlanStatus::Completed, None)
        }
        (None, Some(_), _) => (PlanStatus::Running, None),
        (None, None, Some(OpState::Pending)) | (None, None, None) => {
            (PlanStatus::PendingApproval, None)
        }
        (None, None, Some(OpState::Approved | OpState::Executing | OpState::Succeeded)) => {
            (PlanStatus::Starting, None)
        }
        (None, None, Some(_)) => (
            PlanStatus::Refused,
            op.and_then(|o| o.error.as_ref().map(|e| e.message.clone())),
        ),
    }
}

fn lane_status_word(s: LaneStatus) -> &'static str {
    match s {
        LaneStatus::Waiting => "not started",
        LaneStatus::Running => "still running",
        LaneStatus::Ended => "evidence missing",
        LaneStatus::Done => "done",
        LaneStatus::Failed => "its worker failed",
        LaneStatus::Blocked => "blocked by a dependency that did not succeed",
        LaneStatus::Stopped => "stopped",
    }
}

fn lane_view(
    s: &State,
    cx: &ViewCtx<'_>,
    p: &PlanEntry,
    l: &super::spec::LaneSpec,
    waivers: &std::collections::HashMap<(String, String), String>,
) -> LaneView {
    // A run this process observed is its own account; otherwise the journal's.
    let seen = match &cx.facts {
        evidence::Facts::Attested { run, .. } => run.lanes.get(&l.lane_id).cloned(),
        evidence::Facts::Journal => p.lanes.get(&l.lane_id).map(|e| super::runner::LaneSeen {
            run: e.run,
            worker_id: e.worker_id.clone(),
            detail: e.detail.clone(),
        }),
    };
    let run = seen.as_ref().map(|e| e.run).unwrap_or_default();
    let expectations: Vec<ExpectationView> = l
        .expectations
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let id = format!("e{}", i + 1);
            let evidence: Vec<EvidenceView> = p
                .evidence
                .iter()
                .filter(|e| e.lane_id == l.lane_id && e.expectation == id)
                .map(|e| EvidenceView {
                    evidence_id: e.evidence_id.clone(),
                    evidence: e.evidence.clone(),
                    recorded_by: e.recorded_by.clone(),
                    verdict: evidence::verify(s, &cx.facts, cx.files, p, &l.lane_id, e),
                })
                .collect();
            let waiver = waivers.get(&(l.lane_id.clone(), id.clone())).cloned();
            let status = if evidence.iter().any(|e| e.verdict.verified) {
                ExpectationStatus::Verified
            } else if waiver.is_some() {
                ExpectationStatus::Waived
            } else if evidence.is_empty() {
                ExpectationStatus::Missing
            } else {
                ExpectationStatus::Claimed
            };
            ExpectationView {
                id,
                text: text.clone(),
                status,
                waiver_reason: waiver,
                evidence,
            }
        })
        .collect();
    let proven = expectations.iter().all(|e| {
        matches!(
            e.status,
            ExpectationStatus::Verified | ExpectationStatus::Waived
        )
    });
    let status = match run {
        LaneRun::Waiting => LaneStatus::Waiting,
        LaneRun::Running => LaneStatus::Running,
        LaneRun::Succeeded if proven => LaneStatus::Done,
        LaneRun::Succeeded => LaneStatus::Ended,
        LaneRun::Failed => LaneStatus::Failed,
        LaneRun::Blocked => LaneStatus::Blocked,
        LaneRun::Stopped => LaneStatus::Stopped,
    };
    LaneView {
        lane_id: l.lane_id.clone(),
        client_id: lane_client(&p.plan_id, &l.lane_id),
        role: l.role.clone(),
        scope: l.scope.clone(),
        profile: l.profile.selector.value().to_string(),
        argv: l.argv.clone(),
        depends_on: l.depends_on.clone(),
        status,
        worker_id: seen.as_ref().and_then(|e| e.worker_id.clone()),
        detail: seen.and_then(|e| e.detail),
        expectations,
    }
}
