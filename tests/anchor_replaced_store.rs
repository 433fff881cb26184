//! Attacks on the anchor through the journal's identity and through the operator's recovery,
//! by the agent of `anchor_attacks` (its tools: `common::forge`): a `store.created` record
//! rewritten to declare its workspace id twice (a struct decoder finds none) or another id
//! of the agent's choosing, and a rollback the operator then accepts with `gaffer store
//! reanchor`. The primary assertion is always that the side effect did not happen; the
//! detection tests also want `store verify` and `gaffer/status` to report the rollback
//! (before the per-path record of the workspace id they said "empty" / "intact", and before
//! trust versions survived a reanchor, v1 was enforced again).

mod common;

use common::Server;
use common::forge::*;
use common::gate::*;
use serde_json::json;

/// A connection without a client token (anonymous): the agent's credential names the
/// workspace id, which the rewritten journal no longer declares.
fn anon(env: &Env) -> Server {
    let mut s = env.start(&[]);
    s.call("initialize", json!({"clientInfo": {"name": "anon"}}));
    s.notify("initialized", json!({}));
    s
}

/// The `store.created` record (seq 1) rewritten so its payload names `workspace_id` twice.
/// `declared_workspace_id` decodes a struct, which refuses a duplicate field: the journal
/// declares no workspace id at all.
fn duplicate_the_workspace_id(recs: &mut [Rec]) {
    let r = &mut recs[0];
    assert_eq!(r.kind(), "store.created");
    let text = String::from_utf8(r.body.clone()).unwrap();
    let id = r.payload()["workspace_id"].as_str().unwrap().to_string();
    let needle = "\"kind\":\"store.created\",\"payload\":{";
    assert!(text.contains(needle), "{text}");
    let edited = text.replacen(needle, &format!("{needle}\"workspace_id\":\"{id}\","), 1);
    r.body = edited.into_bytes();
}

/// (1)+(2): a one-use approval ran. The agent cuts the journal back before the claim AND
/// gives `store.created` a duplicate `workspace_id` key, re-chaining everything from seq 1:
/// the journal declares no workspace id. The plan must not run again.
#[test]
fn a_duplicate_workspace_id_key_with_a_cut_before_the_claim_does_not_rerun_the_approval() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let (a, id, _aid) = one_use_approval_ran_once(&env);
    drop(a);
    let seg = the_segment(env.root());
    let claim = seg.find("claim", |kind, p| {
        kind == "operation.transitioned" && p["id"] == id.as_str() && p["to"] == "executing"
    });
    let cut = seg.batch_start(claim);
    let mut recs = seg.recs[..cut].to_vec();
    duplicate_the_workspace_id(&mut recs);
    write_rechained(&seg, &recs);
    let mut b = anon(&env);
    watch(|| kv_log(env.root()) >= 2 || is_terminal(state_of(&mut b, &id).as_deref()));
    let st = b.call("gaffer/status", json!({}));
    let v = b.request("operations/get", json!({ "id": id }));
    let (code, text) = verify(&env);
    eprintln!("status {st}\nop {v}\nstore verify: exit {code}\n{text}");
    assert_eq!(
        kv_log(env.root()),
        1,
        "the one-use approval ran again in a journal without a decodable workspace id: {v}"
    );
}

/// (1): trust v1 (docs allowed) then v2 (docs denied). The agent removes v2's record,
/// duplicates the `workspace_id` key and re-chains from seq 1, and puts v1 on disk.
#[test]
fn a_duplicate_workspace_id_key_with_the_newest_trust_removed_does_not_restore_the_old_policy() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let v1 = trust_v1_then_v2(&env);
    let seg = the_segment(env.root());
    let v2 = seg.find("policy v2 trust", |kind, p| {
        kind == "trust.signed" && p["file"] == "policy.yaml" && trust_version(p) == Some(2)
    });
    let mut recs = seg.recs.clone();
    let gone = recs.remove(v2);
    if gone.first && !gone.last {
        recs[v2].first = true;
    }
    if gone.last && !gone.first {
        recs[v2 - 1].last = true;
    }
    duplicate_the_workspace_id(&mut recs);
    write_rechained(&seg, &recs);
    std::fs::write(env.root().join(".gaffer/policy.yaml"), &v1).unwrap();
    let mut b = anon(&env);
    let st = b.call("gaffer/status", json!({}));
    eprintln!("after the rewrite: {st}");
    let landed = write_lands(&env, &mut b, "docs/b.md", "after-dup-id");
    let (code, text) = verify(&env);
    eprintln!("store verify: exit {code}\n{text}");
    assert!(
        !landed,
        "v1 was enforced again after a duplicate workspace_id key"
    );
}

/// (1), detection only: the same rewrite must still be told as a rollback (the anchored head
/// is not reached), by `gaffer store verify` and `gaffer/status`.
#[test]
fn a_duplicate_workspace_id_key_does_not_hide_a_rollback() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let (a, id, _aid) = one_use_approval_ran_once(&env);
    drop(a);
    let seg = the_segment(env.root());
    let claim = seg.find("claim", |kind, p| {
        kind == "operation.transitioned" && p["id"] == id.as_str() && p["to"] == "executing"
    });
    let cut = seg.batch_start(claim);
    let mut recs = seg.recs[..cut].to_vec();
    duplicate_the_workspace_id(&mut recs);
    write_rechained(&seg, &recs);
    let mut b = anon(&env);
    let st = b.call("gaffer/status", json!({}));
    let (code, text) = verify(&env);
    eprintln!("status {st}\nstore verify: exit {code}\n{text}");
    assert!(
        code != 0 && text.to_lowercase().contains("rolled back"),
        "a journal cut behind its anchored head is not reported as rolled back once its \
         store.created names workspace_id twice: exit {code}\n{text}\nstatus {st}"
    );
}

/// (3): the agent turns `gaffer store reanchor` against the operator. Trust v1 (docs
/// allowed), then v2 (docs denied). The agent removes v2's record (re-chained) and puts v1 on
/// disk: the store stands rolled back, nothing executes. The operator's only way out is
/// `gaffer store reanchor`; the trust version this machine verified (2) must survive it, so
/// v1 is not enforced again without a new signature. A docs write must not land.
#[test]
fn reanchoring_a_store_rolled_back_past_a_trust_does_not_restore_the_old_policy() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let v1 = trust_v1_then_v2(&env);
    let seg = the_segment(env.root());
    let v2 = seg.find("policy v2 trust", |kind, p| {
        kind == "trust.signed" && p["file"] == "policy.yaml" && trust_version(p) == Some(2)
    });
    let mut recs = seg.recs.clone();
    let gone = recs.remove(v2);
    if gone.first && !gone.last {
        recs[v2].first = true;
    }
    if gone.last && !gone.first {
        recs[v2 - 1].last = true;
    }
    write_rechained(&seg, &recs);
    std::fs::write(env.root().join(".gaffer/policy.yaml"), &v1).unwrap();
    let (code, out, err) = env.cli(&["store", "reanchor"]);
    eprintln!("reanchor: {code} {out}{err}");
    assert_eq!(code, 0, "the operator accepts the store: {out}{err}");
    let mut b = env.agent("agent-1");
    let st = b.call("gaffer/status", json!({}));
    eprintln!("after reanchor: {st}");
    let landed = write_lands(&env, &mut b, "docs/after-reanchor.md", "after-reanchor");
    assert!(
        !landed,
        "after the operator reanchored a store the agent rolled back past trust v2, the agent's \
         restored v1 was enforced (docs write landed) though the operator never trusted it again"
    );
}

/// `store.created` rewritten to declare another workspace id of the agent's choosing.
fn swap_the_workspace_id(recs: &mut [Rec]) {
    let r = &mut recs[0];
    let text = String::from_utf8(r.body.clone()).unwrap();
    let id = r.payload()["workspace_id"].as_str().unwrap().to_string();
    r.body = text
        .replacen(&id, "ws_chosen_by_the_agent00", 1)
        .into_bytes();
}

/// (2)/(6): the journal cut back before the claim and re-chained from seq 1 under a fresh
/// workspace id: its anchor and ledger are new, but the path's record of the id it held tells
/// the replacement. Side effect: the used approval must not run again (its signature names the
/// old id).
#[test]
fn a_swapped_workspace_id_with_a_cut_before_the_claim_does_not_rerun_the_approval() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let (a, id, _aid) = one_use_approval_ran_once(&env);
    drop(a);
    let seg = the_segment(env.root());
    let claim = seg.find("claim", |kind, p| {
        kind == "operation.transitioned" && p["id"] == id.as_str() && p["to"] == "executing"
    });
    let cut = seg.batch_start(claim);
    let mut recs = seg.recs[..cut].to_vec();
    swap_the_workspace_id(&mut recs);
    write_rechained(&seg, &recs);
    let mut b = anon(&env);
    watch(|| kv_log(env.root()) >= 2 || is_terminal(state_of(&mut b, &id).as_deref()));
    let st = b.call("gaffer/status", json!({}));
    let v = b.request("operations/get", json!({ "id": id }));
    let (code, text) = verify(&env);
    eprintln!("status {st}\nop {v}\nstore verify: exit {code}\n{text}");
    assert_eq!(kv_log(env.root()), 1, "the approval ran again: {v}");
}

/// Detection only: the same rewrite under a swapped id must still be told as a rollback.
#[test]
fn a_swapped_workspace_id_does_not_hide_a_rollback() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let (a, id, _aid) = one_use_approval_ran_once(&env);
    drop(a);
    let seg = the_segment(env.root());
    let claim = seg.find("claim", |kind, p| {
        kind == "operation.transitioned" && p["id"] == id.as_str() && p["to"] == "executing"
    });
    let cut = seg.batch_start(claim);
    let mut recs = seg.recs[..cut].to_vec();
    swap_the_workspace_id(&mut recs);
    write_rechained(&seg, &recs);
    let mut b = anon(&env);
    let st = b.call("gaffer/status", json!({}));
    let (code, text) = verify(&env);
    eprintln!("status {st}\nstore verify: exit {code}\n{text}");
    assert!(
        code != 0 && text.to_lowercase().contains("rolled back"),
        "a journal cut behind its anchored head and re-declared under a new workspace id is \
         adopted as intact: exit {code}\n{text}\nstatus {st}"
    );
}
