//! Operations as a snapshot stores them: each one a JSON array of its fields in a fixed order,
//! without the field names (about half the text of the object form, and no name to match per
//! field when decoding), grouped in chunks of [`CHUNK`] that decode on several threads at once
//! (up to [`MAX_DECODERS`]).
//! Snapshots written before hold one array of compact operations, or a map of objects; all
//! decode. Records in the journal keep the object form: this is the snapshot's cache format
//! only.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, SerializeTuple, Serializer};
use serde::{Deserialize, Serialize};

use super::adapter::Presentation;
use super::state::{OpFailure, Operation};

/// Elements of one operation's array (snapshots written before seals hold the first 23).
const FIELDS: usize = 26;

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
            request_seal,
            step_seal,
            created_seq,
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
        t.serialize_element(request_seal)?;
        t.serialize_element(step_seal)?;
        t.serialize_element(created_seq)?;
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
            // Absent from snapshots written before seals.
            request_seal: a.next_element::<Option<String>>()?.flatten(),
            step_seal: a.next_element::<Option<String>>()?.flatten(),
            created_seq: a.next_element::<u64>()?.unwrap_or(0),
        };
        debug_assert_eq!(n, FIELDS - 3);
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

/// Serializes the operations map as an array of compact operations, in id order: the form
/// snapshots held before chunks, written now only by tests showing they still decode.
#[cfg(test)]
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

/// Operations per chunk: enough that a chunk's decode dwarfs handing it to a thread, few
/// enough that 100,000 operations spread evenly over the cores.
pub const CHUNK: usize = 2048;

/// No operation's compact array is shorter: 23 fields, each at least one byte and a comma.
const MIN_OPERATION_BYTES: usize = 2 * FIELDS;

/// At most this many threads decode one snapshot's chunks (the scanning one included).
const MAX_DECODERS: usize = 8;

/// Serializes the operations as an array of chunks, each an array of compact operations, all
/// in id order.
pub fn serialize_chunks<S: Serializer>(
    ops: &crate::operations::state::Operations,
    s: S,
) -> Result<S::Ok, S::Error> {
    struct Chunk<'a>(&'a [&'a Operation]);
    impl Serialize for Chunk<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut seq = s.serialize_seq(Some(self.0.len()))?;
            for op in self.0 {
                seq.serialize_element(&Compact(op))?;
            }
            seq.end()
        }
    }
    let all: Vec<&Operation> = ops.values().map(|op| &**op).collect();
    let mut seq = s.serialize_seq(Some(all.len().div_ceil(CHUNK)))?;
    for chunk in all.chunks(CHUNK) {
        seq.serialize_element(&Chunk(chunk))?;
    }
    seq.end()
}

/// Decodes chunks as [`serialize_chunks`] writes them. This thread finds each chunk's text
/// (one scan of the array) and queues it; from the second chunk on, other threads decode
/// queued chunks while the scan goes on, and this one joins them once it is done. The chunks
/// are joined in order, so the map is still built from ids in order. They are borrowed from
/// the input: the decoder must read from memory (as a snapshot's is).
pub fn deserialize_chunks<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<crate::operations::state::Operations, D::Error> {
    let mut helpers = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, MAX_DECODERS)
        - 1;
    let queue = Queue::default();
    let (scanned, mut decoded) = std::thread::scope(|s| {
        let mut running = Vec::new();
        let scanned = {
            // Whatever ends the scan, the helpers are told no more chunks come.
            let _close = Closing(&queue);
            d.deserialize_seq(Scan {
                queue: &queue,
                found: &mut |n| {
                    if n >= 2 && running.len() < helpers {
                        // Without a helper, this thread decodes the rest after its scan.
                        match crate::util::spawn_scoped(s, "gaffer-snapshot-decode", || {
                            decode_queued(&queue)
                        }) {
                            Some(helper) => running.push(helper),
                            None => helpers = running.len(),
                        }
                    }
                },
            })
        };
        let mut decoded = decode_queued(&queue);
        for helper in running {
            decoded.extend(crate::util::join_scoped(helper));
        }
        (scanned, decoded)
    });
    scanned?;
    decoded.sort_unstable_by_key(|(i, _)| *i);
    let total = decoded
        .iter()
        .map(|(_, chunk)| chunk.as_ref().map_or(0, Vec::len))
        .sum();
    let mut ops = Vec::with_capacity(total);
    for (_, chunk) in decoded {
        ops.extend(chunk.map_err(de::Error::custom)?);
    }
    Ok(ops.into_iter().collect())
}

/// Chunks found and not yet decoded: (index, text), and whether the scan has ended.
#[derive(Default)]
struct Queue<'a> {
    pending: Mutex<(VecDeque<(usize, &'a str)>, bool)>,
    ready: Condvar,
}

impl<'a> Queue<'a> {
    fn lock(&self) -> MutexGuard<'_, (VecDeque<(usize, &'a str)>, bool)> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, i: usize, text: &'a str) {
        self.lock().0.push_back((i, text));
        self.ready.notify_one();
    }

    fn close(&self) {
        self.lock().1 = true;
        self.ready.notify_all();
    }

    /// The next chunk to decode; None once the scan has ended and none is left.
    fn take(&self) -> Option<(usize, &'a str)> {
        let mut pending = self.lock();
        loop {
            if let Some(next) = pending.0.pop_front() {
                return Some(next);
            }
            if pending.1 {
                return None;
            }
            pending = self
                .ready
                .wait(pending)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

struct Closing<'q, 'a>(&'q Queue<'a>);

impl Drop for Closing<'_, '_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Visits the chunk array, queueing each chunk's text and reporting how many were found.
struct Scan<'q, 'a, 'f> {
    queue: &'q Queue<'a>,
    found: &'f mut dyn FnMut(usize),
}

impl<'de> Visitor<'de> for Scan<'_, 'de, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of operation chunks")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        let mut n = 0;
        while let Some(chunk) = a.next_element::<&'de serde_json::value::RawValue>()? {
            self.queue.push(n, chunk.get());
            n += 1;
            (self.found)(n);
        }
        Ok(())
    }
}

/// Decodes queued chunks until the queue is closed and empty: (index, operations) each.
type Decoded = Vec<(usize, Result<Vec<(String, Box<Operation>)>, String>)>;

fn decode_queued(queue: &Queue<'_>) -> Decoded {
    let mut out = Vec::new();
    while let Some((i, text)) = queue.take() {
        out.push((
            i,
            decode_chunk(text).map_err(|e| format!("operation chunk {i}: {e}")),
        ));
    }
    out
}

/// The operations of one chunk, in order.
fn decode_chunk(text: &str) -> Result<Vec<(String, Box<Operation>)>, serde_json::Error> {
    /// Room for as many operations as the text can hold (an operation's array is never shorter
    /// than [`MIN_OPERATION_BYTES`]), so that a short text never reserves a whole chunk.
    struct Chunk(usize);
    impl<'de> Visitor<'de> for Chunk {
        type Value = Vec<(String, Box<Operation>)>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a chunk of operations")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(self.0);
            while let Some(Op(op)) = a.next_element()? {
                out.push((op.id.clone(), op));
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let ops = de.deserialize_seq(Chunk((text.len() / MIN_OPERATION_BYTES).min(CHUNK)))?;
    de.end()?;
    Ok(ops)
}

/// Decodes the operations from either older form, building the map in bulk (full nodes).
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

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Chunked {
        #[serde(
            serialize_with = "serialize_chunks",
            deserialize_with = "deserialize_chunks"
        )]
        ops: crate::operations::state::Operations,
    }

    fn many(n: usize) -> crate::operations::state::Operations {
        (0..n)
            .map(|i| {
                let id = format!("op_{i:06}");
                let op = crate::operations::state::tests::op(&id, OpState::Denied, None);
                (id, Box::new(op))
            })
            .collect()
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
            proptest::option::of(text()),
            proptest::option::of(text()),
        );
        (ids, state, nums, opts, (text(), text())).prop_map(
            |(
                (id, client_id, idempotency_key, operation, provider, submitted, reason),
                state,
                (revision, created_at_ms, updated_at_ms, terminal_at_ms, upstream_status),
                (approval_id, plan_digest, plan, error, executor, result, request_seal, step_seal),
                (title, summary),
            )| Operation {
                id,
                client_id,
                idempotency_key,
                operation,
                provider,
                submitted,
                reason,
                target: json!({"path": title}).into(),
                arguments: json!([revision, "x"]).into(),
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
                request_seal,
                step_seal,
                created_seq: revision.wrapping_mul(3),
            },
        )
    }

    proptest! {
        /// The chunked form decodes to exactly what was encoded, and so do the two forms of
        /// older snapshots (one compact array, a map of objects).
        #[test]
        fn prop_chunked_compact_and_object_forms_round_trip(
            ops in proptest::collection::vec(operation(), 0..6),
        ) {
            let ops: crate::operations::state::Operations =
                ops.into_iter().map(|o| (o.id.clone(), Box::new(o))).collect();
            let chunked = serde_json::to_string(&Chunked { ops: ops.clone() }).unwrap();
            let back: Chunked = serde_json::from_str(&chunked).unwrap();
            prop_assert_eq!(&back.ops, &ops);
            let compact = serde_json::to_string(&Wrap { ops: ops.clone() }).unwrap();
            let back: Wrap = serde_json::from_str(&compact).unwrap();
            prop_assert_eq!(&back.ops, &ops);
            // The object form has no created seq (it never reaches a record's text).
            let objects = serde_json::to_string(&json!({ "ops": ops })).unwrap();
            let back: Wrap = serde_json::from_str(&objects).unwrap();
            let mut unplaced = ops.clone();
            unplaced.values_mut().for_each(|o| o.created_seq = 0);
            prop_assert_eq!(&back.ops, &unplaced);
        }
    }

    #[test]
    fn operations_over_several_chunks_decode_in_id_order_across_threads() {
        let ops = many(2 * CHUNK + 1);
        let text = serde_json::to_string(&Chunked { ops: ops.clone() }).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let sizes: Vec<usize> = v["ops"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_array().unwrap().len())
            .collect();
        assert_eq!(sizes, [CHUNK, CHUNK, 1]);
        let back: Chunked = serde_json::from_str(&text).unwrap();
        assert_eq!(back.ops, ops);
    }

    #[test]
    fn a_damaged_operation_in_a_later_chunk_is_refused_naming_its_chunk() {
        let ops = many(2 * CHUNK + 1);
        let mut v = serde_json::to_value(Chunked { ops }).unwrap();
        v["ops"][2][0][10] = json!("not a revision");
        let err = serde_json::from_str::<Chunked>(&v.to_string()).unwrap_err();
        assert!(err.to_string().contains("operation chunk 2"), "{err}");
    }

    /// A chunk array that ends mid-chunk fails the scan after helpers have started: they are
    /// told no more chunks come, and the decode returns the error (it does not wait forever).
    #[test]
    fn a_chunk_array_cut_short_is_refused_without_waiting_for_more() {
        let ops = many(3 * CHUNK);
        let text = serde_json::to_string(&Chunked { ops }).unwrap();
        for cut in [text.len() * 5 / 6, text.len() - 3] {
            let err = serde_json::from_str::<Chunked>(&text[..cut]).unwrap_err();
            assert!(err.is_eof(), "{err}");
        }
        let not_a_chunk = text.replacen("]],[[", "]],7,[[", 1);
        let err = serde_json::from_str::<Chunked>(&not_a_chunk).unwrap_err();
        assert!(err.to_string().contains("operation chunk 1"), "{err}");
    }

    #[test]
    fn a_short_or_long_array_is_refused() {
        let mut op = crate::operations::state::tests::op("op_1", OpState::Denied, None);
        op.request_seal = Some("ab".repeat(32));
        op.step_seal = Some("cd".repeat(32));
        op.created_seq = 7;
        let full = serde_json::to_value(Compact(&op)).unwrap();
        // A snapshot written before seals: 23 fields, the operation without seals.
        let mut before_seals = full.clone();
        before_seals.as_array_mut().unwrap().truncate(23);
        let old: Wrap = serde_json::from_value(json!({ "ops": [before_seals.clone()] })).unwrap();
        assert_eq!(old.ops["op_1"].request_seal, None);
        assert_eq!(old.ops["op_1"].step_seal, None);
        assert_eq!(old.ops["op_1"].created_seq, 0);
        let mut short = before_seals;
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
