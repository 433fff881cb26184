//! Operations as a snapshot stores them: each one a JSON array of its fields in a fixed order,
//! without the field names (about half the text of the object form, and no name to match per
//! field when decoding). Snapshots written before hold a map of objects; both decode.
//! Records in the journal keep the object form: this is the snapshot's cache format only.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, SerializeTuple, Serializer};
use serde::{Deserialize, Serialize};

use super::adapter::Presentation;
use super::state::{OpFailure, Operation};

/// Elements of one operation's array.
const FIELDS: usize = 23;

/// One operation in the compact form.
struct Compact<'a>(&'a Operation);

impl Serialize for Compact<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Destructured in full: a field added to `Operation` does not compile until it is here.
        let Operation {
            id,
            client_id,
            idempotency_key,
            operation,
            provider,
            submitted,
            reason,
            target,
            arguments,
            state,
            revision,
            approval_id,
            created_at_ms,
            updated_at_ms,
            terminal_at_ms,
            presentation: Presentation { title, summary },
            plan_digest,
            plan,
            result,
            upstream_status,
            error,
            executor,
        } = self.0;
        let error = error.as_ref().map(|e| (&e.code, &e.message));
        let mut t = s.serialize_tuple(FIELDS)?;
        t.serialize_element(id)?;
        t.serialize_element(client_id)?;
        t.serialize_element(idempotency_key)?;
        t.serialize_element(operation)?;
        t.serialize_element(provider)?;
        t.serialize_element(submitted)?;
        t.serialize_element(reason)?;
        t.serialize_element(target)?;
        t.serialize_element(arguments)?;
        t.serialize_element(state)?;
        t.serialize_element(revision)?;
        t.serialize_element(approval_id)?;
        t.serialize_element(created_at_ms)?;
        t.serialize_element(updated_at_ms)?;
        t.serialize_element(terminal_at_ms)?;
        t.serialize_element(title)?;
        t.serialize_element(summary)?;
        t.serialize_element(plan_digest)?;
        t.serialize_element(plan)?;
        t.serialize_element(result)?;
        t.serialize_element(upstream_status)?;
        t.serialize_element(&error)?;
        t.serialize_element(executor)?;
        t.end()
    }
}

/// Decodes one operation from its array.
struct CompactVisitor;

impl<'de> Visitor<'de> for CompactVisitor {
    type Value = Operation;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "an operation as an array of {FIELDS} fields")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Operation, A::Error> {
        let mut n = 0;
        // Struct expression fields are evaluated in the order written: the array's order.
        macro_rules! next {
            () => {{
                let v = a
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(n, &self))?;
                n += 1;
                v
            }};
        }
        let op = Operation {
            id: next!(),
            client_id: next!(),
            idempotency_key: next!(),
            operation: next!(),
            provider: next!(),
            submitted: next!(),
            reason: next!(),
            target: next!(),
            arguments: next!(),
            state: next!(),
            revision: next!(),
            approval_id: next!(),
            created_at_ms: next!(),
            updated_at_ms: next!(),
            terminal_at_ms: next!(),
            presentation: Presentation {
                title: next!(),
                summary: next!(),
            },
            plan_digest: next!(),
            plan: next!(),
            result: next!(),
            upstream_status: next!(),
            error: {
                let e: Option<(String, String)> = next!();
                e.map(|(code, message)| OpFailure { code, message })
            },
            executor: next!(),
        };
        debug_assert_eq!(n, FIELDS);
        Ok(op)
    }
}

struct Op(Box<Operation>);

impl<'de> Deserialize<'de> for Op {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Op, D::Error> {
        d.deserialize_tuple(FIELDS, CompactVisitor)
            .map(|op| Op(Box::new(op)))
    }
}

/// Serializes the operations map as an array of compact operations, in id order.
pub fn serialize_ops<S: Serializer>(
    ops: &crate::operations::state::Operations,
    s: S,
) -> Result<S::Ok, S::Error> {
    let mut seq = s.serialize_seq(Some(ops.len()))?;
    for op in ops.values() {
        seq.serialize_element(&Compact(op))?;
    }
    seq.end()
}

/// Decodes the operations from either form, building the map in bulk (full nodes).
pub fn deserialize_ops<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<crate::operations::state::Operations, D::Error> {
    struct Either;
    impl<'de> Visitor<'de> for Either {
        type Value = Vec<(String, Box<Operation>)>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("operations, as an array of arrays or a map of objects")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(a.size_hint().unwrap_or(0).min(4096));
            while let Some(Op(op)) = a.next_element()? {
                out.push((op.id.clone(), op));
            }
            Ok(out)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(m.size_hint().unwrap_or(0).min(4096));
            while let Some(entry) = m.next_entry()? {
                out.push(entry);
            }
            Ok(out)
        }
    }
    Ok(d.deserialize_any(Either)?.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operations::lifecycle::OpState;
    use proptest::prelude::*;
    use serde_json::json;

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Wrap {
        #[serde(serialize_with = "serialize_ops", deserialize_with = "deserialize_ops")]
        ops: crate::operations::state::Operations,
    }

    fn text() -> impl Strategy<Value = String> {
        "[a-z\"\\\\, ]{0,6}"
    }

    fn operation() -> impl Strategy<Value = Operation> {
        let ids = (text(), text(), text(), text(), text(), text(), text());
        let state = proptest::sample::select(OpState::ALL.to_vec());
        let nums = (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<Option<u64>>(),
            any::<Option<u16>>(),
        );
        let opts = (
            proptest::option::of(text()),
            proptest::option::of(text()),
            proptest::option::of(text()),
            proptest::option::of((text(), text())),
            proptest::option::of(text()),
            proptest::option::of(any::<i64>()),
        );
        (ids, state, nums, opts, (text(), text())).prop_map(
            |(
                (id, client_id, idempotency_key, operation, provider, submitted, reason),
                state,
                (revision, created_at_ms, updated_at_ms, terminal_at_ms, upstream_status),
                (approval_id, plan_digest, plan, error, executor, result),
                (title, summary),
            )| Operation {
                id,
                client_id,
                idempotency_key,
                operation,
                provider,
                submitted,
                reason,
                target: json!({"path": title}),
                arguments: json!([revision, "x"]),
                state,
                revision,
                approval_id,
                created_at_ms,
                updated_at_ms,
                terminal_at_ms,
                presentation: Presentation { title, summary },
                plan_digest,
                plan,
                result: result.map(|n| json!({"n": n})),
                upstream_status,
                error: error.map(|(code, message)| OpFailure { code, message }),
                executor,
            },
        )
    }

    proptest! {
        /// The compact form decodes to exactly what was encoded, and the object form of
        /// older snapshots decodes to the same map.
        #[test]
        fn prop_compact_and_object_forms_round_trip(
            ops in proptest::collection::vec(operation(), 0..6),
        ) {
            let ops: crate::operations::state::Operations =
                ops.into_iter().map(|o| (o.id.clone(), Box::new(o))).collect();
            let compact = serde_json::to_string(&Wrap { ops: ops.clone() }).unwrap();
            let back: Wrap = serde_json::from_str(&compact).unwrap();
            prop_assert_eq!(&back.ops, &ops);
            let objects = serde_json::to_string(&json!({ "ops": ops })).unwrap();
            let back: Wrap = serde_json::from_str(&objects).unwrap();
            prop_assert_eq!(&back.ops, &ops);
        }
    }

    #[test]
    fn a_short_or_long_array_is_refused() {
        let op = crate::operations::state::tests::op("op_1", OpState::Denied, None);
        let full = serde_json::to_value(Compact(&op)).unwrap();
        let mut short = full.clone();
        short.as_array_mut().unwrap().pop();
        let mut long = full.clone();
        long.as_array_mut().unwrap().push(json!(null));
        for bad in [short, long] {
            let r = serde_json::from_value::<Wrap>(json!({ "ops": [bad] }));
            assert!(r.is_err(), "{r:?}");
        }
        let ok: Wrap = serde_json::from_value(json!({ "ops": [full] })).unwrap();
        assert_eq!(*ok.ops["op_1"], op);
    }
}
