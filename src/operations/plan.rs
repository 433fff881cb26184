//! The immutable plan: everything an approval authorises, in RFC 8785 canonical JSON,
//! identified by the sha256 of that text.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::adapter::{Presentation, Resolved};
use super::canonical::Exact;
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

impl PlanAuthorization {
    fn write_canonical(&self, out: &mut Vec<u8>) {
        use crate::jcs::{write_string, write_u64, write_value};
        // The small parts go through serde, so their spelling stays the derived one.
        let value = |v: serde_json::Result<Value>| v.unwrap_or(Value::Null);
        out.extend_from_slice(b"{\"classification\":");
        write_value(&value(serde_json::to_value(&self.classification)), out);
        out.extend_from_slice(b",\"mode\":");
        write_value(&value(serde_json::to_value(self.mode)), out);
        out.extend_from_slice(b",\"policy_effect\":");
        write_value(&value(serde_json::to_value(self.policy_effect)), out);
        out.extend_from_slice(b",\"requested_duration_seconds\":");
        match self.requested_duration_seconds {
            Some(n) => write_u64(n, out),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"requested_max_uses\":");
        match self.requested_max_uses {
            Some(n) => write_u64(u64::from(n), out),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"rule_ids\":[");
        for (i, id) in self.rule_ids.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_string(id, out);
        }
        out.extend_from_slice(b"]}");
    }
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
    /// RFC 8785 text of the plan, written member by member (no `Value` copy of the target
    /// and arguments); a test holds it to the derived `Serialize` through [`jcs`].
    pub fn canonical(&self) -> String {
        use crate::jcs::{write_string, write_u64, write_value};
        let mut out = Vec::with_capacity(1024);
        let member = |name: &str, out: &mut Vec<u8>| {
            out.push(if out.is_empty() { b'{' } else { b',' });
            write_string(name, out);
            out.push(b':');
        };
        // Member names in JCS order (all ASCII, so byte order is UTF-16 order).
        member("arguments", &mut out);
        write_value(&self.arguments, &mut out);
        member("authorization", &mut out);
        self.authorization.write_canonical(&mut out);
        member("client_id", &mut out);
        write_string(&self.client_id, &mut out);
        member("created_at_ms", &mut out);
        write_u64(self.created_at_ms, &mut out);
        member("expires_at_ms", &mut out);
        write_u64(self.expires_at_ms, &mut out);
        member("operation", &mut out);
        write_string(&self.operation, &mut out);
        member("operation_id", &mut out);
        write_string(&self.operation_id, &mut out);
        member("operation_revision", &mut out);
        write_u64(u64::from(self.operation_revision), &mut out);
        member("preconditions", &mut out);
        write_value(&self.preconditions, &mut out);
        member("presentation", &mut out);
        out.extend_from_slice(b"{\"summary\":");
        write_string(&self.presentation.summary, &mut out);
        out.extend_from_slice(b",\"title\":");
        write_string(&self.presentation.title, &mut out);
        out.push(b'}');
        member("provider", &mut out);
        write_string(&self.provider, &mut out);
        member("schema", &mut out);
        write_string(&self.schema, &mut out);
        member("target", &mut out);
        write_value(&self.target, &mut out);
        out.push(b'}');
        // Every piece above is UTF-8 text.
        String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
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
    use super::super::canonical::jcs;
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
    fn the_member_writer_spells_every_plan_as_the_derived_serialize_does() {
        let mut plans = vec![plan()];
        let mut p = plan();
        p.target = serde_json::json!({"\u{e9}": 1, "z": [true, null, -0.5, 1e21], "\u{1F600}": {"b": "\u{7}\\\"", "a": ""}});
        p.arguments = serde_json::json!([u64::MAX, i64::MIN, 9_007_199_254_740_993_u64, 0.1]);
        p.preconditions = serde_json::Value::Null;
        p.presentation.summary = "line\nbreak \u{2028} </script>".into();
        p.created_at_ms = u64::MAX;
        p.expires_at_ms = (1 << 53) + 1;
        p.operation_revision = u32::MAX;
        p.authorization.mode = Some(GrantMode::Window);
        p.authorization.policy_effect = DecisionEffect::Request;
        p.authorization.requested_duration_seconds = Some(3_600);
        p.authorization.requested_max_uses = Some(u32::MAX);
        p.authorization.rule_ids = vec![];
        p.authorization.classification.must_name = ["secret".to_string()].into();
        p.authorization.classification.argv = Some(vec!["a b".into(), "\"".into()]);
        plans.push(p.clone());
        p.authorization.mode = Some(GrantMode::Execution);
        p.authorization.policy_effect = DecisionEffect::NoMatch;
        p.authorization.rule_ids = vec!["b".into(), "a".into()];
        plans.push(p);
        for p in plans {
            let derived = jcs(&serde_json::to_value(&p).unwrap());
            assert_eq!(p.canonical(), derived);
        }
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
