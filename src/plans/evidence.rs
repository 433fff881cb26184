//! The evidence ledger: whether a piece of evidence verifies is decided now, from gaffer's own
//! facts, every time it is shown; an evidence record only says where to look. Operators waive
//! an expectation with a signed decision.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::state::{EvidenceRef, PlanEntry, lane_client};
use crate::operations::lifecycle::OpState;
use crate::operator::OperatorPublic;
use crate::operator::signed::{Head, OperatorSignature};
use crate::workers::Stream;
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

/// Checks evidence for `lane_id` of `plan` against the journal and the workspace as they are.
pub fn verify(
    s: &State,
    files: &FileDigests,
    plan: &PlanEntry,
    lane_id: &str,
    ev: &EvidenceRef,
) -> Verdict {
    match ev {
        EvidenceRef::Operation { operation_id } => {
            verify_operation(s, &lane_client(&plan.plan_id, lane_id), operation_id)
        }
        EvidenceRef::File { path, sha256 } => verify_file(files, path, sha256),
        EvidenceRef::WorkerOutput {
            worker_id,
            from_seq,
            to_seq,
        } => {
            let lane_worker = plan.lanes.get(lane_id).and_then(|l| l.worker_id.as_deref());
            if lane_worker != Some(worker_id.as_str()) {
                return no("the transcript is not this lane's worker's");
            }
            let (entries, _) = s
                .workers
                .transcript(worker_id, from_seq.saturating_sub(1), 1000);
            let output = entries
                .iter()
                .take_while(|e| e.seq <= *to_seq)
                .filter(|e| matches!(e.stream, Stream::Stdout | Stream::Stderr))
                .count();
            if output == 0 {
                no("the lane worker printed nothing in that range")
            } else {
                yes(format!("{output} output entries of the lane worker"))
            }
        }
        EvidenceRef::Note { .. } => no("a note is a claim; gaffer cannot verify it"),
    }
}

fn verify_operation(s: &State, lane: &str, operation_id: &str) -> Verdict {
    let Some(op) = s.operations.get(operation_id) else {
        return no("no such operation in this workspace");
    };
    if op.client_id != lane {
        return no(format!(
            "the operation was submitted by {}, not by this lane",
            op.client_id
        ));
    }
    if op.state != OpState::Succeeded {
        return no(format!("the operation is {}", op.state.as_str()));
    }
    if op.operation == "command.run" {
        let code = op
            .result
            .as_ref()
            .and_then(|r| r.get("exit_code"))
            .and_then(|c| c.as_i64());
        if code != Some(0) {
            return no(format!(
                "the command exited with {}",
                code.map(|c| c.to_string())
                    .unwrap_or_else(|| "no status".into())
            ));
        }
        return yes("the lane's command ran and exited 0");
    }
    yes(format!("the lane's {} succeeded", op.operation))
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

/// The expectations of `lane_id` a valid operator signature waives.
pub fn waived(
    plan: &PlanEntry,
    lane_id: &str,
    key: Option<&OperatorPublic>,
    workspace_id: Option<&str>,
) -> Vec<(String, String)> {
    let (Some(key), Some(ws)) = (key, workspace_id) else {
        return Vec::new();
    };
    plan.waivers
        .iter()
        .filter_map(|sig: &OperatorSignature| sig.open::<WaivePayload>(key).ok())
        .filter(|p| p.workspace_id == ws && p.plan_id == plan.plan_id && p.lane_id == lane_id)
        .map(|p| (p.expectation, p.reason))
        .collect()
}
