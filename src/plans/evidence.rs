//! The evidence ledger: whether a piece of evidence verifies is decided now, from gaffer's own
//! facts, every time it is shown; an evidence record only says where to look. Operators waive
//! an expectation with a signed decision.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::state::{EvidenceRef, PlanEntry, lane_client};
use crate::operations::lifecycle::OpState;
use crate::operator::OperatorPublic;
use crate::operator::signed::{Head, OperatorSignature};
use crate::workspace::State;

/// What the operator signs to waive one expectation of one lane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaivePayload {
    /// Always `gaffer/plan-waive/v1`.
    pub domain: String,
    pub workspace_id: String,
    pub plan_id: String,
    pub lane_id: String,
    /// `e1`, `e2`, …
    pub expectation: String,
    /// sha256 (hex) of the expectation's text: the waiver covers exactly what the operator read.
    pub expectation_sha256: String,
    pub reason: String,
    pub waived_at_ms: u64,
    pub head: Head,
}

crate::operator::signed::signed_payload!(WaivePayload, "gaffer/plan-waive/v1");

/// How one piece of evidence stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Verdict {
    pub verified: bool,
    /// Why it does or does not verify.
    pub why: String,
}

fn yes(why: impl Into<String>) -> Verdict {
    Verdict {
        verified: true,
        why: why.into(),
    }
}

fn no(why: impl Into<String>) -> Verdict {
    Verdict {
        verified: false,
        why: why.into(),
    }
}

/// Where a view takes its facts: this process's own account of the run (what it executed,
/// what its lane connections recorded), or, for a plan another process ran, the journal.
pub enum Facts<'a> {
    Attested {
        run: &'a super::runner::RunState,
        executed: &'a dyn Fn(&str) -> Option<crate::operations::engine::ExecutedHere>,
    },
    Journal,
}

/// Checks one evidence record for `lane_id` of `plan`.
pub fn verify(
    s: &State,
    facts: &Facts<'_>,
    files: &FileDigests,
    plan: &PlanEntry,
    lane_id: &str,
    rec: &super::state::EvidenceRecord,
) -> Verdict {
    let lane = lane_client(&plan.plan_id, lane_id);
    if let Facts::Attested { run, .. } = facts
        && run.evidence.get(&rec.evidence_id) != Some(rec)
    {
        return no("not recorded through this plan's lane connections");
    }
    match &rec.evidence {
        EvidenceRef::Operation { operation_id } => match facts {
            Facts::Attested { executed, .. } => match executed(operation_id) {
                Some(e) => {
                    judge_operation(&lane, &e.client, &e.operation, e.succeeded, e.exit_code)
                }
                // Only lanes' executions are remembered: another client's, even one run
                // here, is told by its submitter as the journal records it.
                None => match s.operations.get(operation_id) {
                    Some(op) if op.client_id != lane => not_this_lanes(&op.client_id),
                    _ => no("this process did not execute that operation"),
                },
            },
            Facts::Journal => match s.operations.get(operation_id) {
                Some(op) => judge_operation(
                    &lane,
                    &op.client_id,
                    &op.operation,
                    op.state == OpState::Succeeded,
                    op.result
                        .as_ref()
                        .and_then(|r| r.get("exit_code"))
                        .and_then(|c| c.as_i64()),
                ),
                None => no("no such operation in this workspace"),
            },
        },
        EvidenceRef::File { path, sha256 } => verify_file(files, path, sha256),
        EvidenceRef::WorkerOutput { .. } => {
            no("a transcript range shows what the lane said, not that it was done")
        }
        EvidenceRef::Note { .. } => no("a note is a claim; gaffer cannot verify it"),
    }
}

fn not_this_lanes(client: &str) -> Verdict {
    no(format!(
        "the operation was submitted by {client}, not by this lane"
    ))
}

fn judge_operation(
    lane: &str,
    client: &str,
    operation: &str,
    succeeded: bool,
    exit_code: Option<i64>,
) -> Verdict {
    if client != lane {
        return not_this_lanes(client);
    }
    if !succeeded {
        return no("the operation did not succeed");
    }
    if operation == "command.run" {
        if exit_code != Some(0) {
            return no(format!(
                "the command exited with {}",
                exit_code
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "no status".into())
            ));
        }
        return yes("the lane's command ran and exited 0");
    }
    yes(format!("the lane's {operation} succeeded"))
}

/// Digests of the files evidence names, computed before a view is built (file reads never
/// happen under the state lock).
pub type FileDigests = std::collections::HashMap<String, Result<Option<String>, String>>;

/// Reads the digest of every file the plan's evidence names. Blocking.
pub fn file_digests(root: &std::path::Path, plans: &[&PlanEntry]) -> FileDigests {
    let mut out = FileDigests::new();
    for p in plans {
        for e in &p.evidence {
            if let EvidenceRef::File { path, .. } = &e.evidence
                && !out.contains_key(path)
            {
                let d = crate::operations::adapters::handle::digest_file(root, path);
                out.insert(path.clone(), d);
            }
        }
    }
    out
}

/// The file's bytes now must still have the digest gaffer computed when it was recorded.
fn verify_file(files: &FileDigests, path: &str, sha256: &str) -> Verdict {
    match files.get(path) {
        Some(Ok(Some(now))) if now == sha256 => yes("the file still has the recorded sha256"),
        Some(Ok(Some(_))) => no("the file changed since the evidence was recorded"),
        Some(Ok(None)) => no("the file no longer exists"),
        Some(Err(e)) => no(format!("the file cannot be read: {e}")),
        None => no("the file was not checked"),
    }
}

/// Every (lane, expectation) → reason a valid operator signature waives, checked once per
/// view: signed for this workspace and plan, over the expectation's current text.
pub fn waivers(
    plan: &PlanEntry,
    key: Option<&OperatorPublic>,
    workspace_id: Option<&str>,
) -> std::collections::HashMap<(String, String), String> {
    let (Some(key), Some(ws)) = (key, workspace_id) else {
        return Default::default();
    };
    let text_of = |lane: &str, exp: &str| -> Option<&String> {
        let n: usize = exp.strip_prefix('e')?.parse().ok()?;
        let l = plan.spec.lanes.iter().find(|l| l.lane_id == lane)?;
        l.expectations.get(n.checked_sub(1)?)
    };
    plan.waivers
        .iter()
        .filter_map(|sig: &OperatorSignature| sig.open::<WaivePayload>(key).ok())
        .filter(|p| p.workspace_id == ws && p.plan_id == plan.plan_id)
        .filter(|p| {
            text_of(&p.lane_id, &p.expectation)
                .is_some_and(|t| crate::util::sha256_hex(t.as_bytes()) == p.expectation_sha256)
        })
        .map(|p| ((p.lane_id, p.expectation), p.reason))
        .collect()
}
