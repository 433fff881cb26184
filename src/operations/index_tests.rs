//! The operations index equals a rebuild from scratch after every fold, and each query over
//! it answers what a full scan answers (random record sequences, most of them refused).

use super::lifecycle::OpState;
use super::policy::GrantMode;
use super::state::tests::{approval, created, decided, envelope, op, tr};
use super::state::*;
use crate::operations::index::{DERIVE_IN_PARALLEL_FROM, deadline, derive};
use proptest::prelude::*;
use serde_json::Value;

const STATES: [OpState; 8] = OpState::ALL;

/// One step, as raw choices interpreted against the current state.
#[derive(Debug, Clone)]
enum Step {
    Create {
        op: u8,
        kind: u8,
        client: u8,
        at: u8,
        ap: u8,
        window: bool,
        expires: u16,
    },
    Move {
        op: u8,
        to: u8,
        effect: Option<(u8, u8)>,
    },
    Decide {
        ap: u8,
        approve: bool,
        expires: u16,
    },
    Revoke {
        ap: u8,
    },
    Prune {
        before: u16,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (
            0..6u8,
            0..4u8,
            0..2u8,
            0..4u8,
            0..6u8,
            any::<bool>(),
            0..2000u16
        )
            .prop_map(|(op, kind, client, at, ap, window, expires)| Step::Create {
                op,
                kind,
                client,
                at,
                ap,
                window,
                expires
            }),
        (0..6u8, 0..8u8, proptest::option::of((0..6u8, 0..8u8)))
            .prop_map(|(op, to, effect)| Step::Move { op, to, effect }),
        (0..6u8, any::<bool>(), 0..2000u16).prop_map(|(ap, approve, expires)| Step::Decide {
            ap,
            approve,
            expires
        }),
        (0..6u8).prop_map(|ap| Step::Revoke { ap }),
        (0..2000u16).prop_map(|before| Step::Prune { before }),
    ]
}

const EFFECTS: [ApprovalEffect; 8] = [
    ApprovalEffect::Reserve,
    ApprovalEffect::Commit,
    ApprovalEffect::Retain,
    ApprovalEffect::Release,
    ApprovalEffect::Cancel,
    ApprovalEffect::Revoke,
    ApprovalEffect::Expire,
    ApprovalEffect::Deny,
];

/// A created operation (and its approval when pending) from a `Step::Create`.
fn create(s: &OperationState, st: &Step) -> Option<(String, Value)> {
    let Step::Create { op, ap, .. } = *st else {
        return None;
    };
    create_as(s, st, usize::from(op), usize::from(ap))
}

/// [`create`] with the operation's and the approval's numbers given.
fn create_as(s: &OperationState, st: &Step, op_n: usize, ap_n: usize) -> Option<(String, Value)> {
    let Step::Create {
        kind,
        client,
        at,
        window,
        expires,
        ..
    } = *st
    else {
        return None;
    };
    let id = format!("op_{op_n}");
    let aid = format!("ap_{ap_n}");
    let state = [
        OpState::Pending,
        OpState::Approved,
        OpState::Denied,
        OpState::Failed,
    ][kind as usize];
    // Approved operations may name an existing (window) approval; pending ones bring theirs.
    let named = match state {
        OpState::Pending => Some(aid.as_str()),
        OpState::Approved if s.approvals.contains_key(&aid) => Some(aid.as_str()),
        _ => None,
    };
    let mut o = op(&id, state, named);
    o.client_id = format!("c{client}");
    o.idempotency_key = format!("k{op_n}-{}", s.operations.len());
    o.created_at_ms = u64::from(at);
    let a = (state == OpState::Pending).then(|| {
        let mut a = approval(&aid, &id);
        a.client_id = o.client_id.clone();
        a.mode = if window {
            GrantMode::Window
        } else {
            GrantMode::Execution
        };
        a.pending_expires_at_ms = u64::from(expires);
        a
    });
    Some((KIND_CREATED.to_string(), created(o, a)))
}

/// The record a step stands for, or None when it names nothing that exists.
fn record(s: &OperationState, st: &Step) -> Option<(String, Value)> {
    match *st {
        Step::Create { .. } => create(s, st),
        Step::Move { op, to, effect } => {
            let o = s.get(&format!("op_{op}"))?;
            let eff = effect.map(|(a, e)| (format!("ap_{a}"), EFFECTS[e as usize]));
            let v = tr(
                &o.id,
                o.state,
                STATES[to as usize],
                o.revision + 1,
                eff.as_ref().map(|(a, e)| (a.as_str(), *e)),
            );
            Some((KIND_TRANSITIONED.to_string(), v))
        }
        Step::Decide {
            ap,
            approve,
            expires,
        } => {
            let a = s.approvals.get(&format!("ap_{ap}"))?;
            let kind = if approve {
                DecisionKind::Approve
            } else {
                DecisionKind::Deny
            };
            let mut v = decided(&a.id, a.revision + 1, kind);
            let sig = &mut v["operator_signature"]["payload"];
            let text = sig.as_str()?.replace(
                "\"expires_at_ms\":500",
                &format!("\"expires_at_ms\":{expires}"),
            );
            *sig = Value::String(text);
            Some((KIND_DECIDED.to_string(), v))
        }
        Step::Revoke { ap } => {
            let a = s.approvals.get(&format!("ap_{ap}"))?;
            let v = serde_json::json!({
                "approval_id": a.id, "revision": a.revision + 1, "at_ms": 30,
                "operator_signature": envelope(&serde_json::json!({})),
            });
            Some((KIND_REVOKED.to_string(), v))
        }
        // Sealed as the retention sweep seals it (folded at seq 0).
        Step::Prune { before } => Some((
            KIND_PRUNED.to_string(),
            crate::operations::state::tests::sealed_prune(u64::from(before), 0),
        )),
    }
}

/// Every query over the index against a full scan.
fn check_queries(s: &OperationState) {
    let scan_deadline = s
        .operations
        .values()
        .filter_map(|op| deadline(op, &s.approvals))
        .min();
    assert_eq!(s.index.next_deadline(), scan_deadline);
    for now in [0u64, 500, 1000, 5000] {
        let mut due: Vec<&str> = s.index.due(now).collect();
        due.sort();
        let mut scan: Vec<&str> = s
            .operations
            .values()
            .filter(|op| deadline(op, &s.approvals).is_some_and(|d| d <= now))
            .map(|op| op.id.as_str())
            .collect();
        scan.sort();
        assert_eq!(due, scan);
    }
    for c in ["c0", "c1"] {
        let indexed: Vec<&String> = s.index.windows.get(c).into_iter().flatten().collect();
        let scan: Vec<&String> = s
            .approvals
            .values()
            .filter(|a| {
                a.client_id == c
                    && a.mode == GrantMode::Window
                    && a.status == ApprovalStatus::Active
            })
            .map(|a| &a.id)
            .collect();
        assert_eq!(indexed, scan);
    }
    let filters: [(Option<&str>, Vec<OpState>); 4] = [
        (None, vec![]),
        (Some("c0"), vec![]),
        (
            None,
            vec![OpState::Pending, OpState::Approved, OpState::Pending],
        ),
        (Some("c1"), vec![OpState::Denied, OpState::Succeeded]),
    ];
    for (client, states) in &filters {
        let keep = |op: &&Operation| {
            client.is_none_or(|c| c == op.client_id)
                && (states.is_empty() || states.contains(&op.state))
        };
        let indexed: Vec<&str> = s
            .index
            .newest_first(*client, states)
            .filter_map(|(_, id)| s.get(id))
            .filter(keep)
            .take(3)
            .map(|op| op.id.as_str())
            .collect();
        let mut all: Vec<&Operation> = s.operations.values().map(|o| &**o).filter(keep).collect();
        all.sort_by(|a, b| (b.created_at_ms, &b.id).cmp(&(a.created_at_ms, &a.id)));
        let scan: Vec<&str> = all.into_iter().take(3).map(|op| op.id.as_str()).collect();
        assert_eq!(indexed, scan, "list {client:?} {states:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn prop_indexed_answers_equal_the_full_scan(steps in proptest::collection::vec(step(), 1..60)) {
        let mut s = crate::operations::state::tests::sealed_state();
        let mut out = vec![];
        for st in &steps {
            if let Some((kind, payload)) = record(&s, st) {
                let _ = s.apply_record(&kind, &payload, &mut out);
            }
            let rebuilt = derive(&s.operations, &s.approvals);
            prop_assert_eq!(&s.index, &rebuilt.index);
            prop_assert_eq!(&s.terminal, &rebuilt.terminal);
            prop_assert_eq!(&s.by_key, &rebuilt.by_key);
            check_queries(&s);
        }
        // A snapshot round trip rebuilds the same index, terminal set and keys.
        let back: OperationState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        prop_assert_eq!(&back.index, &s.index);
        prop_assert_eq!(&back.terminal, &s.terminal);
        prop_assert_eq!(&back.by_key, &s.by_key);
        prop_assert_eq!(&back.operations, &s.operations);
        prop_assert_eq!(&back.approvals, &s.approvals);
    }
}

/// Enough operations that a rebuild derives on two threads and a snapshot holds several
/// chunks: both equal what the folds built one record at a time.
#[test]
fn a_large_state_rebuilds_on_several_threads_what_its_folds_built() {
    let mut s = OperationState::default();
    let mut out = vec![];
    let n = DERIVE_IN_PARALLEL_FROM + super::compact::CHUNK + 7;
    for i in 0..n {
        let st = Step::Create {
            op: 0,
            kind: (i % 4) as u8,
            client: (i % 2) as u8,
            at: (i % 5) as u8,
            ap: 0,
            window: i % 3 == 0,
            expires: (i % 1999) as u16,
        };
        // Approved operations name an approval made earlier (some of them windows).
        let ap = if i % 4 == 1 { i.saturating_sub(3) } else { i };
        let (kind, payload) = create_as(&s, &st, i, ap).expect("a create");
        s.apply_record(&kind, &payload, &mut out).expect("folds");
    }
    // Some window approvals granted, so that clients hold active windows.
    let windows: Vec<(String, u64)> = s
        .approvals
        .values()
        .filter(|a| a.mode == GrantMode::Window)
        .take(150)
        .map(|a| (a.id.clone(), a.revision))
        .collect();
    for (id, revision) in windows {
        let v = decided(&id, revision + 1, DecisionKind::Approve);
        s.apply_record(KIND_DECIDED, &v, &mut out).expect("folds");
    }
    assert_eq!(s.operations.len(), n);
    assert!(s.index.deadlines.len() > 100 && s.terminal.len() > 100);
    assert!(s.index.windows.values().map(|w| w.len()).sum::<usize>() > 100);
    let rebuilt = derive(&s.operations, &s.approvals);
    assert_eq!(rebuilt.index, s.index);
    assert_eq!(rebuilt.terminal, s.terminal);
    assert_eq!(rebuilt.by_key, s.by_key);
    let back: OperationState =
        serde_json::from_str(&serde_json::to_string(&s).expect("encodes")).expect("decodes");
    assert_eq!(back.operations, s.operations);
    assert_eq!(back.index, s.index);
    assert_eq!(back.terminal, s.terminal);
    assert_eq!(back.by_key, s.by_key);
}
