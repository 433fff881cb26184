//! The one authorization check. Every path that starts an execution calls [`authorize`] at
//! the moment of the claim, with the plan text decoded and classified afresh. Authority is
//! (a) a rule of the currently trusted policy, or (b) an operator signature that covers
//! exactly this plan (its digest) or, for a window, exactly this classification. A record's
//! own state, classification, mode or view fields are never read here.

use super::decision::{DecisionPayload, classification_digest};
use super::lifecycle::codes;
use super::policy::{Classification, DecisionEffect, GrantMode, Policy, PolicyRequest};
use super::state::{Approval, ApprovalStatus, DecisionKind};
use crate::operator::OperatorPublic;

/// What authorizes an execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authority {
    /// An allow rule of the trusted policy.
    Policy { rule_ids: Vec<String> },
    /// An operator-signed approval; its use is reserved by the claim.
    Approval { approval_id: String },
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
    /// The approval the operation points at (looked up by id; its fields are not trusted).
    pub approval: Option<&'a Approval>,
    pub points_at_approval: bool,
    pub policy: &'a Policy,
    pub key: Option<&'a OperatorPublic>,
    pub workspace_id: Option<&'a str>,
    /// The journal's hash chain verifies over what this process has read.
    pub chain_ok: bool,
    /// This process accepted the submission and checked its client identity itself. A record's
    /// client name is otherwise only a claim, so authority that depends on who the client is
    /// (a policy rule, a window grant) needs it; an approval of exactly this plan does not.
    pub vouched: bool,
    pub now_ms: u64,
}

pub fn authorize(c: &Check<'_>) -> Result<Authority, Refusal> {
    let req = PolicyRequest {
        client: c.client,
        operation: c.operation,
        class: c.class,
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
    usable(c, approval, &payload)?;
    Ok(Authority::Approval {
        approval_id: approval.id.clone(),
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
