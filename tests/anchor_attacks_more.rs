//! More attacks on the anchor, from a review, by the same agent as in `anchor_attacks` (its
//! tools: `common::forge`): a record overwritten behind the anchored head, forged records
//! that crowd out or outrank genuine ones, a copy of the workspace, window approvals whose
//! uses and revocations the journal forgets, a revocation made while the store stands rolled
//! back. The primary assertion is always that the side effect did not happen (a line in
//! `kv-exec.log`, a written file).

mod common;

use common::Server;
use common::forge::*;
use common::gate::*;
use serde_json::{Value, json};

// ---- a record overwritten behind the anchored head ----

/// The operator trusted v1 (docs/ allowed) and a docs write ran under it, then trusted v2
/// (docs/ denied) with `gaffer trust`, which signs `policy.yaml` and `providers.yaml` in one
/// batch: the anchored head is the providers record, after policy v2's, and no process checks
/// the policy before the attack. The agent overwrites policy v2's record in place with a copy
/// of v1's (same seq and prev, valid crc; every later byte as it was, the anchored head
/// included) and puts v1's bytes back on disk. A docs/ write must not run (it did before the
/// anchor judged a chain break before its head a rollback: v1 was enforced again).
#[test]
fn a_trust_record_overwritten_before_the_anchored_head_does_not_restore_the_old_policy() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let (v1, a) = a_docs_write_under_v1(&env);
    drop(a);
    trust_v2(&env, &v1);
    let seg = the_segment(env.root());
    let v2 = seg.find("policy v2 trust", |kind, p| {
        kind == "trust.signed" && p["file"] == "policy.yaml" && trust_version(p) == Some(2)
    });
    let v1_rec = seg.find("policy v1 trust", |kind, p| {
        kind == "trust.signed" && p["file"] == "policy.yaml" && trust_version(p) == Some(1)
    });
    assert!(v2 + 1 < seg.recs.len(), "a record (providers v2) follows");
    assert_eq!(seg.recs[v2 + 1].kind(), "trust.signed");
    let (code, text) = verify(&env);
    assert_eq!(code, 0, "control: the genuine journal verifies:\n{text}");
    replace_in_place(&seg, v2, "trust.signed", &seg.recs[v1_rec].raw_payload());
    std::fs::write(env.root().join(".gaffer/policy.yaml"), &v1).unwrap();
    let mut b = env.agent("agent-1");
    let st = b.call("gaffer/status", json!({}));
    eprintln!(
        "after the overwrite: store {}\ntrust {}",
        st["store"], st["trust"]
    );
    let landed = write_lands(&env, &mut b, "docs/after.md", "after-overwrite");
    let (code, text) = verify(&env);
    eprintln!("store verify: exit {code}\n{text}");
    assert!(
        !landed,
        "a write the trusted policy (v2) denies ran after v2's record was overwritten before \
         the anchored head (the anchor judged the store intact)"
    );
}

// ---- forged records that crowd out or outrank genuine ones ----

/// The agent reads its own credential id from its token and appends 8 forged `client.revoked`
/// records of it (invalid signatures), as many as gaffer keeps per credential; the operator
/// then revokes agent-1 with `gaffer client revoke`. The revoked token must neither
/// authenticate nor write under the rule naming agent-1 (it did both before a flooded
/// credential counted as revoked: the genuine revocation was dropped).
#[test]
fn forged_revocations_do_not_crowd_out_the_operators_client_revocation() {
    anchor_outside_the_workspace();
    let policy = format!(
        "{ALLOW_DOCS}  - id: agent1-notes\n    effect: allow\n    clients: [agent-1]\n    \
         operations: [\"file.write\"]\n    targets:\n      - kind: file\n        fields:\n          \
         path: [\"notes/**\"]\n"
    );
    let env = Env::new(Some(&policy));
    let token = env.token("agent-1");
    {
        let mut a = env.agent("agent-1");
        assert!(
            write_lands(&env, &mut a, "notes/before.md", "before"),
            "control: agent-1's rule lets it write notes/"
        );
    }
    let cid = credential_id(&token);
    flood_client_revocations(env.root(), &cid, 8);
    // A flooded credential is refused already (fail closed); the operator's revoke still signs
    // a revocation and records it on the anchor, whatever the agent's records say.
    let (code, out, err) = env.cli(&["client", "revoke", "agent-1"]);
    assert_eq!(code, 0, "gaffer client revoke: {out}{err}");
    let done: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(done["signed"], json!([cid]), "{done}");
    let (_, listed, _) = env.cli(&["client", "list"]);
    eprintln!("after the revocation: {listed}");
    let mut s = env.start(&[]);
    let init = s.request(
        "initialize",
        json!({"clientInfo": {"name": "agent-1"}, "initializationOptions": {"clientToken": token}}),
    );
    eprintln!("initialize with the revoked token: {init}");
    let accepted = init.get("error").is_none();
    let landed = accepted && {
        s.notify("initialized", json!({}));
        write_lands(&env, &mut s, "notes/after.md", "after")
    };
    assert!(
        !accepted && !landed,
        "a credential the operator revoked still authenticates (accepted {accepted}) and \
         writes under its rule (written {landed}): {init}"
    );
}

/// The operator trusted v1, then v2 (docs/ denied), and a check enforced v2. The agent appends
/// 16 forged `trust.signed` records for `policy.yaml` claiming versions 1000 and up (invalid
/// signatures), enough to push both genuine ones out of those gaffer keeps, and puts v1's
/// bytes back on disk. v1 must not be enforced: a docs/ write must not run, and
/// `policy.yaml` must stand rolled back (everything refused).
#[test]
fn forged_high_version_trust_records_fail_closed() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let v1 = trust_v1_then_v2(&env);
    let seg = the_segment(env.root());
    let v2 = seg.find("policy v2 trust", |kind, p| {
        kind == "trust.signed" && p["file"] == "policy.yaml" && trust_version(p) == Some(2)
    });
    let mut genuine = seg.recs[v2].payload();
    let flood: Vec<(&str, Vec<u8>)> = (0..16)
        .map(|n| {
            let text = genuine["operator_signature"]["payload"].as_str().unwrap();
            let mut p: Value = serde_json::from_str(text).unwrap();
            p["version"] = json!(1000 + n);
            genuine["operator_signature"]["payload"] = json!(p.to_string());
            ("trust.signed", genuine.to_string().into_bytes())
        })
        .collect();
    append_chained(env.root(), &flood);
    std::fs::write(env.root().join(".gaffer/policy.yaml"), &v1).unwrap();
    let mut b = env.agent("agent-1");
    let st = b.call("gaffer/status", json!({}));
    eprintln!("trust after the flood: {}", st["trust"]);
    assert!(
        !write_lands(&env, &mut b, "docs/flood.md", "flood"),
        "a write the trusted policy (v2) denies ran after forged high-version records"
    );
    let shown = st["trust"].to_string();
    assert!(
        shown.contains("rolled_back"),
        "policy.yaml must stand rolled back (everything refused): {shown}"
    );
}

// ---- a copy of the workspace ----

/// A one-use approval ran its `kv.set`; the workspace is then copied (`cp -a`, as an operator
/// does to try something on a copy; a `mv` is the same). After gaffer's prune in the copy,
/// the agent's re-creation must not run the plan again there (it did before the anchor's
/// ledger was keyed by workspace id alone: the copy had an empty anchor).
#[test]
fn a_used_approval_does_not_run_again_in_a_copy_of_the_workspace() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let (a, id, aid) = one_use_approval_ran_once(&env);
    drop(a);
    let token = env.token("agent-1");
    let copy_parent = tempfile::tempdir().unwrap();
    let copy = copy_parent.path().join("ws-copy");
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(env.root())
        .arg(&copy)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(kv_log(&copy), 1, "the copy has the one line");
    let key = env.key_file.display().to_string();
    let start = |extra: &[(&str, &str)]| {
        let mut vars = vec![("GAFFER_OPERATOR_KEY_FILE", key.as_str())];
        vars.extend_from_slice(extra);
        let mut b = Server::start_env(&copy, common::Wire::Ndjson, &[], &vars);
        b.call(
            "initialize",
            json!({"clientInfo": {"name": "agent-1"}, "initializationOptions": {"clientToken": token}}),
        );
        b.notify("initialized", json!({}));
        b
    };
    // gaffer prunes in the copy (with the copy's own seal), then the agent re-creates there.
    prune_and_recreate_used(&copy, start, &id, &aid);
    let mut b = start(&[]);
    watch_the_recreated(&copy, &mut b, &id);
    let v = b.request("operations/get", json!({ "id": id }));
    assert_eq!(
        kv_log(&copy),
        1,
        "a used one-use approval ran again in a copy of the workspace: {v}"
    );
}

// ---- window approvals: uses and revocations outlive the journal ----

const WINDOW: &str = r#"
rules:
  - id: window
    effect: request
    operations: ["kv.set"]
    grant_policy: {mode: window, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10, default_max_uses: 2, max_uses: 3}
"#;

/// A window approval (2 uses) granted on the first `kv.set` of key `shared`, which ran;
/// returns (agent, first operation id, approval id).
fn window_used_once(env: &Env) -> (Server, String, String) {
    let mut a = env.agent("agent-1");
    let first = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "shared"}),
        json!({"value": 1}),
        "w1",
    ))
    .clone();
    assert_eq!(first["state"], "pending");
    let id = first["id"].as_str().unwrap().to_string();
    let (code, out, err) = env.approve_reviewed(&id, &[]);
    assert_eq!(code, 0, "gaffer approve: {out}{err}");
    let v = wait_state(&mut a, &id, &["succeeded", "failed"]);
    assert_eq!(v["state"], "succeeded", "{v}");
    let aid = v["approval_id"].as_str().unwrap().to_string();
    (a, id, aid)
}

/// Submits one more `kv.set` of `shared` and waits until it ran or ended (or `WATCH`).
fn one_more_use(env: &Env, a: &mut Server, key: &str) -> Value {
    let ran = kv_log(env.root());
    let p = submit(
        a,
        "kv.set",
        json!({"key": "shared"}),
        json!({"value": 9}),
        key,
    );
    eprintln!("one more use: {p}");
    if let Some(id) = p["result"]["id"].as_str() {
        let id = id.to_string();
        watch(|| kv_log(env.root()) > ran || is_terminal(state_of(a, &id).as_deref()));
        let v = a.request("operations/get", json!({ "id": id }));
        eprintln!(
            "the further use ended: {} {}",
            v["result"]["state"], v["result"]["error"]
        );
        return v;
    }
    p
}

/// Both uses of a window approval ran. After gaffer's prune, the agent's re-creation brings the
/// approval back active with no use in the journal; a further matching `kv.set` must not run.
#[test]
fn a_window_approval_gets_no_use_beyond_its_max_after_its_uses_are_forgotten() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(WINDOW));
    let (mut a, id, aid) = window_used_once(&env);
    let second = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "shared"}),
        json!({"value": 2}),
        "w2",
    ))
    .clone();
    assert_eq!(second["approval_id"], aid.as_str(), "{second}");
    let v = wait_state(
        &mut a,
        second["id"].as_str().unwrap(),
        &["succeeded", "failed"],
    );
    assert_eq!(v["state"], "succeeded", "{v}");
    assert_eq!(kv_log(env.root()), 2, "both uses ran");
    prune_and_recreate_used(
        env.root(),
        |extra| env.agent_env("agent-1", extra),
        &id,
        &aid,
    );
    let v = one_more_use(&env, &mut a, "w3");
    let log = kv_log(env.root());
    assert_eq!(log, 2, "a window approval of 2 uses ran a third time: {v}");
}

/// A window approval (2 uses) ran once; the operator revokes it with `gaffer revoke` (another
/// process than the serving one). After gaffer's prune, the agent's re-creation brings it back
/// active; a further matching `kv.set` must not run.
#[test]
fn a_window_approval_revoked_with_the_cli_stays_revoked_after_a_forged_recreation() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(WINDOW));
    let (mut a, id, aid) = window_used_once(&env);
    let (code, out, err) = env.cli(&["revoke", &aid]);
    assert_eq!(code, 0, "gaffer revoke: {out}{err}");
    prune_and_recreate_used(
        env.root(),
        |extra| env.agent_env("agent-1", extra),
        &id,
        &aid,
    );
    let v = one_more_use(&env, &mut a, "w2");
    let log = kv_log(env.root());
    assert_eq!(log, 1, "a revoked window approval ran again: {v}");
}

/// The same, revoked through a serving operator connection (`approvals/revoke`).
#[test]
fn a_window_approval_revoked_by_a_server_stays_revoked_after_a_forged_recreation() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(WINDOW));
    let (mut a, id, aid) = window_used_once(&env);
    {
        let mut op = env.operator();
        let r = env.revoke_ok(&mut op, &json!(aid));
        eprintln!("revoked: {r}");
    }
    prune_and_recreate_used(
        env.root(),
        |extra| env.agent_env("agent-1", extra),
        &id,
        &aid,
    );
    let v = one_more_use(&env, &mut a, "w2");
    let log = kv_log(env.root());
    assert_eq!(log, 1, "a revoked window approval ran again: {v}");
}

/// A window approval (2 uses) ran once. The agent cuts the journal's last batch (a harmless
/// pending request), so the store stands rolled back; the operator revokes the approval with
/// `gaffer revoke`, then accepts the store (`gaffer store reanchor`). After gaffer's prune, the
/// agent's re-creation brings the approval back active; a further matching `kv.set` must not run
/// (it did before revocations were anchored whatever the store's standing).
#[test]
fn a_revocation_made_while_the_store_stands_rolled_back_still_holds_after_reanchor() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(WINDOW));
    let (mut a, id, aid) = window_used_once(&env);
    let other = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "other"}),
        json!({"value": 1}),
        "harmless",
    ))
    .clone();
    assert_eq!(other["state"], "pending", "{other}");
    drop(a);
    let seg = the_segment(env.root());
    let created = seg.find("harmless request", |kind, p| {
        kind == "operation.created" && p["operation"]["id"] == other["id"]
    });
    seg.cut_before(seg.batch_start(created));
    let (code, text) = verify(&env);
    assert_ne!(code, 0, "control: the cut is seen as a rollback:\n{text}");
    let (code, out, err) = env.cli(&["revoke", &aid]);
    eprintln!("gaffer revoke on the rolled-back store: exit {code}\n{out}{err}");
    assert_eq!(code, 0, "gaffer revoke: {out}{err}");
    let (code, out, err) = env.cli(&["store", "reanchor"]);
    assert_eq!(code, 0, "gaffer store reanchor: {out}{err}");
    prune_and_recreate_used(
        env.root(),
        |extra| env.agent_env("agent-1", extra),
        &id,
        &aid,
    );
    let mut b = env.agent("agent-1");
    let v = one_more_use(&env, &mut b, "w2");
    let log = kv_log(env.root());
    assert_eq!(
        log, 1,
        "a window approval revoked while the store stood rolled back ran again: {v}"
    );
}
