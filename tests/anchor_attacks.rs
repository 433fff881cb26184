//! Rollback and replay attacks on the store, played end to end on the real binary by an agent
//! that can write every file of the workspace, `.gaffer/` included, and nothing outside it
//! (its tools: `common::forge`).
//!
//! Each attack rewrites facts that authority is folded from (an approval's uses and status, an
//! operation's state, the set of trust signatures of `policy.yaml`) so that every record still
//! has a valid crc and every link of the hash chain holds: a snapshot with its `state_sha256`
//! recomputed, a journal cut back at a batch boundary, a journal with a record removed and
//! every later one re-chained, records appended after the head. The primary assertion is
//! always that the side effect did not happen (a line in `kv-exec.log`, a file under `docs/`).
//!
//! What refuses them is the anchor gaffer keeps outside the workspace (`GAFFER_STATE_DIR`):
//! the journal head after each commit, the headers of the snapshots gaffer wrote, the ledger
//! of approval uses and the highest trusted version per file. Without it every attack here
//! succeeds. More attacks on the anchor itself: `anchor_attacks_more`.

mod common;

use common::forge::*;
use common::gate::*;
use serde_json::{Value, json};

// ---- forged snapshots ----

/// Every array whose first element is `id` (an operation in the snapshot's compact form,
/// `src/operations/compact.rs`) and every object whose `id` is `aid` (the approval),
/// rewritten to "approved, never used".
fn rewind(v: &mut Value, id: &str, aid: &str, plan: &Value) {
    // Positions in the compact form.
    const STATE: usize = 9;
    const TERMINAL_AT: usize = 14;
    const PLAN: usize = 18;
    const RESULT_TO_EXECUTOR: [usize; 4] = [19, 20, 21, 22];
    match v {
        Value::Array(a) => {
            if a.len() == 23 && a[0] == id {
                a[STATE] = json!("approved");
                a[TERMINAL_AT] = Value::Null;
                for i in RESULT_TO_EXECUTOR {
                    a[i] = Value::Null;
                }
                // A terminal operation's entry drops its plan; the journal has it.
                a[PLAN] = plan.clone();
                return;
            }
            for x in a {
                rewind(x, id, aid, plan);
            }
        }
        Value::Object(o) => {
            if o.get("id").and_then(Value::as_str) == Some(aid) && o.contains_key("uses") {
                o.insert("uses".into(), json!({}));
                o.insert("status".into(), json!("active"));
                return;
            }
            for (_, x) in o.iter_mut() {
                rewind(x, id, aid, plan);
            }
        }
        _ => {}
    }
}

/// Rewrites `.gaffer/snapshot.json`'s state with `edit` and recomputes `state_sha256`, as
/// anyone can.
fn forge_snapshot(env: &Env, edit: impl FnOnce(&mut Value)) {
    let path = env.root().join(".gaffer/snapshot.json");
    let mut snap: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let before = snap["state"].clone();
    edit(&mut snap["state"]);
    assert_ne!(before, snap["state"], "the edit changed the state");
    let state = serde_json::to_vec(&snap["state"]).unwrap();
    snap["state_sha256"] = json!(gaffer::util::sha256_hex(&state));
    std::fs::write(&path, serde_json::to_vec(&snap).unwrap()).unwrap();
}

/// A one-use approval ran its `kv.set` and gaffer wrote a snapshot. The agent edits the
/// snapshot's state back to "operation approved, approval active and unused" and recomputes
/// `state_sha256`. The next serving process must not run the plan again (it did before the
/// anchor).
#[test]
fn a_forged_snapshot_does_not_replay_a_used_one_use_approval() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let (a, id, aid) = one_use_approval_ran_once(&env);
    drop(a);
    let (code, out, err) = env.cli(&["store", "compact"]);
    assert_eq!(code, 0, "gaffer store compact: {out}{err}");
    // Control: a restart on gaffer's own snapshot sees the operation done and runs nothing.
    {
        let mut b = env.agent("agent-1");
        let state = state_of(&mut b, &id);
        assert_eq!(
            state.as_deref(),
            Some("succeeded"),
            "control: genuine snapshot"
        );
    }
    assert_eq!(
        kv_log(env.root()),
        1,
        "control: a restart runs nothing again"
    );
    // The plan text, which a terminal operation's snapshot entry no longer holds.
    let (code, log, err) = env.cli(&["store", "log", "--kind", "operation.created"]);
    assert_eq!(code, 0, "{err}");
    let plan = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["payload"]["operation"]["id"] == id.as_str())
        .expect("the operation.created record")["payload"]["operation"]["plan"]
        .clone();
    assert!(plan.is_string(), "the plan text: {plan}");
    forge_snapshot(&env, |state| rewind(state, &id, &aid, &plan));
    // The next serving process (an editor restart) recovers "approved" work.
    let mut b = env.agent("agent-1");
    watch(|| kv_log(env.root()) >= 2 || state_of(&mut b, &id).as_deref() == Some("succeeded"));
    let v = b.request("operations/get", json!({ "id": id }));
    let (code, text) = verify(&env);
    eprintln!("after the forged snapshot: {v}\nstore verify: exit {code}\n{text}");
    assert_eq!(
        kv_log(env.root()),
        1,
        "an approval of one use ran its plan again from a forged snapshot: {v}"
    );
}

/// The operator trusted v1 (docs/ allowed), then v2 (docs/ denied), and gaffer wrote a
/// snapshot. The agent removes v2's signature from the snapshot's trust state, recomputes
/// `state_sha256` and puts v1's bytes back on disk. A docs/ write must not run (it did before
/// the anchor: v1 was enforced again).
#[test]
fn a_forged_snapshot_does_not_drop_the_newest_trust_signature() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let v1 = trust_v1_then_v2(&env);
    let (code, out, err) = env.cli(&["store", "compact"]);
    assert_eq!(code, 0, "gaffer store compact: {out}{err}");
    forge_snapshot(&env, |state| {
        let shown = state["trust"].to_string();
        let sigs = state["trust"]["files"]["policy.yaml"]
            .as_array_mut()
            .unwrap_or_else(|| panic!("trust files: {shown}"));
        assert_eq!(sigs.len(), 2, "v1 and v2: {shown}");
        sigs.pop();
    });
    std::fs::write(env.root().join(".gaffer/policy.yaml"), &v1).unwrap();
    let mut b = env.agent("agent-1");
    let st = b.call("gaffer/status", json!({}));
    eprintln!("trust after the forged snapshot: {}", st["trust"]);
    assert!(
        !write_lands(&env, &mut b, "docs/b.md", "after-forgery"),
        "a write the trusted policy (v2) denies ran under the replaced v1"
    );
}

// ---- journals cut back or rewritten ----

/// `gaffer store verify` refuses the store and says it was rolled back.
fn assert_verify_reports_rollback(env: &Env) {
    let (code, text) = verify(env);
    assert_ne!(
        code, 0,
        "store verify accepts a rolled-back journal:\n{text}"
    );
    assert!(
        text.to_lowercase().contains("rolled back"),
        "store verify does not say the journal was rolled back:\n{text}"
    );
}

/// A one-use approval ran its `kv.set`. The agent cuts the journal back to the batch boundary
/// before the claim (`approved -> executing`): every link holds, and the journal ends with the
/// operation `approved` and the approval unused. A restarted server must not run the plan
/// again (it did before the anchor), and `gaffer store verify` must report a rollback.
#[test]
fn a_journal_cut_back_before_the_claim_does_not_run_the_approval_again() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let (a, id, _aid) = one_use_approval_ran_once(&env);
    drop(a);
    assert!(
        !env.root().join(".gaffer/snapshot.json").exists(),
        "the journal alone holds the state"
    );
    let (code, text) = verify(&env);
    assert_eq!(code, 0, "control: the genuine journal verifies:\n{text}");
    // The claim and the batch it was appended in.
    let seg = the_segment(env.root());
    let claim = seg.find("claim", |kind, p| {
        kind == "operation.transitioned" && p["id"] == id.as_str() && p["to"] == "executing"
    });
    let cut = seg.batch_start(claim);
    assert!(seg.recs[cut - 1].last, "the cut falls between two batches");
    let last_move = seg.recs[..cut]
        .iter()
        .rfind(|r| r.kind() == "operation.transitioned" && r.payload()["id"] == id.as_str())
        .expect("the operation's transitions")
        .payload();
    assert_eq!(last_move["to"], "approved", "the cut journal ends approved");
    seg.cut_before(cut);
    // The editor restarts.
    let mut b = env.agent("agent-1");
    watch(|| kv_log(env.root()) >= 2 || is_terminal(state_of(&mut b, &id).as_deref()));
    let v = b.request("operations/get", json!({ "id": id }));
    let (code, text) = verify(&env);
    eprintln!("after the cut: {v}\nstore verify: exit {code}\n{text}");
    assert_eq!(
        kv_log(env.root()),
        1,
        "a journal cut back before the claim ran the one-use approval again: {v}"
    );
    assert_verify_reports_rollback(&env);
}

/// The operator trusted v1 (docs/ allowed), then v2 (docs/ denied). The agent removes v2's
/// `trust.signed` record for `policy.yaml` from the middle of the journal, renumbers and
/// re-chains every later record (batch flags kept whole, valid crcs), and puts v1's bytes back
/// on disk. A docs/ write must not run (it did before the anchor: v1 was enforced again), and
/// `gaffer store verify` must report a rollback.
#[test]
fn a_journal_rewritten_without_the_newest_trust_record_does_not_restore_the_old_policy() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let v1 = trust_v1_then_v2(&env);
    let (code, text) = verify(&env);
    assert_eq!(code, 0, "control: the genuine journal verifies:\n{text}");
    let seg = the_segment(env.root());
    let v2 = seg.find("policy v2 trust", |kind, p| {
        kind == "trust.signed" && p["file"] == "policy.yaml" && trust_version(p) == Some(2)
    });
    assert!(
        v2 + 1 < seg.recs.len(),
        "records follow v2's: a middle record"
    );
    let mut recs = seg.recs.clone();
    let gone = recs.remove(v2);
    // Its batch stays whole: its neighbours take over the flags it had.
    if gone.first && !gone.last {
        recs[v2].first = true;
    }
    if gone.last && !gone.first {
        recs[v2 - 1].last = true;
    }
    write_rechained(&seg, &recs);
    std::fs::write(env.root().join(".gaffer/policy.yaml"), &v1).unwrap();
    let after = the_segment(env.root());
    assert_eq!(after.recs.len(), seg.recs.len() - 1, "one record fewer");
    let mut b = env.agent("agent-1");
    let st = b.call("gaffer/status", json!({}));
    eprintln!("after the rewrite: chain and trust {}", st);
    let landed = write_lands(&env, &mut b, "docs/b.md", "after-rewrite");
    let (code, text) = verify(&env);
    eprintln!("store verify: exit {code}\n{text}");
    assert!(
        !landed,
        "a write the trusted policy (v2) denies ran after v2's record was cut out of the journal"
    );
    assert_verify_reports_rollback(&env);
}

// ---- records appended after the head ----

/// A one-use approval ran its `kv.set`. While that serving process still runs, gaffer's
/// retention prunes everything finished (a prune the agent writes is skipped), and the agent
/// appends (chained, real framing) copies of the operation's genuine creation, decision and
/// approval. The serving process must not run the
/// plan again (it did before the anchor).
#[test]
fn a_forged_prune_and_recreate_does_not_rerun_a_used_approval_in_a_running_server() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let (mut a, id, aid) = one_use_approval_ran_once(&env);
    prune_and_recreate_used(
        env.root(),
        |extra| env.agent_env("agent-1", extra),
        &id,
        &aid,
    );
    watch_the_recreated(env.root(), &mut a, &id);
    let v = a.request("operations/get", json!({ "id": id }));
    assert_eq!(
        kv_log(env.root()),
        1,
        "a re-creation after a prune ran the one-use approval again in the serving process: {v}"
    );
}

/// The same records appended while no gaffer runs. A freshly started server must not run the
/// plan again (it did before the anchor, at startup recovery).
#[test]
fn a_forged_prune_and_recreate_does_not_rerun_a_used_approval_after_a_restart() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let (a, id, aid) = one_use_approval_ran_once(&env);
    drop(a);
    // Control: a restart without the forged records runs nothing again.
    {
        let mut b = env.agent("agent-1");
        assert_eq!(state_of(&mut b, &id).as_deref(), Some("succeeded"));
    }
    assert_eq!(
        kv_log(env.root()),
        1,
        "control: a restart runs nothing again"
    );
    prune_and_recreate_used(
        env.root(),
        |extra| env.agent_env("agent-1", extra),
        &id,
        &aid,
    );
    let mut b = env.agent("agent-1");
    watch_the_recreated(env.root(), &mut b, &id);
    let v = b.request("operations/get", json!({ "id": id }));
    assert_eq!(
        kv_log(env.root()),
        1,
        "a re-creation after a prune ran the one-use approval again after a restart: {v}"
    );
}

/// The operator trusted v1 (docs/ allowed), then v2 (docs/ denied). The agent appends copies
/// of v1's genuine `trust.signed` record (chained, real framing) and puts v1's bytes back on
/// disk: one copy (the control), then nineteen more, enough to push v2's signature out of the
/// 16 gaffer keeps per file. A docs/ write must not run after either (it did after the flood
/// before the anchor: v1 was enforced again).
#[test]
fn a_flood_of_old_trust_records_does_not_restore_the_old_policy() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let v1 = trust_v1_then_v2(&env);
    let seg = the_segment(env.root());
    let first = seg
        .recs
        .iter()
        .position(|r| r.kind() == "trust.signed" && r.payload()["file"] == "policy.yaml")
        .expect("v1's trust record");
    let v1_record = seg.recs[first].raw_payload();
    std::fs::write(env.root().join(".gaffer/policy.yaml"), &v1).unwrap();
    // Control: one replayed copy is refused (an older version than the latest).
    append_chained(env.root(), &[("trust.signed", v1_record.clone())]);
    {
        let mut b = env.agent("agent-1");
        assert!(
            !write_lands(&env, &mut b, "docs/one-copy.md", "one-copy"),
            "control: one replayed v1 record does not restore v1"
        );
    }
    let flood: Vec<(&str, Vec<u8>)> = (0..19)
        .map(|_| ("trust.signed", v1_record.clone()))
        .collect();
    append_chained(env.root(), &flood);
    let mut b = env.agent("agent-1");
    let st = b.call("gaffer/status", json!({}));
    eprintln!("trust after the flood: {}", st["trust"]);
    assert!(
        !write_lands(&env, &mut b, "docs/flood.md", "flood"),
        "a write the trusted policy (v2) denies ran after a flood of v1 trust records"
    );
}
