//! The one authorization check. Every path that starts an execution calls [`authorize`] at
//! the moment of the claim, with the plan text decoded and classified afresh. Authority is
//! (a) a rule of the currently trusted policy, or (b) an operator signature that covers
//! exactly this plan (its digest) or, for a window, exactly this classification and no more
//! than the trusted policy grants one approval of it now. A record's own state,
//! classification, mode or view fields are never read here.

use super::decision::{DecisionPayload, classification_digest};
use super::grant::{Scope, window_covers};
use super::lifecycle::codes;
use super::policy::{Classification, Decision, DecisionEffect, GrantMode, Policy, PolicyRequest};
use super::state::{Approval, ApprovalStatus, DecisionKind};
use crate::operator::OperatorPublic;

/// What authorizes an execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authority {
    /// An allow rule of the trusted policy.
    Policy { rule_ids: Vec<String> },
    /// An operator-signed approval; its use is reserved by the claim, and claimed again on
    /// this machine's anchor (with the signed limits) before the effect.
    Approval {
        approval_id: String,
        max_uses: u32,
        expires_at_ms: u64,
    },
}

/// Why an execution is refused: a stable code and words for the audit log and the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: &'static str,
    pub message: String,
}

fn refuse(code: &'static str, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

/// Everything the check reads, each item from a source that can carry authority.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    pub operation_id: &'a str,
    /// The authenticated identity the plan text names.
    pub client: &'a str,
    pub operation: &'a str,
    /// sha256 of the plan text being executed.
    pub plan_digest: &'a str,
    /// Classified from the plan text now, by the operation's adapter.
    pub class: &'a Classification,
    /// The catalog says a human must approve every use.
    pub requires_approval: bool,
    /// The catalog's longest approval of this operation (bounds a window's duration).
    pub approval_ttl_seconds: u64,
    /// The approval the operation points at (looked up by id; its fields are not trusted).
    pub approval: Option<&'a Approval>,
    pub points_at_approval: bool,
    pub policy: &'a Policy,
    pub key: Option<&'a OperatorPublic>,
    pub workspace_id: Option<&'a str>,
    /// The journal's hash chain verifies over what this process has read.
    pub chain_ok: bool,
    /// Why the store cannot be relied on (it does not reach its anchored head, or no anchor
    /// can be kept): then nothing is authorized.
    pub store_refusal: Option<&'a str>,
    /// This process accepted the submission and checked its client identity itself. A record's
    /// client name is otherwise only a claim, so authority that depends on who the client is
    /// (a policy rule, a window grant) needs it; an approval of exactly this plan does not.
    pub vouched: bool,
    /// The scope of the plan lane the client is, when this process runs it (see
    /// [`PolicyRequest::lane_scope`]).
    pub lane_scope: Option<&'a [String]>,
    pub now_ms: u64,
}

pub fn authorize(c: &Check<'_>) -> Result<Authority, Refusal> {
    if let Some(why) = c.store_refusal {
        return Err(refuse(codes::STORE_ROLLED_BACK, why));
    }
    let req = PolicyRequest {
        client: c.client,
        operation: c.operation,
        class: c.class,
        lane_scope: if c.vouched { c.lane_scope } else { None },
    };
    let static_decision = c.policy.decide(&req, &[], c.now_ms);
    if static_decision.effect == DecisionEffect::Deny {
        return Err(refuse(
            codes::POLICY_DENIED,
            format!(
                "a deny rule of the trusted policy covers this plan ({})",
                static_decision.rule_ids.join(", ")
            ),
        ));
    }
    if !c.points_at_approval {
        if !c.vouched {
            return Err(refuse(
                codes::APPROVAL_INVALID,
                "this process did not accept the submission, so its client cannot be verified \
                 and no policy rule applies; submit it again",
            ));
        }
        let allowed = static_decision.effect == DecisionEffect::Allow
            && static_decision.grant_id.is_none()
            && !c.requires_approval;
        return if allowed {
            Ok(Authority::Policy {
                rule_ids: static_decision.rule_ids,
            })
        } else {
            Err(refuse(
                codes::APPROVAL_INVALID,
                "no operator approval and no allow rule of the trusted policy covers this plan",
            ))
        };
    }
    let approval = c.approval.ok_or_else(|| {
        refuse(
            codes::APPROVAL_INVALID,
            "the operation's approval is missing",
        )
    })?;
    let payload = signed_approval(c, approval)?;
    let exact = payload.operation_id == c.operation_id && payload.plan_digest == c.plan_digest;
    if !exact && !c.vouched {
        return Err(refuse(
            codes::APPROVAL_INVALID,
            "a window approval covers only submissions this process accepted from its client",
        ));
    }
    if !exact {
        window_within_policy(c, &static_decision, &payload)?;
    }
    usable(c, approval, &payload)?;
    Ok(Authority::Approval {
        approval_id: approval.id.clone(),
        max_uses: payload.max_uses,
        expires_at_ms: payload.expires_at_ms.unwrap_or(0),
    })
}

/// Opens the approval's signature and checks that it covers this plan.
fn signed_approval(c: &Check<'_>, a: &Approval) -> Result<DecisionPayload, Refusal> {
    let invalid = |m: &str| refuse(codes::APPROVAL_INVALID, m.to_string());
    let d = a
        .decision
        .as_ref()
        .ok_or_else(|| invalid("the approval was never decided by the operator"))?;
    let key = c
        .key
        .ok_or_else(|| invalid("no operator public key here, so no approval can be verified"))?;
    if !c.chain_ok {
        return Err(invalid(
            "the journal's hash chain is broken, so no signed approval is accepted",
        ));
    }
    let p: DecisionPayload = d
        .operator_signature
        .open(key)
        .map_err(|e| invalid(&format!("the approval's signature is not valid: {e}")))?;
    let bound = Some(p.workspace_id.as_str()) == c.workspace_id
        && p.approval_id == a.id
        && p.decision == DecisionKind::Approve
        && p.client == c.client
        && p.operation == c.operation
        && ((p.operation_id == c.operation_id && p.plan_digest == c.plan_digest)
            || (p.mode == GrantMode::Window
                && p.classification_digest == classification_digest(c.class)));
    if !bound {
        return Err(invalid(
            "the operator's signature does not cover this plan, client and classification",
        ));
    }
    Ok(p)
}

/// A window reaches past the plan the operator saw only as far as the trusted policy lets one
/// approval reach now: a window signed over more (by a gaffer that copied a forged request's
/// scope), or a policy narrowed since the signature, covers its own plan only.
fn window_within_policy(c: &Check<'_>, d: &Decision, p: &DecisionPayload) -> Result<(), Refusal> {
    window_covers(d, c.requires_approval, c.approval_ttl_seconds, Scope::signed(p)).map_err(|why| {
        refuse(
            codes::APPROVAL_INVALID,
            format!("the window approval covers no further plan here: {why}; revoke it and approve again"),
        )
    })
}

/// The signed limits and the uses recorded so far.
fn usable(c: &Check<'_>, a: &Approval, p: &DecisionPayload) -> Result<(), Refusal> {
    let in_time = p.expires_at_ms.is_some_and(|e| c.now_ms < e);
    let ok = in_time
        && a.status == ApprovalStatus::Active
        && a.uses_spent() < p.max_uses
        && !a.has_retained()
        && !a.uses.contains_key(c.operation_id);
    if ok {
        Ok(())
    } else {
        Err(refuse(
            codes::APPROVAL_UNAVAILABLE,
            "the approval is expired, used up or no longer active",
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::OnceLock;

    use proptest::prelude::*;

    use super::*;
    use crate::operations::state::SignedDecision;
    use crate::operator::OperatorSigner;
    use crate::operator::signed::{Head, OperatorSignature, Payload};

    const POLICY: &str = r#"
rules:
  - id: docs
    effect: allow
    clients: ["agent*"]
    operations: ["file.write"]
    targets: [{kind: file, fields: {path: ["docs/**"]}}]
  - id: secrets
    effect: deny
    operations: ["file.*"]
    targets: [{kind: file, fields: {path: ["secret/**"]}}]
  - id: src-window
    effect: request
    clients: ["agent*", "vscode"]
    operations: ["file.write"]
    targets: [{kind: file, fields: {path: ["src/**"]}}]
    grant_policy: {mode: window, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10, default_max_uses: 3, max_uses: 5}
"#;

    /// (operator, another key), made once.
    fn keys() -> &'static (OperatorSigner, OperatorSigner) {
        static KEYS: OnceLock<(tempfile::TempDir, (OperatorSigner, OperatorSigner))> =
            OnceLock::new();
        &KEYS
            .get_or_init(|| {
                let dir = tempfile::tempdir().unwrap();
                let make = |n: &str| {
                    let k = dir.path().join(n);
                    OperatorSigner::init(&k, &k.with_extension("pub"), None).unwrap();
                    OperatorSigner::load_from(&k).unwrap()
                };
                let pair = (make("operator"), make("agent"));
                (dir, pair)
            })
            .1
    }

    fn class(path: &str) -> Classification {
        Classification {
            target_kind: "file".into(),
            fields: BTreeMap::from([("path".to_string(), BTreeSet::from([path.to_string()]))]),
            attrs: BTreeMap::new(),
            must_name: Default::default(),
            argv: None,
        }
    }

    /// What a forgery changes, each against the approval of exactly the plan being checked.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Forgery {
        None,
        /// Another plan with the same classification (what a window grant may cover).
        OtherPlanSameClass,
        /// Another plan altogether (its digest and classification differ).
        OtherPlan,
        OtherClient,
        SignedByAnotherKey,
        OtherApprovalId,
        Denied,
        Expired,
        OtherWorkspace,
    }

    fn forgery() -> impl Strategy<Value = Forgery> {
        prop_oneof![
            Just(Forgery::None),
            Just(Forgery::OtherPlanSameClass),
            Just(Forgery::OtherPlan),
            Just(Forgery::OtherClient),
            Just(Forgery::SignedByAnotherKey),
            Just(Forgery::OtherApprovalId),
            Just(Forgery::Denied),
            Just(Forgery::Expired),
            Just(Forgery::OtherWorkspace),
        ]
    }

    #[allow(clippy::too_many_arguments)]
    fn approval(
        f: Forgery,
        window: bool,
        max_uses: u32,
        client: &str,
        digest: &str,
        c: &Classification,
        now: u64,
        junk: &str,
    ) -> Approval {
        let (op, other) = keys();
        let payload = DecisionPayload {
            domain: DecisionPayload::DOMAIN.into(),
            workspace_id: if f == Forgery::OtherWorkspace {
                "ws_other"
            } else {
                "ws_1"
            }
            .into(),
            approval_id: if f == Forgery::OtherApprovalId {
                "ap_2"
            } else {
                "ap_1"
            }
            .into(),
            operation_id: "op_1".into(),
            client: if f == Forgery::OtherClient {
                "agent-x"
            } else {
                client
            }
            .into(),
            operation: "file.write".into(),
            plan_digest: digest.into(),
            classification_digest: classification_digest(c),
            mode: if window {
                GrantMode::Window
            } else {
                GrantMode::Execution
            },
            decision: if f == Forgery::Denied {
                DecisionKind::Deny
            } else {
                DecisionKind::Approve
            },
            revision: 2,
            decided_at_ms: now - 10,
            expires_at_ms: Some(if f == Forgery::Expired {
                now
            } else {
                now + 1000
            }),
            max_uses,
            narrowed_duration_seconds: None,
            narrowed_max_uses: None,
            reason: None,
            head: Head {
                seq: 1,
                hash: "h".into(),
            },
        };
        let signer = if f == Forgery::SignedByAnotherKey {
            other
        } else {
            op
        };
        let sig = OperatorSignature::sign(signer, &payload);
        // Every unsigned field of the record is the agent's to choose: junk in all of them.
        Approval {
            id: "ap_1".into(),
            operation_id: junk.into(),
            client_id: junk.into(),
            operation: junk.into(),
            plan_digest: junk.into(),
            classification: class(junk),
            mode: GrantMode::Window,
            status: ApprovalStatus::Active,
            revision: 2,
            created_at_ms: 0,
            pending_expires_at_ms: u64::MAX,
            requested_duration_seconds: u64::MAX,
            requested_max_uses: u32::MAX,
            decision: Some(SignedDecision::unverified(sig).unwrap().1),
            uses: BTreeMap::new(),
            decision_keys: BTreeMap::new(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// An execution is authorized only by a current trusted rule (for a submission this
        /// process accepted) or by an operator signature over exactly this plan (or, for a
        /// window this process's client holds, exactly this classification, as far as the
        /// trusted policy grants one approval of it now).
        #[test]
        fn only_a_rule_or_a_signature_over_exactly_this_plan_authorizes(
            dir in prop::sample::select(vec!["docs", "src", "secret"]),
            leaf in "[a-c]{1,3}",
            client in prop::sample::select(vec!["agent-1", "vscode", "anonymous"]),
            f in forgery(),
            window in any::<bool>(),
            wide in any::<bool>(),
            vouched in any::<bool>(),
            points in any::<bool>(),
            requires_approval in any::<bool>(),
            junk in "[a-z/]{0,12}",
        ) {
            let policy = Policy::parse(POLICY, std::path::Path::new("policy.yaml")).unwrap();
            let now = 1_000_000;
            let path = format!("{dir}/{leaf}");
            let c = class(&path);
            let digest = crate::util::sha256_hex(path.as_bytes());
            // The approval was made for the plan at `path`; the plan being executed may differ.
            let (exec_digest, exec_class) = match f {
                Forgery::OtherPlanSameClass => (crate::util::sha256_hex(b"other"), c.clone()),
                Forgery::OtherPlan => (crate::util::sha256_hex(b"other"), class("src/zzz")),
                _ => (digest.clone(), c.clone()),
            };
            // A wide window was signed over more uses than the policy's rule grants.
            let uses = if wide { 30 } else { 3 };
            let a = approval(f, window, uses, client, &digest, &c, now, &junk);
            let key = keys().0.public();
            let check = Check {
                operation_id: "op_1",
                client,
                operation: "file.write",
                plan_digest: &exec_digest,
                class: &exec_class,
                requires_approval,
                approval_ttl_seconds: 600,
                approval: points.then_some(&a),
                points_at_approval: points,
                policy: &policy,
                key: Some(&key),
                workspace_id: Some("ws_1"),
                chain_ok: true,
            store_refusal: None,
                now_ms: now,
                vouched,
                lane_scope: None,
            };
            let exec_path = exec_class.fields["path"].first().cloned().unwrap_or_default();
            let denied = exec_path.starts_with("secret/");
            let allowed = !requires_approval && exec_path.starts_with("docs/") && client.starts_with("agent");
            // What the src-window rule grants one approval: 3 uses (a wide window has more).
            let in_window = exec_path.starts_with("src/") && client != "anonymous" && !wide;
            let expected = if denied {
                false
            } else if !points {
                vouched && allowed
            } else {
                match f {
                    Forgery::None => true,
                    Forgery::OtherPlanSameClass => window && vouched && (allowed || in_window),
                    _ => false,
                }
            };
            let got = authorize(&check);
            prop_assert_eq!(got.is_ok(), expected, "{:?} {:?}", f, got);
            if let Ok(Authority::Approval { approval_id, .. }) = &got {
                prop_assert_eq!(approval_id.as_str(), "ap_1");
            }
        }
    }

    #[test]
    fn a_broken_chain_or_no_public_key_accepts_no_signature() {
        let policy = Policy::default();
        let c = class("src/a");
        let a = approval(Forgery::None, false, 1, "agent-1", "d", &c, 1000, "");
        let key = keys().0.public();
        let mut check = Check {
            operation_id: "op_1",
            client: "agent-1",
            operation: "file.write",
            plan_digest: "d",
            class: &c,
            requires_approval: false,
            approval_ttl_seconds: 600,
            approval: Some(&a),
            points_at_approval: true,
            policy: &policy,
            key: Some(&key),
            workspace_id: Some("ws_1"),
            chain_ok: true,
            store_refusal: None,
            now_ms: 1000,
            vouched: false,
            lane_scope: None,
        };
        assert!(authorize(&check).is_ok());
        check.chain_ok = false;
        assert_eq!(authorize(&check).unwrap_err().code, codes::APPROVAL_INVALID);
        check.chain_ok = true;
        check.key = None;
        assert_eq!(authorize(&check).unwrap_err().code, codes::APPROVAL_INVALID);
        check.key = Some(&key);
        check.store_refusal = Some("rolled back");
        assert_eq!(
            authorize(&check).unwrap_err().code,
            codes::STORE_ROLLED_BACK
        );
    }

    /// A window signed over more than the trusted policy grants one approval of its plan (as
    /// a gaffer that copied a forged request's scope signed it) runs the plan the operator
    /// saw, and covers no other plan of its classification; within the policy it does, until
    /// the policy is narrowed.
    #[test]
    fn a_window_wider_than_the_policy_covers_only_its_own_plan() {
        let c = class("src/a");
        let key = keys().0.public();
        let check =
            |policy: &str, a: &Approval, operation_id: &'static str, digest: &'static str| {
                let policy = Policy::parse(policy, std::path::Path::new("policy.yaml")).unwrap();
                authorize(&Check {
                    operation_id,
                    client: "agent-1",
                    operation: "file.write",
                    plan_digest: digest,
                    class: &c,
                    requires_approval: false,
                    approval_ttl_seconds: 600,
                    approval: Some(a),
                    points_at_approval: true,
                    policy: &policy,
                    key: Some(&key),
                    workspace_id: Some("ws_1"),
                    chain_ok: true,
                    store_refusal: None,
                    now_ms: 1000,
                    vouched: true,
                    lane_scope: None,
                })
            };
        let wide = approval(Forgery::None, true, 50, "agent-1", "d", &c, 1000, "");
        assert!(
            check(POLICY, &wide, "op_1", "d").is_ok(),
            "its own plan runs"
        );
        let other = check(POLICY, &wide, "op_2", "e").unwrap_err();
        assert_eq!(other.code, codes::APPROVAL_INVALID);
        assert!(other.message.contains("max_uses 50"), "{}", other.message);
        let fair = approval(Forgery::None, true, 3, "agent-1", "d", &c, 1000, "");
        assert!(
            check(POLICY, &fair, "op_2", "e").is_ok(),
            "within the policy"
        );
        // Once the policy grants one execution there, the window covers no other plan.
        let narrowed = POLICY.replace("mode: window", "mode: execution").replace(
            "default_max_uses: 3, max_uses: 5",
            "default_max_uses: 1, max_uses: 1",
        );
        let refused = check(&narrowed, &fair, "op_2", "e").unwrap_err();
        assert!(
            refused.message.contains("mode window"),
            "{}",
            refused.message
        );
    }
}
