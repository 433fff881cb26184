//! End-to-end: the real binary, real providers, several processes on one workspace.

mod common;

use common::gate::*;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Server, Wire};
use serde_json::{Value, json};

#[test]
fn allow_rule_executes_immediately_and_replay_returns_the_same_operation() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut a = env.agent("agent-1");
    let r = submit(
        &mut a,
        "file.write",
        json!({"path": "docs/a.md"}),
        json!({"content": "hi"}),
        "k1",
    );
    let first = ok(&r).clone();
    assert_eq!(first["created"], true);
    let done = wait_state(
        &mut a,
        first["id"].as_str().unwrap(),
        &["succeeded", "failed"],
    );
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["result"]["bytes"], 2);
    assert!(done.get("approval_id").is_none());
    assert_eq!(
        std::fs::read_to_string(env.root().join("docs/a.md")).unwrap(),
        "hi"
    );
    // Replay (with a padded key): same id and revision, nothing re-run.
    let again = submit(
        &mut a,
        "file.write",
        json!({"path": "docs/a.md"}),
        json!({"content": "hi"}),
        "  k1 ",
    );
    let again = ok(&again);
    assert_eq!(again["created"], false);
    assert_eq!(again["id"], first["id"]);
    assert_eq!(again["revision"], done["revision"]);
    // Replay also survives a restart.
    drop(a);
    let mut b = env.agent("agent-1");
    let r = submit(
        &mut b,
        "file.write",
        json!({"path": "docs/a.md"}),
        json!({"content": "hi"}),
        "k1",
    );
    assert_eq!(ok(&r)["id"], first["id"]);
    assert_eq!(ok(&r)["revision"], done["revision"]);
    assert_eq!(ok(&r)["state"], "succeeded");
}

#[test]
fn idempotency_conflicts_and_token_exact_numbers() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut a = env.agent("agent-1");
    ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "n"}),
        json!({"value": 1}),
        "num",
    ));
    // 1 versus 1.0 is a different request.
    assert_eq!(
        err_code(&submit(
            &mut a,
            "kv.set",
            json!({"key": "n"}),
            json!({"value": 1.0}),
            "num"
        )),
        "idempotency_conflict"
    );
    assert_eq!(
        err_code(&submit(
            &mut a,
            "kv.set",
            json!({"key": "m"}),
            json!({"value": 1}),
            "num"
        )),
        "idempotency_conflict"
    );
    let r = a.request(
        "operations/submit",
        json!({"operation": "kv.set", "target": {"key": "n"}, "arguments": {"value": 1}, "reason": "other reason", "idempotency_key": "num"}),
    );
    assert_eq!(err_code(&r), "idempotency_conflict");
    // Key order and whitespace do not matter.
    let r = a.request(
        "operations/submit",
        json!({"reason": "needed for the task", "idempotency_key": "num", "arguments": {"value": 1}, "target": {"key": "n"}, "operation": "kv.set"}),
    );
    assert_eq!(ok(&r)["created"], false);
    // Idempotency is per client: another client may use the same key.
    let mut b = env.agent("agent-2");
    assert_eq!(
        ok(&submit(
            &mut b,
            "kv.set",
            json!({"key": "n"}),
            json!({"value": 2}),
            "num"
        ))["created"],
        true
    );
}

#[test]
fn deny_and_no_match_end_denied_and_nothing_runs() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut a = env.agent("agent-1");
    let d = ok(&submit(
        &mut a,
        "file.write",
        json!({"path": "secret/k"}),
        json!({"content": "x"}),
        "d",
    ))
    .clone();
    assert_eq!(d["state"], "denied");
    assert_eq!(d["error"]["code"], "operation_policy_denied");
    assert!(
        d.get("retry_after_seconds").is_none(),
        "terminal answers carry no retry hint"
    );
    assert_eq!(d["created"], true);
    let n = ok(&submit(
        &mut a,
        "file.write",
        json!({"path": "other/k"}),
        json!({"content": "x"}),
        "n",
    ))
    .clone();
    assert_eq!(n["state"], "denied");
    assert!(!env.root().join("secret/k").exists());
    assert!(!env.root().join("other/k").exists());
    // A denied request replays as denied.
    assert_eq!(
        ok(&submit(
            &mut a,
            "file.write",
            json!({"path": "secret/k"}),
            json!({"content": "x"}),
            "d"
        ))["state"],
        "denied"
    );
}

#[test]
fn without_a_policy_file_every_operation_waits_for_a_human() {
    let env = Env::new(None);
    let mut a = env.agent("agent-1");
    let p = ok(&submit(
        &mut a,
        "file.write",
        json!({"path": "docs/a.md"}),
        json!({"content": "x"}),
        "k",
    ))
    .clone();
    assert_eq!(p["state"], "pending");
    assert_eq!(p["retry_after_seconds"], 2);
    assert!(p["approval_id"].as_str().unwrap().starts_with("ap_"));
    assert!(!env.root().join("docs/a.md").exists());
}

#[test]
fn bad_input_is_refused_with_the_field_and_nothing_is_written() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut a = env.agent("agent-1");
    let seq = |a: &mut Server| a.call("gaffer/status", json!({}))["store"]["seq"].clone();
    let before = seq(&mut a);
    let r = submit(&mut a, "file.launch", json!({}), json!({}), "x");
    assert_eq!(err_code(&r), "operation_not_registered");
    let r = submit(
        &mut a,
        "file.write",
        json!({"path": "../escape"}),
        json!({"content": "x"}),
        "x",
    );
    assert_eq!(err_code(&r), "operation_input_invalid");
    assert_eq!(r["error"]["data"]["field"], "target.path");
    let r = submit(
        &mut a,
        "file.write",
        json!({"path": "docs/a"}),
        json!({"content": 5}),
        "x",
    );
    assert_eq!(r["error"]["data"]["field"], "arguments.content");
    let r = a.request("operations/submit", json!({"operation": "file.write", "target": [1], "arguments": {}, "reason": "r", "idempotency_key": "x"}));
    assert_eq!(r["error"]["code"], -32602, "{r}");
    // Nesting that a record or snapshot carrying it could not read back is refused up front,
    // also when smuggled as a raw value past the message parser's own depth limit.
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let nested: Value = serde_json::from_str(&deep(40)).unwrap();
    let r = submit(
        &mut a,
        "file.write",
        json!({"path": "docs/a", "x": nested}),
        json!({"content": "x"}),
        "x",
    );
    assert_eq!(r["error"]["data"]["field"], "target", "{r}");
    let r = submit(
        &mut a,
        "file.write",
        json!({"path": "docs/a"}),
        json!({"content": "x", "x": nested}),
        "x",
    );
    assert_eq!(r["error"]["data"]["field"], "arguments", "{r}");
    let smuggled = format!("{{\"path\":\"docs/a\",\"x\":{}}}", deep(124));
    let r = a.request("operations/submit", json!({"operation": "file.write", "target": {"$serde_json::private::RawValue": smuggled}, "arguments": {"content": "x"}, "reason": "r", "idempotency_key": "deep"}));
    assert_eq!(r["error"]["data"]["field"], "target", "{r}");
    let r = a.request("operations/submit", json!({"operation": "file.write", "target": {"path": "a"}, "arguments": {"content": ""}, "reason": "  ", "idempotency_key": "x"}));
    assert_eq!(r["error"]["data"]["field"], "reason");
    let r = a.request("operations/submit", json!({"operation": "file.write", "target": {"path": "a"}, "arguments": {"content": ""}, "reason": "r", "idempotency_key": "x", "extra": 1}));
    assert_eq!(r["error"]["code"], -32602);
    let r = a.request("operations/submit", json!({"operation": "file.write", "target": {"path": "a"}, "arguments": {"content": ""}, "reason": "r"}));
    assert_eq!(r["error"]["code"], -32602);
    #[cfg(unix)]
    {
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), env.root().join("docs")).unwrap();
        let r = submit(
            &mut a,
            "file.write",
            json!({"path": "docs/a.md"}),
            json!({"content": "x"}),
            "x",
        );
        assert_eq!(err_code(&r), "operation_input_invalid");
        assert!(!outside.path().join("a.md").exists());
    }
    assert_eq!(
        seq(&mut a),
        before,
        "no record may be written for refused input"
    );
    assert_eq!(
        a.call("operations/list", json!({}))["operations"],
        json!([])
    );
}

#[test]
fn approval_from_a_second_process_unblocks_the_agent_exactly_once() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut op = env.operator();
    let mut a = env.agent("agent-1");
    let p = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "colour"}),
        json!({"value": "blue"}),
        "k",
    ))
    .clone();
    assert_eq!(p["state"], "pending");
    let id = p["id"].as_str().unwrap();
    // The operator's process learns of the request from the journal.
    let n = op
        .notification("approvals/requested", Duration::from_secs(10))
        .expect("approvals/requested");
    assert_eq!(n["params"]["operation_id"], id);
    let list = op.call("approvals/list", json!({}));
    let ap = &list["approvals"][0];
    assert_eq!(ap["operation_id"], id);
    assert_eq!(ap["reason"], "needed for the task");
    let rev = ap["revision"].as_u64().unwrap();
    let prep = op.call(
        "approvals/prepare",
        json!({"id": ap["approval_id"], "decision": "approve", "expected_revision": rev,
               "expected_plan_digest": ap["plan_digest"]}),
    );
    let payload = prep["payload"].as_str().unwrap().to_string();
    let signed = json!({"payload": payload, "signature": env.signer().sign(payload.as_bytes()), "idempotency_key": "d1"});
    let d = op.call("approvals/decide", signed.clone());
    assert_eq!(d["status"], "active");
    let done = wait_state(&mut a, id, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["upstream_status"], 201);
    // Both connections, in their two processes, were told through operations/changed.
    assert!(
        a.notification("operations/changed", Duration::from_secs(5))
            .is_some()
    );
    let seen = op.wait_for(Duration::from_secs(10), |v| {
        v["method"] == "operations/changed"
            && v["params"]["id"] == id
            && v["params"]["state"] == "succeeded"
    });
    assert!(
        seen.is_some(),
        "the operator's process never reported the success"
    );
    assert_eq!(lines(&env.root().join("kv-exec.log")), 1);
    // Decision replay returns the original; a stale revision is refused.
    let again = op.call("approvals/decide", signed);
    assert_eq!(again["approval_id"], ap["approval_id"]);
    let all = op.call("approvals/list", json!({"all": true}));
    assert_eq!(all["approvals"][0]["status"], "consumed");
    assert_eq!(all["approvals"][0]["uses_spent"], 1);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(lines(&env.root().join("kv-exec.log")), 1);
}

#[test]
fn operator_deny_stale_revision_narrowing_and_agent_refusal() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut op = env.operator();
    let mut a = env.agent("agent-1");
    let p = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "a"}),
        json!({"value": 1}),
        "k",
    ))
    .clone();
    let id = p["id"].as_str().unwrap();
    // Agents cannot reach operator methods.
    let r = env.decide(
        &mut a,
        json!({"id": id, "decision": "approve", "expected_revision": 1, "idempotency_key": "x"}),
    );
    assert!(r.get("error").is_some(), "{r}");
    let r = env.decide(
        &mut op,
        json!({"id": id, "decision": "approve", "expected_revision": 7, "idempotency_key": "x"}),
    );
    assert_eq!(err_code(&r), "revision_conflict");
    let r = env.decide(&mut op, json!({"id": id, "decision": "approve", "expected_revision": 1, "idempotency_key": "y", "constraints": {"max_uses": 2}}));
    assert_eq!(err_code(&r), "constraint_exceeded");
    let r = env.decide(&mut op, json!({"id": id, "decision": "approve", "expected_revision": 1, "idempotency_key": "z", "constraints": {"duration_seconds": 1000000}}));
    assert_eq!(err_code(&r), "constraint_exceeded");
    // Both payloads are prepared while the request is pending; the deny is recorded first.
    let prepare = |op: &mut Server, p: Value| {
        let payload = op.call("approvals/prepare", p)["payload"]
            .as_str()
            .unwrap()
            .to_string();
        json!({"payload": payload, "signature": env.signer().sign(payload.as_bytes()), "idempotency_key": "d"})
    };
    let deny = prepare(
        &mut op,
        json!({"id": id, "decision": "deny", "expected_revision": 1, "reason": "not in this sprint"}),
    );
    let shown = op.call("approvals/get", json!({ "id": id }));
    let approve = prepare(
        &mut op,
        json!({"id": id, "decision": "approve", "expected_revision": 1,
               "expected_plan_digest": shown["plan_digest"]}),
    );
    op.call("approvals/decide", deny);
    let v = wait_state(&mut a, id, &["denied"]);
    assert_eq!(v["error"]["code"], "operation_approval_denied");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not in this sprint"),
        "the operator's reason reaches the agent: {v}"
    );
    // Same key, different command.
    let r = op.request("approvals/decide", approve);
    assert_eq!(err_code(&r), "idempotency_conflict");
    assert_eq!(lines(&env.root().join("kv-exec.log")), 0);
}

#[test]
fn execution_grant_with_more_than_one_use_is_refused() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut a = env.agent("agent-1");
    let v = ok(&submit(
        &mut a,
        "file.write",
        json!({"path": "greedy/x"}),
        json!({"content": "x"}),
        "g",
    ))
    .clone();
    assert_eq!(v["state"], "failed");
    assert_eq!(v["error"]["code"], "approval_request_failed");
}

#[test]
fn cancel_pending_and_revoke_approved_and_foreign_ids_are_not_found() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut op = env.operator();
    let mut a = env.agent("agent-1");
    let p = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "a"}),
        json!({"value": 1}),
        "c1",
    ))
    .clone();
    let id = p["id"].as_str().unwrap();
    let mut other = env.agent("agent-2");
    assert_eq!(
        err_code(&other.request("operations/get", json!({"id": id}))),
        "not_found"
    );
    assert_eq!(
        err_code(&other.request("operations/cancel", json!({"id": id}))),
        "not_found"
    );
    assert_eq!(
        err_code(&other.request("operations/wait", json!({"id": id, "wait_seconds": 0}))),
        "not_found"
    );
    let c = a.call("operations/cancel", json!({"id": id}));
    assert_eq!(c["state"], "canceled");
    assert_eq!(c["error"]["code"], "operation_canceled");
    // Cancel of a terminal operation returns it unchanged.
    let again = a.call("operations/cancel", json!({"id": id}));
    assert_eq!(again["revision"], c["revision"]);
    let all = op.call("approvals/list", json!({"all": true}));
    assert_eq!(all["approvals"][0]["status"], "canceled");
    // Operator revokes a request before anyone decided it.
    let p2 = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "b"}),
        json!({"value": 1}),
        "c2",
    ))
    .clone();
    let id2 = p2["id"].as_str().unwrap();
    let v = wait_for_approval(&mut op, id2);
    env.revoke_ok(&mut op, &v["approval_id"]);
    assert_eq!(wait_state(&mut a, id2, &["canceled"])["state"], "canceled");
    assert_eq!(lines(&env.root().join("kv-exec.log")), 0);
}

#[test]
fn a_pending_request_expires() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut a = env.agent("agent-1");
    let p = ok(&submit(
        &mut a,
        "kv.expiring",
        json!({"key": "a"}),
        json!({"value": 1}),
        "e",
    ))
    .clone();
    assert_eq!(p["state"], "pending");
    let v = wait_state(&mut a, p["id"].as_str().unwrap(), &["expired"]);
    assert_eq!(v["error"]["code"], "operation_approval_expired");
}

#[test]
fn partial_errors_are_reconciled_proven_and_unproven() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut op = env.operator();
    let mut a = env.agent("agent-1");
    let cases = [
        ("partial_proven", "succeeded", None),
        ("unproven_ok", "succeeded", None),
        (
            "partial_unproven",
            "failed",
            Some("upstream_result_unknown"),
        ),
        ("definitive", "failed", Some("kv_refused")),
        ("huge", "failed", Some("operation_store_unavailable")),
        ("empty", "succeeded", None),
    ];
    for (mode, state, code) in cases {
        let p = ok(&submit(
            &mut a,
            "kv.set",
            json!({"key": mode}),
            json!({"value": mode, "mode": mode}),
            mode,
        ))
        .clone();
        let id = p["id"].as_str().unwrap();
        approve(&env, &mut op, id);
        let v = wait_state(&mut a, id, &["succeeded", "failed"]);
        assert_eq!(v["state"], state, "{mode}: {v}");
        if let Some(c) = code {
            assert_eq!(v["error"]["code"], c, "{mode}");
        } else if mode == "empty" {
            assert_eq!(
                v["result"],
                json!({"operation": "kv.set", "reconciled": true})
            );
        } else {
            assert_eq!(v["result"]["read_back"], true, "{mode}: {v}");
            assert_eq!(v["upstream_status"], 200);
        }
    }
    let all = op.call("approvals/list", json!({"all": true}));
    let by_op = |mode: &str| {
        all["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["target"]["key"] == mode)
            .unwrap_or_else(|| panic!("no approval for {mode} in {all}"))
            .clone()
    };
    // Unknown outcome keeps the use reserved (retained); a definitive refusal spends it.
    assert_eq!(by_op("partial_unproven")["retained"], true);
    assert_eq!(by_op("definitive")["status"], "consumed");
    assert_eq!(lines(&env.root().join("kv-exec.log")), 6);
}

#[test]
fn forged_approval_in_the_journal_is_refused_at_execution() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut a = env.agent("agent-1");
    let p = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "x"}),
        json!({"value": 1}),
        "f",
    ))
    .clone();
    let id = p["id"].as_str().unwrap().to_string();
    let ap = p["approval_id"].as_str().unwrap().to_string();
    // The agent writes straight into the journal, signing with a key of its own.
    {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let ws = gaffer::workspace::Workspace::open(env.root()).unwrap();
            let (op, approval) = ws.read(|s| {
                let o = s.operations.get(&id).unwrap().clone();
                (o.clone(), s.operations.approvals[&ap].clone())
            });
            // A payload exactly like the operator's, signed with a key the agent made.
            let cfg = tempfile::tempdir().unwrap();
            let (k, pk) = (cfg.path().join("agent.key"), cfg.path().join("agent.pub"));
            gaffer::operator::OperatorSigner::init(&k, &pk, None).unwrap();
            let agent_key = gaffer::operator::OperatorSigner::load_from(&k).unwrap();
            let now = gaffer::util::now_ms();
            let payload = gaffer::operations::decision::DecisionPayload {
                domain: "gaffer/decision/v1".into(),
                workspace_id: ws.workspace_id().unwrap(),
                approval_id: approval.id.clone(),
                operation_id: op.id.clone(),
                client: op.client_id.clone(),
                operation: op.operation.clone(),
                plan_digest: op.plan_digest.clone().unwrap(),
                classification_digest: gaffer::operations::decision::classification_digest(
                    &approval.classification,
                ),
                mode: approval.mode,
                decision: gaffer::operations::state::DecisionKind::Approve,
                revision: 2,
                decided_at_ms: now,
                expires_at_ms: Some(now + 600_000),
                max_uses: 1,
                narrowed_duration_seconds: None,
                narrowed_max_uses: None,
                reason: None,
                head: ws.journal_head(),
            };
            let decided = gaffer::operations::state::Decided {
                approval_id: approval.id.clone(),
                operator_signature: gaffer::operator::OperatorSignature::sign(&agent_key, &payload),
                idempotency_key: "forged".into(),
                command_digest: "x".into(),
            };
            let t = json!({"id": op.id, "from": "pending", "to": "approved", "revision": 2, "at_ms": gaffer::util::now_ms()});
            ws.commit(move |_s: &gaffer::workspace::State| {
                Ok::<_, String>((
                    vec![
                        gaffer::workspace::NewRecord::new("approval.decided", &decided).unwrap(),
                        gaffer::workspace::NewRecord::new("operation.transitioned", &t).unwrap(),
                    ],
                    (),
                ))
            })
            .await
            .map_err(|_| "commit")
            .unwrap();
        });
    }
    let v = wait_state(&mut a, &id, &["failed", "succeeded"]);
    assert_eq!(v["state"], "failed", "{v}");
    assert_eq!(v["error"]["code"], "approval_invalid");
    assert_eq!(lines(&env.root().join("kv-exec.log")), 0);
}

#[test]
fn twelve_concurrent_identical_submissions_make_one_operation_and_one_execution() {
    let env = Env::new(Some(ALLOW_DOCS));
    let argv = json!({"argv": ["sh", "-c", "echo run >> counter.log"]});
    let mut servers: Vec<Server> = (0..3).map(|_| env.agent("agent-1")).collect();
    let mut pending = vec![];
    for (i, s) in servers.iter_mut().enumerate() {
        for j in 0..4 {
            let key = if (i + j) % 2 == 0 { "same" } else { "  same  " };
            let id = s.send_request(
                "operations/submit",
                json!({"operation": "command.run", "target": argv, "arguments": {}, "reason": "count", "idempotency_key": key}),
            );
            pending.push((i, id));
        }
    }
    let mut ids = std::collections::BTreeSet::new();
    let mut created = 0;
    for (i, rid) in pending {
        let r = servers[i].response(rid);
        assert!(r.get("result").is_some(), "{r}\n{}", env.logs());
        let r = ok(&r);
        ids.insert(r["id"].as_str().unwrap().to_string());
        if r["created"] == true {
            created += 1;
        }
    }
    assert_eq!(ids.len(), 1);
    assert_eq!(created, 1);
    let id = ids.into_iter().next().unwrap();
    let v = wait_state(&mut servers[0], &id, &["succeeded", "failed"]);
    assert_eq!(v["state"], "succeeded", "{v}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(lines(&env.root().join("counter.log")), 1);
}

#[test]
fn wait_returns_on_change_times_out_and_bounds_its_duration() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut a = env.agent("agent-1");
    let p = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "w"}),
        json!({"value": 1}),
        "w",
    ))
    .clone();
    let id = p["id"].as_str().unwrap();
    let r = a.request("operations/wait", json!({"id": id, "wait_seconds": 31}));
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let t = Instant::now();
    let v = a.call(
        "operations/wait",
        json!({"id": id, "after_revision": 1, "wait_seconds": 1}),
    );
    assert!(t.elapsed() >= Duration::from_millis(900));
    assert_eq!(v["revision"], 1);
    let t = Instant::now();
    let v = a.call(
        "operations/wait",
        json!({"id": id, "after_revision": 0, "wait_seconds": 10}),
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(v["state"], "pending");
}

#[test]
fn kill_during_execution_is_reconciled_after_restart_and_never_rerun() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut a = env.agent("agent-1");
    let p = ok(&submit(
        &mut a,
        "command.run",
        json!({"argv": ["sh", "-c", "echo run >> runs.log; sleep 30"]}),
        json!({}),
        "slow",
    ))
    .clone();
    let id = p["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    while lines(&env.root().join("runs.log")) == 0 {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let v = a.call("operations/get", json!({"id": id}));
    assert_eq!(v["state"], "executing");
    assert_eq!(
        err_code(&a.request("operations/cancel", json!({"id": id}))),
        "operation_not_cancelable"
    );
    a.child.kill().unwrap(); // SIGKILL
    let _ = a.child.wait();
    let mut b = env.agent("agent-1");
    let v = wait_state(&mut b, &id, &["failed", "succeeded"]);
    assert_eq!(v["state"], "failed");
    assert_eq!(v["error"]["code"], "upstream_result_unknown");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(lines(&env.root().join("runs.log")), 1);
}

#[test]
fn crash_after_execute_is_proven_by_reading_back() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut a = env.agent_env("agent-1", &[("GAFFER_TEST_FAILPOINT", "after_execute")]);
    let id = a.send_request(
        "operations/submit",
        json!({"operation": "file.write", "target": {"path": "docs/once.md"}, "arguments": {"content": "once"}, "reason": "r", "idempotency_key": "c"}),
    );
    let _ = a.wait_for(Duration::from_secs(5), |v| v.get("id") == Some(&json!(id)));
    let code = common::wait_exit(&mut a.child, Duration::from_secs(10));
    assert_eq!(code, 86, "the failpoint should have ended the process");
    assert_eq!(
        std::fs::read_to_string(env.root().join("docs/once.md")).unwrap(),
        "once"
    );
    let mut b = env.agent("agent-1");
    let list = b.call("operations/list", json!({}));
    let op_id = list["operations"][0]["id"].as_str().unwrap().to_string();
    let v = wait_state(&mut b, &op_id, &["succeeded", "failed"]);
    assert_eq!(v["state"], "succeeded", "{v}");
    assert_eq!(v["result"]["bytes"], 4);
    // The ending recovery proved is this machine's own: the retry is answered with it.
    let again = b.request(
        "operations/submit",
        json!({"operation": "file.write", "target": {"path": "docs/once.md"}, "arguments": {"content": "once"}, "reason": "r", "idempotency_key": "c"}),
    );
    assert_eq!(again["result"]["id"], op_id.as_str(), "{again}");
    assert_eq!(again["result"]["state"], "succeeded", "{again}");
}

#[test]
fn crash_after_claim_before_execute_is_not_run_on_restart() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut a = env.agent_env("agent-1", &[("GAFFER_TEST_FAILPOINT", "after_claim")]);
    a.send_request(
        "operations/submit",
        json!({"operation": "command.run", "target": {"argv": ["sh", "-c", "echo run >> runs.log"]}, "arguments": {}, "reason": "r", "idempotency_key": "c"}),
    );
    assert_eq!(common::wait_exit(&mut a.child, Duration::from_secs(10)), 86);
    let mut b = env.agent("agent-1");
    let list = b.call("operations/list", json!({}));
    let op_id = list["operations"][0]["id"].as_str().unwrap().to_string();
    let v = wait_state(&mut b, &op_id, &["succeeded", "failed"]);
    assert_eq!(v["state"], "failed");
    assert_eq!(v["error"]["code"], "upstream_result_unknown");
    assert_eq!(lines(&env.root().join("runs.log")), 0);
    let again = b.request(
        "operations/submit",
        json!({"operation": "command.run", "target": {"argv": ["sh", "-c", "echo run >> runs.log"]}, "arguments": {}, "reason": "r", "idempotency_key": "c"}),
    );
    assert_eq!(again["result"]["id"], op_id.as_str(), "{again}");
    assert_eq!(lines(&env.root().join("runs.log")), 0);
}

#[test]
fn mcp_offers_operation_tools_but_no_operator_tools() {
    let env = Env::new(Some(ALLOW_DOCS));
    let key = env.key_file.display().to_string();
    let mut s = Server::start_env(
        env.root(),
        Wire::Ndjson,
        &["--mcp"],
        &[("GAFFER_OPERATOR_KEY_FILE", key.as_str())],
    );
    s.call("initialize", json!({"protocolVersion": "2025-06-18", "clientInfo": {"name": "mcp-agent"}, "capabilities": {}}));
    s.notify("notifications/initialized", json!({}));
    let tools = s.call("tools/list", json!({}));
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for t in [
        "submit_operation",
        "get_operation",
        "list_operations",
        "wait_operation",
        "cancel_operation",
    ] {
        assert!(names.contains(&t), "{t} missing from {names:?}");
    }
    assert!(!names.iter().any(|n| n.contains("approv")), "{names:?}");
    let _ = env.env();
}

#[test]
fn catalog_lists_builtin_and_external_operations_with_schemas() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut a = env.agent("agent-1");
    let c = a.call("operations/catalog", json!({}));
    let names: Vec<&str> = c["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        vec![
            "command.run",
            "file.delete",
            "file.write",
            "kv.expiring",
            "kv.set",
            "plan.launch",
            "worker.start"
        ]
    );
    let fw = c["operations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "file.write")
        .unwrap();
    assert_eq!(fw["target_schema"]["additionalProperties"], false);
    assert!(fw["arguments_schema"]["properties"]["content"].is_object());
}

#[test]
fn cli_operator_init_approve_and_submit() {
    let env = Env::new(Some(ALLOW_DOCS));
    let cfg = tempfile::tempdir().unwrap();
    let key = cfg.path().join("nested/operator.key");
    let run_as = |token: Option<&str>, args: &[&str]| {
        let mut cmd = std::process::Command::new(common::BIN);
        cmd.arg("--workspace")
            .arg(env.root())
            .args(args)
            .env("GAFFER_OPERATOR_KEY_FILE", &key);
        if let Some(t) = token {
            cmd.env("GAFFER_CLIENT_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let run = |args: &[&str]| run_as(None, args);
    // Without a key the operator commands refuse.
    assert_ne!(run(&["approvals"]).0, 0);
    assert_eq!(run(&["operator", "init"]).0, 0);
    assert_ne!(run(&["operator", "init"]).0, 0, "init must not overwrite");
    // The workspace files were trusted under another key; this operator trusts them anew.
    let trust = env.trust_args();
    let trust: Vec<&str> = trust.iter().map(String::as_str).collect();
    assert_eq!(run(&trust).0, 0);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    // Allowed work submitted from the CLI (as an authenticated client) runs before the
    // command exits.
    let (code, out) = run(&["client", "add", "cli-user"]);
    assert_eq!(code, 0, "{out}");
    let token = serde_json::from_str::<Value>(&out).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, out) = run_as(
        Some(&token),
        &[
            "op",
            "submit",
            "file.write",
            "--target",
            r#"{"path":"docs/cli.md"}"#,
            "--arguments",
            r#"{"content":"c"}"#,
            "--reason",
            "cli",
        ],
    );
    assert_eq!(code, 0, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"], "succeeded", "{v}");
    assert_eq!(
        std::fs::read_to_string(env.root().join("docs/cli.md")).unwrap(),
        "c"
    );
    // An agent in a server process waits; the human approves from the CLI.
    let key_s = key.display().to_string();
    let mut a = Server::start_env(
        env.root(),
        Wire::Ndjson,
        &[],
        &[("GAFFER_OPERATOR_KEY_FILE", key_s.as_str())],
    );
    a.call(
        "initialize",
        json!({"clientInfo": {"name": "agent-1"}, "initializationOptions": {"clientToken": token}}),
    );
    let p = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "k"}),
        json!({"value": "v"}),
        "x",
    ))
    .clone();
    let id = p["id"].as_str().unwrap();
    let (code, out) = run(&["approvals"]);
    assert_eq!(code, 0);
    assert!(out.contains(id), "{out}");
    let digest = env.reviewed_digest(id);
    let (code, out) = run(&["approve", id, "--expect", &digest]);
    assert_eq!(code, 0, "{out}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["status"], "active", "{shown}");
    assert_ne!(
        shown["operation_state"], "pending",
        "approve prints the state after it: {shown}"
    );
    let v = wait_state(&mut a, id, &["succeeded", "failed"]);
    assert_eq!(v["state"], "succeeded", "{v}");
    let (code, out) = run(&["op", "list", "--state", "succeeded"]);
    assert_eq!(code, 0);
    assert!(out.contains("docs/cli.md"), "{out}");
}

#[test]
fn a_window_approval_covers_later_matching_operations_until_its_uses_run_out() {
    let policy = r#"
rules:
  - id: window
    effect: request
    operations: ["kv.set"]
    grant_policy: {mode: window, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10, default_max_uses: 2, max_uses: 3}
"#;
    let env = Env::new(Some(policy));
    let mut op = env.operator();
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
    approve(&env, &mut op, first["id"].as_str().unwrap());
    assert_eq!(
        wait_state(
            &mut a,
            first["id"].as_str().unwrap(),
            &["succeeded", "failed"]
        )["state"],
        "succeeded"
    );
    // The same kind of request now runs on the active approval without a new request.
    let second = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "shared"}),
        json!({"value": 2}),
        "w2",
    ))
    .clone();
    assert_ne!(second["state"], "pending", "{second}");
    assert_eq!(second["approval_id"], first["approval_id"]);
    assert_eq!(
        wait_state(
            &mut a,
            second["id"].as_str().unwrap(),
            &["succeeded", "failed"]
        )["state"],
        "succeeded"
    );
    // A different target is not covered.
    let other = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "other"}),
        json!({"value": 2}),
        "w3",
    ))
    .clone();
    assert_eq!(other["state"], "pending");
    // Two uses spent: the next one asks again.
    let third = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "shared"}),
        json!({"value": 3}),
        "w4",
    ))
    .clone();
    assert_eq!(third["state"], "pending");
    assert_ne!(third["approval_id"], first["approval_id"]);
    let all = op.call("approvals/list", json!({"all": true}));
    let granted = all["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["approval_id"] == first["approval_id"])
        .unwrap()
        .clone();
    assert_eq!(granted["status"], "consumed");
    assert_eq!(granted["uses_spent"], 2);
    assert_eq!(lines(&env.root().join("kv-exec.log")), 2);
}

#[test]
fn terminal_operations_are_pruned_after_the_configured_retention() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut a = env.agent("agent-1");
    let d = ok(&submit(
        &mut a,
        "file.write",
        json!({"path": "secret/x"}),
        json!({"content": "x"}),
        "old",
    ))
    .clone();
    assert_eq!(d["state"], "denied");
    let live = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "p"}),
        json!({"value": 1}),
        "live",
    ))
    .clone();
    drop(a);
    std::thread::sleep(Duration::from_millis(20));
    let mut b = env.agent_env("agent-1", &[("GAFFER_OPERATIONS_RETENTION_HOURS", "0")]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = b.request("operations/get", json!({"id": d["id"]}));
        if r.get("error").is_some() {
            assert_eq!(err_code(&r), "not_found");
            break;
        }
        assert!(Instant::now() < deadline, "never pruned");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Unfinished work is never pruned; the pruned key is free again.
    assert_eq!(
        b.call("operations/get", json!({"id": live["id"]}))["state"],
        "pending"
    );
    let again = ok(&submit(
        &mut b,
        "file.write",
        json!({"path": "secret/x"}),
        json!({"content": "x"}),
        "old",
    ))
    .clone();
    assert_eq!(again["created"], true);
    assert_ne!(again["id"], d["id"]);
}

#[test]
fn approved_work_waits_for_a_server_and_a_revoke_before_it_runs_cancels_it() {
    let env = Env::new(Some(ALLOW_DOCS));
    let key = env.key_file.display().to_string();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(common::BIN)
            .arg("--workspace")
            .arg(env.root())
            .args(args)
            .env("GAFFER_OPERATOR_KEY_FILE", &key)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let mut a = env.agent("agent-1");
    let run = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "later"}),
        json!({"value": 1}),
        "r1",
    ))
    .clone();
    let revoked = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "never"}),
        json!({"value": 1}),
        "r2",
    ))
    .clone();
    drop(a);
    // No server is running: the approvals are recorded, nothing executes yet.
    for op in [&run, &revoked] {
        let (code, out, err) = env.approve_reviewed(op["id"].as_str().unwrap(), &[]);
        assert_eq!(code, 0, "{out}{err}");
        let decided: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(decided["status"], "active", "{decided}");
    }
    assert_eq!(
        cli(&["op", "get", run["id"].as_str().unwrap()])["state"],
        "approved"
    );
    assert_eq!(
        cli(&["revoke", revoked["id"].as_str().unwrap()])["status"],
        "revoked"
    );
    assert_eq!(
        cli(&["op", "get", revoked["id"].as_str().unwrap()])["state"],
        "canceled"
    );
    assert_eq!(lines(&env.root().join("kv-exec.log")), 0);
    // A server starting later runs what is approved, and only that.
    let mut b = env.agent("agent-1");
    let v = wait_state(
        &mut b,
        run["id"].as_str().unwrap(),
        &["succeeded", "failed"],
    );
    assert_eq!(v["state"], "succeeded", "{v}");
    assert_eq!(
        b.call("operations/get", json!({"id": revoked["id"]}))["state"],
        "canceled"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(lines(&env.root().join("kv-exec.log")), 1);
}

// ---------- operator trust of policy.yaml and providers.yaml ----------

#[test]
fn agent_written_allow_rule_is_ignored_until_the_operator_trusts_it() {
    let env = Env::untrusted(Some(ALLOW_DOCS));
    let mut a = env.agent("agent-1");
    let c = catalog(&mut a);
    assert_eq!(c["untrusted_policy"], true, "{c}");
    assert_eq!(c["trust"]["policy"], "never_trusted", "{c}");
    let p = ok(&submit(
        &mut a,
        "file.write",
        json!({"path": "docs/a.md"}),
        json!({"content": "x"}),
        "before",
    ))
    .clone();
    assert_eq!(p["state"], "pending", "{p}");
    assert!(!env.root().join("docs/a.md").exists());

    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let policy_bytes = std::fs::read(env.root().join(".gaffer/policy.yaml")).unwrap();
    let trusted = v["trusted"].as_array().unwrap();
    let entry = trusted.iter().find(|t| t["file"] == "policy.yaml").unwrap();
    assert_eq!(
        entry["sha256"].as_str().unwrap(),
        gaffer::util::sha256_hex(&policy_bytes)
    );

    // The running server notices the new trust without a restart.
    let r = ok(&submit(
        &mut a,
        "file.write",
        json!({"path": "docs/b.md"}),
        json!({"content": "y"}),
        "after",
    ))
    .clone();
    let r = wait_state(&mut a, r["id"].as_str().unwrap(), &["succeeded", "failed"]);
    assert_eq!(r["state"], "succeeded", "{r}\n{}", env.logs());
    assert_eq!(
        std::fs::read_to_string(env.root().join("docs/b.md")).unwrap(),
        "y"
    );
    assert_eq!(catalog(&mut a)["untrusted_policy"], false);
    // What was submitted before the trust still waits for a human.
    let before = a.call("operations/get", json!({"id": p["id"]}));
    assert_eq!(before["state"], "pending", "{before}");
    assert!(!env.root().join("docs/a.md").exists());
}

#[test]
fn editing_or_deleting_a_trusted_policy_changes_nothing_that_was_trusted() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut a = env.agent("agent-1");
    let policy = env.root().join(".gaffer/policy.yaml");
    // The agent rewrites the policy: its own allow rule in, the deny rule for secret/ out.
    let rewritten = "rules:\n  - id: mine\n    effect: allow\n    operations: [\"file.*\"]\n";
    std::fs::write(&policy, rewritten).unwrap();
    let expect = |a: &mut Server, path: &str, key: &str, state: &str| {
        let p = ok(&submit(
            a,
            "file.write",
            json!({"path": path}),
            json!({"content": "y"}),
            key,
        ))
        .clone();
        let v = if state == "succeeded" {
            wait_state(a, p["id"].as_str().unwrap(), &["succeeded", "failed"])
        } else {
            p
        };
        assert_eq!(v["state"], state, "{path}: {v}");
    };
    // The trusted allow still holds; the new allow counts for nothing; the trusted deny holds.
    expect(&mut a, "docs/b.md", "docs", "succeeded");
    expect(&mut a, "src/x.rs", "own-rule", "pending");
    expect(&mut a, "secret/k", "deny-edited", "denied");
    assert!(!env.root().join("src/x.rs").exists() && !env.root().join("secret/k").exists());
    let c = catalog(&mut a);
    assert_eq!(c["trust"]["policy"], "changed", "{c}");
    assert_eq!(
        status_in(&show(&env, &env.key_file), "policy.yaml"),
        "changed"
    );
    let (code, out, _) = env.cli(&["doctor"]);
    assert_ne!(code, 0, "doctor reports the drift: {out}");
    assert!(out.contains("changed since it was trusted"), "{out}");

    // Deleted: the trusted content is still what holds.
    std::fs::remove_file(&policy).unwrap();
    expect(&mut a, "secret/k2", "deny-deleted", "denied");
    expect(&mut a, "docs/c.md", "docs-deleted", "succeeded");
    assert_eq!(catalog(&mut a)["trust"]["policy"], "deleted");
}

#[test]
fn an_older_trusted_policy_restored_with_its_record_is_not_trusted_again() {
    // The operator trusts a broad policy, then narrows it and trusts again.
    let broad = "rules:\n  - id: all\n    effect: allow\n    operations: [\"file.write\"]\n";
    let env = Env::new(Some(broad));
    let policy = env.root().join(".gaffer/policy.yaml");
    let old_record = {
        let ws = gaffer::workspace::Workspace::open(env.root()).unwrap();
        ws.read(|s| s.trust.files["policy.yaml"].last().cloned().unwrap())
    };
    std::fs::write(&policy, ALLOW_DOCS).unwrap();
    assert_eq!(env.trust_reviewed().0, 0);
    // The agent puts the broad file back and re-appends the old, validly signed record.
    std::fs::write(&policy, broad).unwrap();
    append_as_agent(
        env.root(),
        vec![(
            "trust.signed",
            json!({"file": "policy.yaml", "operator_signature": old_record}),
        )],
    );
    let mut a = env.agent("agent-1");
    let p = ok(&submit(
        &mut a,
        "file.write",
        json!({"path": "src/wide.rs"}),
        json!({"content": "x"}),
        "replayed",
    ))
    .clone();
    assert_eq!(
        p["state"], "pending",
        "the narrower, later trust holds: {p}"
    );
    assert_eq!(catalog(&mut a)["trust"]["policy"], "changed");
}

#[test]
fn a_trust_record_copied_from_another_workspace_is_not_trusted_here() {
    // Workspace A: the operator trusts a broad policy.
    let broad = "rules:\n  - id: all\n    effect: allow\n    operations: [\"file.write\"]\n";
    let a_env = Env::new(Some(broad));
    let record = {
        let ws = gaffer::workspace::Workspace::open(a_env.root()).unwrap();
        ws.read(|s| s.trust.files["policy.yaml"].last().cloned().unwrap())
    };
    // Workspace B (same operator key): the agent copies the file and the signed record.
    let b = Env::untrusted(Some(broad));
    std::fs::copy(&a_env.key_file, &b.key_file).unwrap();
    std::fs::copy(
        a_env.key_file.with_extension("pub"),
        b.key_file.with_extension("pub"),
    )
    .unwrap();
    append_as_agent(
        b.root(),
        vec![(
            "trust.signed",
            json!({"file": "policy.yaml", "operator_signature": record}),
        )],
    );
    assert_eq!(
        status_in(&show(&b, &b.key_file), "policy.yaml"),
        "never_trusted"
    );
    let mut agent = b.agent("agent-1");
    let p = ok(&submit(
        &mut agent,
        "file.write",
        json!({"path": "x.md"}),
        json!({"content": "x"}),
        "copied",
    ))
    .clone();
    assert_eq!(p["state"], "pending", "{p}");
}

#[test]
fn trust_expect_signs_exactly_the_files_it_names() {
    let env = Env::untrusted(Some(ALLOW_DOCS));
    let shown = show(&env, &env.key_file);
    let pin = format!(
        "policy.yaml={}",
        shown["files"][0]["sha256"].as_str().unwrap()
    );
    let (code, out, err) = env.cli(&["trust", "--expect", &pin]);
    assert_eq!(code, 0, "{out} {err}");
    let shown = show(&env, &env.key_file);
    assert_eq!(status_in(&shown, "policy.yaml"), "trusted", "{shown}");
    assert_eq!(
        status_in(&shown, "providers.yaml"),
        "never_trusted",
        "a providers.yaml the agent planted is not signed along: {shown}"
    );
    let mut a = env.agent("agent-1");
    assert!(
        catalog_names(&catalog(&mut a))
            .iter()
            .all(|n| !n.starts_with("kv."))
    );
}

#[test]
fn untrusted_deny_rules_still_deny() {
    let env = Env::untrusted(Some(ALLOW_DOCS));
    let mut a = env.agent("agent-1");
    let d = ok(&submit(
        &mut a,
        "file.write",
        json!({"path": "secret/k"}),
        json!({"content": "x"}),
        "deny",
    ))
    .clone();
    assert_eq!(d["state"], "denied", "{d}");
    assert_eq!(d["error"]["code"], "operation_policy_denied");
    // Allow rules and "no rule matches" both become a question for a human.
    for (op, target, args, key) in [
        (
            "command.run",
            json!({"argv": ["sh", "-c", "echo run >> runs.log"]}),
            json!({}),
            "cmd",
        ),
        (
            "file.write",
            json!({"path": "other/k"}),
            json!({"content": "x"}),
            "nomatch",
        ),
    ] {
        let p = ok(&submit(&mut a, op, target, args, key)).clone();
        assert_eq!(p["state"], "pending", "{op}: {p}");
    }
    assert!(!env.root().join("runs.log").exists());
    assert!(!env.root().join("secret/k").exists());
    assert!(!env.root().join("other/k").exists());
}

#[test]
fn untrusted_providers_yaml_starts_nothing() {
    let env = Env::untrusted(None);
    // Inside the workspace: the only place outside its own directory a provider may write.
    let marker = env.root().join("provider-started");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/providers");
    std::fs::write(
        env.root().join(".gaffer/providers.yaml"),
        format!(
            "providers:\n  - name: kv\n    command: [python3, {:?}, provider-started, kv]\n    read: [{:?}]\n    workspace: write\n",
            dir.join("announce.py").display().to_string(),
            dir.display().to_string()
        ),
    )
    .unwrap();
    let mut a = env.agent("agent-1");
    let c = catalog(&mut a);
    let names = catalog_names(&c);
    assert!(names.iter().all(|n| !n.starts_with("kv.")), "{names:?}");
    assert!(
        names.contains(&"file.write".to_string()),
        "built-ins still work"
    );
    assert_eq!(c["trust"]["providers"], "never_trusted", "{c}");
    let why = c["external_providers_disabled"].as_str().unwrap();
    assert!(why.contains("providers.yaml"), "{why}");
    let r = submit(
        &mut a,
        "kv.set",
        json!({"key": "k"}),
        json!({"value": 1}),
        "kv",
    );
    assert!(r.get("error").is_some(), "{r}");
    drop(a);
    assert!(!marker.exists(), "an untrusted provider was started");

    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("providers.yaml"), "{out}");
    let mut op = env.operator();
    let mut a = env.agent("agent-1");
    assert!(
        marker.exists(),
        "the trusted provider was described at start"
    );
    let c = catalog(&mut a);
    assert!(catalog_names(&c).contains(&"kv.set".to_string()), "{c}");
    assert!(c.get("external_providers_disabled").is_none(), "{c}");
    assert_eq!(c["trust"]["providers"], "trusted");
    let p = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "k"}),
        json!({"value": 1}),
        "kv2",
    ))
    .clone();
    let id = p["id"].as_str().unwrap();
    approve(&env, &mut op, id);
    let v = wait_state(&mut a, id, &["succeeded", "failed"]);
    assert_eq!(v["state"], "succeeded", "{v}\n{}", env.logs());
}

#[test]
fn a_trust_record_signed_with_another_key_is_rejected() {
    let env = Env::untrusted(Some(ALLOW_DOCS));
    let gaffer_dir = env.root().join(".gaffer");
    let mut a = env.agent("agent-1");
    // The agent signs both files with a key of its own and appends the records.
    let forged = agent_signer(&env);
    let id = workspace_id(env.root());
    let recs = ["policy.yaml", "providers.yaml"]
        .into_iter()
        .map(|f| {
            let bytes = std::fs::read(gaffer_dir.join(f)).unwrap();
            ("trust.signed", trust_record(&forged, &id, f, &bytes, 99))
        })
        .collect();
    append_as_agent(env.root(), recs);
    let shown = show(&env, &env.key_file);
    assert_eq!(status_in(&shown, "policy.yaml"), "never_trusted", "{shown}");
    assert_eq!(status_in(&shown, "providers.yaml"), "never_trusted");
    assert_eq!(shown["files"][0]["invalid_records"], 1, "{shown}");

    let c = catalog(&mut a);
    assert_eq!(c["untrusted_policy"], true);
    assert_eq!(c["trust"]["policy"], "never_trusted");
    assert!(catalog_names(&c).iter().all(|n| !n.starts_with("kv.")));
    let p = ok(&submit(
        &mut a,
        "file.write",
        json!({"path": "docs/a.md"}),
        json!({"content": "x"}),
        "forged",
    ))
    .clone();
    assert_eq!(p["state"], "pending", "{p}");
    let (code, out, _) = env.cli(&["doctor"]);
    assert_ne!(code, 0);
    assert!(out.contains("do not verify"), "{out}");
}

#[test]
fn cli_trust_show_reports_each_file() {
    let env = Env::untrusted(Some(ALLOW_DOCS));
    let shown = show(&env, &env.key_file);
    assert_eq!(status_in(&shown, "policy.yaml"), "never_trusted", "{shown}");
    assert_eq!(status_in(&shown, "providers.yaml"), "never_trusted");

    // No key: `trust` refuses and writes nothing; `--show` can verify nothing.
    let nowhere = env._cfg.path().join("missing.key");
    let (code, _, err) = env.cli_with_key(&nowhere, &["trust"]);
    assert_eq!(code, 3, "{err}");
    assert_eq!(
        show(&env, &env.key_file)["files"][0]["trusted_version"],
        Value::Null
    );
    assert_eq!(
        status_in(&show(&env, &nowhere), "policy.yaml"),
        "no_operator_key"
    );

    assert_eq!(env.trust_reviewed().0, 0);
    let shown = show(&env, &env.key_file);
    for f in ["policy.yaml", "providers.yaml"] {
        assert_eq!(status_in(&shown, f), "trusted", "{shown}");
    }
    let entry = shown["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["file"] == "policy.yaml")
        .unwrap()
        .clone();
    assert_eq!(entry["sha256"], entry["trusted_sha256"]);
    assert_eq!(entry["trusted_version"], 1);
    assert!(entry["signed_at"].as_str().unwrap().starts_with("20"));

    std::fs::write(env.root().join(".gaffer/policy.yaml"), "rules: []\n").unwrap();
    let shown = show(&env, &env.key_file);
    assert_eq!(status_in(&shown, "policy.yaml"), "changed");
    assert_eq!(status_in(&shown, "providers.yaml"), "trusted");

    // An invalid policy is not signed, and the earlier trust stays as it was.
    let before = show(&env, &env.key_file)["files"][0]["trusted_version"].clone();
    std::fs::write(
        env.root().join(".gaffer/policy.yaml"),
        "rules:\n  - id: a\n    effect: maybe\n",
    )
    .unwrap();
    let (code, _, err) = env.trust_reviewed();
    assert_ne!(code, 0);
    assert!(err.contains("rules[0].effect"), "{err}");
    assert_eq!(
        show(&env, &env.key_file)["files"][0]["trusted_version"],
        before
    );

    // Review, then sign only what was reviewed: a swap in between is refused.
    let reviewed_text = format!("{ALLOW_DOCS}# reviewed\n");
    std::fs::write(env.root().join(".gaffer/policy.yaml"), &reviewed_text).unwrap();
    let shown = show(&env, &env.key_file);
    assert_eq!(shown["files"][0]["file"], "policy.yaml");
    assert_eq!(shown["files"][0]["status"], "changed");
    let pin = format!(
        "policy.yaml={}",
        shown["files"][0]["sha256"].as_str().unwrap()
    );
    std::fs::write(env.root().join(".gaffer/policy.yaml"), "rules: []\n").unwrap();
    let (code, _, err) = env.cli(&["trust", "--expect", &pin]);
    assert_ne!(code, 0);
    assert!(err.contains("not the expected"), "{err}");
    std::fs::write(env.root().join(".gaffer/policy.yaml"), &reviewed_text).unwrap();
    assert_eq!(
        status_in(&show(&env, &env.key_file), "policy.yaml"),
        "changed"
    );
    let (code, out, err) = env.cli(&["trust", "--expect", &pin]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        status_in(&show(&env, &env.key_file), "policy.yaml"),
        "trusted"
    );

    // Deleting a trusted file is drift too: the trusted content still holds.
    std::fs::remove_file(env.root().join(".gaffer/policy.yaml")).unwrap();
    assert_eq!(
        status_in(&show(&env, &env.key_file), "policy.yaml"),
        "deleted"
    );
}

#[test]
fn without_an_operator_key_nothing_is_trusted() {
    // Signed files, but this server cannot find the key that would verify them.
    let env = Env::new(Some(ALLOW_DOCS));
    let nowhere = env._cfg.path().join("missing.key").display().to_string();
    // Without the key no credential can be checked either: the agent is anonymous.
    let mut a = env.start(&[("GAFFER_OPERATOR_KEY_FILE", nowhere.as_str())]);
    a.call("initialize", json!({"clientInfo": {"name": "agent-1"}}));
    let c = catalog(&mut a);
    assert_eq!(c["trust"]["policy"], "no_operator_key", "{c}");
    assert_eq!(c["trust"]["providers"], "no_operator_key", "{c}");
    assert_eq!(c["untrusted_policy"], true);
    assert!(catalog_names(&c).iter().all(|n| !n.starts_with("kv.")));
    let p = ok(&submit(
        &mut a,
        "file.write",
        json!({"path": "docs/a.md"}),
        json!({"content": "x"}),
        "nokey",
    ))
    .clone();
    assert_eq!(p["state"], "pending", "{p}");
    let d = ok(&submit(
        &mut a,
        "file.write",
        json!({"path": "secret/k"}),
        json!({"content": "x"}),
        "nokey-deny",
    ))
    .clone();
    assert_eq!(d["state"], "denied", "{d}");
    assert!(!env.root().join("docs/a.md").exists());
}

// ---------- crash right after the submit commit; a plan swapped under a signed approval ----------

#[test]
fn crash_after_submit_is_recovered_on_restart() {
    let env = Env::new(Some(ALLOW_DOCS));
    let kv_submit = json!({"operation": "kv.set", "target": {"key": "crash"}, "arguments": {"value": 1}, "reason": "needed for the task", "idempotency_key": "crash-kv"});
    let run_submit = json!({"operation": "command.run", "target": {"argv": ["sh", "-c", "echo run >> counter.log"]}, "arguments": {}, "reason": "count", "idempotency_key": "crash-run"});
    let crash = |params: &Value| {
        let mut a = env.agent_env("agent-1", &[("GAFFER_TEST_FAILPOINT", "after_submit")]);
        a.send_request("operations/submit", params.clone());
        assert_eq!(
            common::wait_exit(&mut a.child, Duration::from_secs(10)),
            86,
            "the failpoint should have ended the process\n{}",
            env.logs()
        );
    };
    let one_id = |s: &mut Server, key: &str| -> String {
        let list = s.call("operations/list", json!({}));
        let found: Vec<&Value> = list["operations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["idempotency_key"] == key)
            .collect();
        assert_eq!(found.len(), 1, "{key} should exist exactly once: {list}");
        found[0]["id"].as_str().unwrap().to_string()
    };

    // 1. A request: the pending operation and its approval request survive the crash.
    crash(&kv_submit);
    let mut b = env.agent("agent-1");
    let kv_id = one_id(&mut b, "crash-kv");
    assert_eq!(
        b.call("operations/get", json!({"id": kv_id}))["state"],
        "pending"
    );
    let r = b.request("operations/submit", kv_submit.clone());
    assert_eq!(ok(&r)["id"], kv_id.as_str(), "{r}");
    assert_eq!(ok(&r)["created"], false, "{r}");
    let mut op = env.operator();
    approve(&env, &mut op, &kv_id);
    let v = wait_state(&mut b, &kv_id, &["succeeded", "failed"]);
    assert_eq!(v["state"], "succeeded", "{v}");
    let r = b.request("operations/submit", kv_submit.clone());
    assert_eq!(ok(&r)["id"], kv_id.as_str());
    assert_eq!(ok(&r)["created"], false);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(lines(&env.root().join("kv-exec.log")), 1);
    drop(op);
    drop(b);

    // 2. A static allow claims in the submit commit, so the crash leaves it `executing` with
    // a dead executor: recovery must not run it again (at most once), and says the outcome
    // is unknown.
    crash(&run_submit);
    let mut c = env.agent("agent-1");
    let run_id = one_id(&mut c, "crash-run");
    let v = wait_state(&mut c, &run_id, &["succeeded", "failed"]);
    assert_eq!(v["state"], "failed", "{v}");
    assert_eq!(v["error"]["code"], "upstream_result_unknown", "{v}");
    let r = c.request("operations/submit", run_submit.clone());
    assert_eq!(ok(&r)["id"], run_id.as_str(), "{r}");
    assert_eq!(ok(&r)["created"], false, "{r}");
    assert_eq!(ok(&r)["state"], "failed", "{r}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(lines(&env.root().join("counter.log")), 0);
    // Still one operation per key after all of it.
    one_id(&mut c, "crash-kv");
    one_id(&mut c, "crash-run");
}

#[test]
fn a_tampered_plan_in_the_journal_is_refused_at_execution() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut a = env.agent("agent-1");
    let p = ok(&submit(
        &mut a,
        "file.write",
        json!({"path": "src/a.md"}),
        json!({"content": "approved"}),
        "t",
    ))
    .clone();
    assert_eq!(p["state"], "pending", "{p}");
    let id = p["id"].as_str().unwrap().to_string();
    drop(a);
    // The operator approves while no server runs, so nothing executes yet.
    let (code, out, err) = env.approve_reviewed(&id, &[]);
    assert_eq!(code, 0, "{out}{err}");
    let decided: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(decided["status"], "active", "{decided}");
    // The agent appends an operation of its own to the journal, carrying the operator's
    // signed approval but a plan that writes somewhere else.
    let forged_id = {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let ws = gaffer::workspace::Workspace::open(env.root()).unwrap();
            let (orig, approval) = ws.read(|s| {
                let o = s.operations.get(&id).unwrap().clone();
                let a = s.operations.approval_of(&o).unwrap().clone();
                (o, a)
            });
            assert_eq!(
                approval.status,
                gaffer::operations::state::ApprovalStatus::Active
            );
            // A distinct id of the same shape that sorts first, so recovery claims the forged
            // operation before the real one spends the approval's single use: then only the
            // plan binding stands between the forged plan and its execution.
            let at = orig.id[3..].find(|c| c != '-').unwrap() + 3;
            let forged_id = format!("{}-{}", &orig.id[..at], &orig.id[at + 1..]);
            assert!(forged_id < orig.id);
            let text = orig
                .plan
                .clone()
                .unwrap()
                .replace("src/a.md", "src/pwned.md")
                .replace(&orig.id, &forged_id);
            let plan: gaffer::operations::plan::Plan = serde_json::from_str(&text).unwrap();
            assert_eq!(plan.target["path"], "src/pwned.md", "{text}");
            let plan_text = plan.canonical();
            let mut forged = orig.clone();
            forged.id = forged_id.clone();
            forged.idempotency_key = "forged".into();
            forged.target = json!({"path": "src/pwned.md"}).into();
            forged.state = gaffer::operations::lifecycle::OpState::Approved;
            forged.revision = 1;
            forged.plan_digest = Some(gaffer::operations::plan::Plan::digest_of(&plan_text));
            forged.plan = Some(plan_text);
            let created = gaffer::operations::state::Created {
                operation: forged,
                approval: None,
            };
            ws.commit(move |_s: &gaffer::workspace::State| {
                Ok::<_, String>((
                    vec![gaffer::workspace::NewRecord::new("operation.created", &created).unwrap()],
                    (),
                ))
            })
            .await
            .map_err(|_| "commit")
            .unwrap();
            let seen = ws.read(|s| s.operations.get(&forged_id).map(|o| o.state));
            assert_eq!(
                seen,
                Some(gaffer::operations::lifecycle::OpState::Approved),
                "the forged record should have been folded in"
            );
            forged_id
        })
    };
    // A server starting now drives both approved operations.
    let mut b = env.agent("agent-1");
    let v = wait_state(&mut b, &forged_id, &["succeeded", "failed"]);
    assert_eq!(v["state"], "failed", "{v}\n{}", env.logs());
    assert_eq!(v["error"]["code"], "approval_invalid", "{v}");
    let v = wait_state(&mut b, &id, &["succeeded", "failed"]);
    assert_eq!(v["state"], "succeeded", "{v}");
    assert_eq!(
        std::fs::read_to_string(env.root().join("src/a.md")).unwrap(),
        "approved"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(!env.root().join("src/pwned.md").exists());
}
