//! The immutable plan: everything an approval authorises, in RFC 8785 canonical JSON,
//! identified by the sha256 of that text.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::adapter::{Presentation, Resolved};
use super::canonical::{Exact, jcs};
use super::policy::{Classification, DecisionEffect, GrantMode};

pub const PLAN_SCHEMA: &str = "gaffer.dev/plan/v1";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanAuthorization {
    pub classification: Classification,
    pub policy_effect: DecisionEffect,
    pub rule_ids: Vec<String>,
    /// Present on the approval path.
    pub mode: Option<GrantMode>,
    pub requested_duration_seconds: Option<u64>,
    pub requested_max_uses: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub schema: String,
    pub operation: String,
    pub operation_revision: u32,
    pub provider: String,
    pub client_id: String,
    pub operation_id: String,
    pub target: Value,
    pub arguments: Value,
    pub preconditions: Value,
    pub presentation: Presentation,
    pub authorization: PlanAuthorization,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("plan digest does not match its text")]
    DigestMismatch,
    #[error("plan text is not canonical")]
    NotCanonical,
    #[error("plan text does not decode: {0}")]
    Malformed(String),
    #[error("plan expired")]
    Expired,
    #[error("plan does not belong to this operation")]
    WrongOperation,
}

impl Plan {
    /// RFC 8785 text of the plan.
    pub fn canonical(&self) -> String {
        // A derived Serialize of plain data cannot fail.
        jcs(&serde_json::to_value(self).unwrap_or(Value::Null))
    }

    pub fn digest_of(text: &str) -> String {
        crate::util::sha256_hex(text.as_bytes())
    }

    /// The provider part used by adapters to execute and reconcile.
    pub fn resolved(&self) -> Resolved {
        Resolved {
            target: self.target.clone(),
            arguments: self.arguments.clone(),
            preconditions: self.preconditions.clone(),
        }
    }

    /// Re-checks a stored plan before anything runs: the digest covers the text, the text is
    /// canonical, it belongs to `operation_id` and it has not expired.
    pub fn verify(
        text: &str,
        digest: &str,
        operation_id: &str,
        client_id: &str,
        now_ms: u64,
        check_expiry: bool,
    ) -> Result<Plan, PlanError> {
        if Plan::digest_of(text) != digest {
            return Err(PlanError::DigestMismatch);
        }
        let exact = Exact::parse(text).map_err(|e| PlanError::Malformed(e.to_string()))?;
        if exact.jcs_text().ok().as_deref() != Some(text) {
            return Err(PlanError::NotCanonical);
        }
        let plan: Plan =
            serde_json::from_str(text).map_err(|e| PlanError::Malformed(e.to_string()))?;
        if plan.schema != PLAN_SCHEMA {
            return Err(PlanError::Malformed(format!(
                "unknown schema {}",
                plan.schema
            )));
        }
        if plan.operation_id != operation_id || plan.client_id != client_id {
            return Err(PlanError::WrongOperation);
        }
        if check_expiry && now_ms >= plan.expires_at_ms {
            return Err(PlanError::Expired);
        }
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn plan() -> Plan {
        let mut fields = BTreeMap::new();
        fields.insert(
            "path".to_string(),
            ["b", "a", "a"]
                .iter()
                .map(|s| s.to_string())
                .collect::<BTreeSet<_>>(),
        );
        Plan {
            schema: PLAN_SCHEMA.into(),
            operation: "file.write".into(),
            operation_revision: 1,
            provider: "workspace".into(),
            client_id: "agent".into(),
            operation_id: "op_1".into(),
            target: serde_json::json!({"path": "a", "kind": "file"}),
            arguments: serde_json::json!({"content": "x", "n": 1.5}),
            preconditions: serde_json::json!({"prior_digest": null}),
            presentation: Presentation {
                title: "Write a".into(),
                summary: String::new(),
            },
            authorization: PlanAuthorization {
                classification: Classification {
                    target_kind: "file".into(),
                    fields,
                    attrs: BTreeMap::new(),
                    must_name: Default::default(),
                    argv: None,
                },
                policy_effect: DecisionEffect::Allow,
                rule_ids: vec!["r".into()],
                mode: None,
                requested_duration_seconds: None,
                requested_max_uses: None,
            },
            created_at_ms: 1_000,
            expires_at_ms: 2_000,
        }
    }

    #[test]
    fn canonical_text_is_jcs_sorted_at_every_level_and_sets_are_deduplicated() {
        let text = plan().canonical();
        assert!(
            text.contains(r#""target":{"kind":"file","path":"a"}"#),
            "{text}"
        );
        assert!(text.contains(r#""path":["a","b"]"#), "{text}");
        assert_eq!(Exact::parse(&text).unwrap().jcs_text().unwrap(), text);
    }

    #[test]
    fn verify_accepts_the_original_and_refuses_tampering_and_expiry() {
        let p = plan();
        let text = p.canonical();
        let digest = Plan::digest_of(&text);
        assert_eq!(
            Plan::verify(&text, &digest, "op_1", "agent", 1_500, true).unwrap(),
            p
        );
        let tampered = text.replace("\"content\":\"x\"", "\"content\":\"y\"");
        assert_eq!(
            Plan::verify(&tampered, &digest, "op_1", "agent", 1_500, true),
            Err(PlanError::DigestMismatch)
        );
        let spaced = text.replacen(':', ": ", 1);
        assert_eq!(
            Plan::verify(
                &spaced,
                &Plan::digest_of(&spaced),
                "op_1",
                "agent",
                1_500,
                true
            ),
            Err(PlanError::NotCanonical)
        );
        assert_eq!(
            Plan::verify(&text, &digest, "op_2", "agent", 1_500, true),
            Err(PlanError::WrongOperation)
        );
        assert_eq!(
            Plan::verify(&text, &digest, "op_1", "agent", 2_000, true),
            Err(PlanError::Expired)
        );
        assert!(Plan::verify(&text, &digest, "op_1", "agent", 2_000, false).is_ok());
    }

    #[test]
    fn two_plans_differ_in_digest_when_the_operation_id_differs() {
        let a = plan();
        let mut b = plan();
        b.operation_id = "op_2".into();
        assert_ne!(
            Plan::digest_of(&a.canonical()),
            Plan::digest_of(&b.canonical())
        );
    }
}
