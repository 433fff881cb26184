//! Seals: which operation records a gaffer on this machine wrote for a client it checked.
//!
//! The agent can write the store, so an `operation.created` record's client name, idempotency
//! key and plan are only its writer's claims: a forged request can name whichever client the
//! operator trusts most, or sit under another client's idempotency key so that the client's
//! retried submission "replays" an outcome that never happened. A serving or CLI process seals
//! each submission it accepts from a connection whose identity it checked, with an HMAC keyed
//! by a secret kept in the workspace's anchor directory (outside the workspace, where nothing
//! gaffer starts can read; see [`crate::anchor`]). A request whose seal does not check was
//! written by something else (or by gaffer on another machine, or before seals existed): it
//! is left out of the approvals list unless the operator asks for it, shown as unverified when
//! asked for, and a replayed submission refuses to report it.
//!
//! A seal authorizes nothing: authority stays with the operator's signature and the trusted
//! policy, checked against the plan text at execution.

use hmac::{KeyInit, Mac};

use super::lifecycle::OpState;
use super::state::{OpFailure, Operation, Transitioned};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Length of the key kept in the anchor directory.
pub const SEAL_KEY_LEN: usize = 32;

/// This machine's seal for one workspace.
pub struct Sealer {
    key: [u8; SEAL_KEY_LEN],
    workspace_id: String,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("workspace_id", &self.workspace_id)
            .finish_non_exhaustive()
    }
}

impl Sealer {
    pub fn new(key: [u8; SEAL_KEY_LEN], workspace_id: &str) -> Sealer {
        Sealer {
            key,
            workspace_id: workspace_id.to_string(),
        }
    }

    /// The MAC over what a request's record claims and never changes: who asked, under which
    /// key, for which plan, and when.
    fn request_mac(&self, op: &Operation) -> HmacSha256 {
        // `new_from_slice` takes keys of any length; 32 bytes never fail.
        let mut mac = HmacSha256::new_from_slice(&self.key).unwrap_or_else(|_| unreachable!());
        let created = op.created_at_ms.to_string();
        let parts = [
            "gaffer operation.request v1",
            self.workspace_id.as_str(),
            op.id.as_str(),
            op.client_id.as_str(),
            op.idempotency_key.as_str(),
            op.submitted.as_str(),
            op.operation.as_str(),
            op.plan_digest.as_deref().unwrap_or(""),
            op.approval_id.as_deref().unwrap_or(""),
            created.as_str(),
        ];
        // Each part length-prefixed, so no two different claims read as the same bytes.
        for part in parts {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        mac
    }

    /// The seal of `op` as it is about to be recorded.
    pub fn seal(&self, op: &Operation) -> String {
        hex_of(self.request_mac(op))
    }

    /// Whether `op` carries a seal this machine made for exactly what it claims.
    pub fn checks(&self, op: &Operation) -> bool {
        matches(op.request_seal.as_deref(), self.request_mac(op))
    }

    /// The MAC over how an operation ended: its state and revision, and the error, result
    /// and upstream status it reports.
    fn outcome_mac(&self, outcome: Outcome<'_>) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).unwrap_or_else(|_| unreachable!());
        let text = |v: Option<&serde_json::Value>| v.map(|v| v.to_string()).unwrap_or_default();
        let parts = [
            "gaffer operation.outcome v1".to_string(),
            self.workspace_id.clone(),
            outcome.id.to_string(),
            outcome.state.to_string(),
            outcome.revision.to_string(),
            outcome.error.map(|e| e.code.clone()).unwrap_or_default(),
            outcome.error.map(|e| e.message.clone()).unwrap_or_default(),
            text(outcome.result),
            outcome
                .upstream_status
                .map(|u| u.to_string())
                .unwrap_or_default(),
        ];
        for part in parts {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        mac
    }

    /// The seal of `op`'s outcome as it stands (an operation that ends where it is created).
    pub fn seal_outcome(&self, op: &Operation) -> String {
        hex_of(self.outcome_mac(Outcome::of(op)))
    }

    /// The seal of the outcome `t` gives `op`, folded as the state folds it.
    pub fn seal_outcome_of(&self, op: &Operation, t: &Transitioned) -> String {
        hex_of(self.outcome_mac(Outcome {
            id: &op.id,
            state: t.to,
            revision: t.revision,
            error: t.error.as_ref().or(op.error.as_ref()),
            result: t.result.as_ref().or(op.result.as_ref()),
            upstream_status: t.upstream_status.or(op.upstream_status),
        }))
    }

    /// Whether `op` has ended and this machine sealed exactly the outcome it reports.
    pub fn outcome_checks(&self, op: &Operation) -> bool {
        op.state.is_terminal()
            && matches(
                op.outcome_seal.as_deref(),
                self.outcome_mac(Outcome::of(op)),
            )
    }
}

/// What an outcome seal covers.
struct Outcome<'a> {
    id: &'a str,
    state: OpState,
    revision: u64,
    error: Option<&'a OpFailure>,
    result: Option<&'a serde_json::Value>,
    upstream_status: Option<u16>,
}

impl<'a> Outcome<'a> {
    fn of(op: &'a Operation) -> Outcome<'a> {
        Outcome {
            id: &op.id,
            state: op.state,
            revision: op.revision,
            error: op.error.as_ref(),
            result: op.result.as_ref(),
            upstream_status: op.upstream_status,
        }
    }
}

fn hex_of(mac: HmacSha256) -> String {
    crate::util::hex(&mac.finalize().into_bytes())
}

/// Whether `seal` is `mac`'s value (compared in constant time).
fn matches(seal: Option<&str>, mac: HmacSha256) -> bool {
    seal.and_then(unhex)
        .is_some_and(|bytes| mac.verify_slice(&bytes).is_ok())
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() != 64 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operations::state::tests::op;

    fn pending() -> Operation {
        let mut o = op("op_1", OpState::Pending, Some("apr_1"));
        o.client_id = "ci-agent".into();
        o
    }

    #[test]
    fn a_request_seal_checks_only_for_what_it_was_made_over() {
        let sealer = Sealer::new([7; SEAL_KEY_LEN], "ws_1");
        let mut sealed = pending();
        assert!(!sealer.checks(&sealed), "no seal");
        sealed.request_seal = Some(sealer.seal(&sealed));
        assert!(sealer.checks(&sealed));
        // What changes over an operation's life is not in it: state, revision, result.
        let mut later = sealed.clone();
        later.state = OpState::Succeeded;
        later.revision = 3;
        assert!(sealer.checks(&later));
        let edits: [fn(&mut Operation); 8] = [
            |o| o.client_id = "operator-favourite".into(),
            |o| o.idempotency_key = "k2".into(),
            |o| o.submitted = "t".repeat(64),
            |o| o.operation = "command.run".into(),
            |o| o.plan_digest = Some("e".repeat(64)),
            |o| o.approval_id = None,
            |o| o.id = "op_2".into(),
            |o| o.created_at_ms += 1,
        ];
        for edit in edits {
            let mut forged = sealed.clone();
            edit(&mut forged);
            assert!(!sealer.checks(&forged), "{forged:?}");
        }
        // Another workspace's or another machine's key.
        assert!(!Sealer::new([7; SEAL_KEY_LEN], "ws_2").checks(&sealed));
        assert!(!Sealer::new([8; SEAL_KEY_LEN], "ws_1").checks(&sealed));
        let mut garbled = sealed.clone();
        garbled.request_seal = Some("zz".repeat(32));
        assert!(!sealer.checks(&garbled));
    }

    #[test]
    fn an_outcome_seal_made_on_the_transition_checks_on_the_folded_operation_only() {
        let sealer = Sealer::new([7; SEAL_KEY_LEN], "ws_1");
        let mut executing = pending();
        executing.state = OpState::Executing;
        executing.revision = 3;
        executing.upstream_status = Some(200);
        let t = Transitioned {
            id: executing.id.clone(),
            from: OpState::Executing,
            to: OpState::Succeeded,
            revision: 4,
            at_ms: 99,
            error: None,
            result: Some(serde_json::json!({"bytes_written": 3})),
            upstream_status: None,
            approval: None,
            executor: None,
            seal: None,
        };
        let seal = sealer.seal_outcome_of(&executing, &t);
        // Folded as the state folds it.
        let mut ended = executing.clone();
        ended.state = t.to;
        ended.revision = t.revision;
        ended.result = t.result.clone();
        assert!(!sealer.outcome_checks(&ended), "no seal");
        ended.outcome_seal = Some(seal);
        assert!(sealer.outcome_checks(&ended));
        let edits: [fn(&mut Operation); 5] = [
            |o| o.state = OpState::Failed,
            |o| o.revision = 5,
            |o| o.result = Some(serde_json::json!({"bytes_written": 4})),
            |o| o.upstream_status = None,
            |o| o.error = Some(OpFailure::new("x", "y")),
        ];
        for edit in edits {
            let mut forged = ended.clone();
            edit(&mut forged);
            assert!(!sealer.outcome_checks(&forged), "{forged:?}");
        }
        // A seal made for one operation does not check on another.
        let mut other = ended.clone();
        other.id = "op_2".into();
        assert!(!sealer.outcome_checks(&other));
        // Nor on one that has not ended.
        let mut open = ended;
        open.state = OpState::Executing;
        assert!(!sealer.outcome_checks(&open));
    }
}
