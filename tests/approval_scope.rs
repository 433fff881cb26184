//! What one operator approval grants (mode, uses, duration) comes from the currently trusted
//! policy for the plan, never from the stored request: the agent can append a well-framed,
//! chained `operation.created` whose pending approval asks for a 50-use, 24-hour window under
//! a rule that grants one execution (review F1). Played on the real binary: `gaffer approve`,
//! the editors' `approvals/prepare` + `approvals/decide`, and a window used after the policy
//! was narrowed.

mod common;

use std::path::Path;

use common::gate::*;
use gaffer::operations::policy::GrantMode;
use serde_json::{Value, json};

/// `notes/**` waits for one-execution approvals; `drafts/**` for 2-use windows.
const POLICY: &str = r#"
rules:
  - id: notes
    effect: request
    clients: ["agent-1"]
    operations: ["file.write"]
    targets: [{kind: file, fields: {path: ["notes/**"]}}]
    grant_policy: {mode: execution, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10}
  - id: drafts
    effect: request
    clients: ["agent-1"]
    operations: ["file.write"]
    targets: [{kind: file, fields: {path: ["drafts/**"]}}]
    grant_policy: {mode: window, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10, default_max_uses: 2, max_uses: 3}
"#;

/// What the forged request asks for: (mode, uses, seconds).
type Asked = (GrantMode, u32, u64);

const FORGED_WINDOW: Asked = (GrantMode::Window, 50, 86_400);

fn forge_request(root: &Path, id: &str, path: &str, content: &str, asked: Asked) {
    forge_file_write_request(root, "agent-1", id, path, content, asked);
}

/// `gaffer approve ARGS…`: (exit code, stdout as JSON, stderr).
fn approve_cli(env: &Env, args: &[&str]) -> (i32, Value, String) {
    let (code, out, err) = env.approve_reviewed(args[0], &args[1..]);
    let v = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
    (code, v, err)
}

fn read(env: &Env, path: &str) -> Option<String> {
    std::fs::read_to_string(env.root().join(path)).ok()
}

fn write(s: &mut common::Server, path: &str, content: &str, key: &str) -> Value {
    ok(&submit(
        s,
        "file.write",
        json!({ "path": path }),
        json!({ "content": content }),
        key,
    ))
    .clone()
}

fn id(v: &Value) -> &str {
    v["id"].as_str().unwrap()
}

/// The attack as played in the review: the operator runs `gaffer approve` on the forged
/// request, then the agent writes the same path again with content nobody reviewed.
#[test]
fn f1_a_forged_window_request_is_refused_before_signing_and_grants_nothing() {
    let env = Env::new(Some(POLICY));
    let mut agent = env.agent("agent-1"); // a serving process that executes approved work
    forge_request(
        env.root(),
        "op_f1",
        "notes/todo.txt",
        "- buy milk\n",
        FORGED_WINDOW,
    );
    let (code, out, err) = approve_cli(&env, &["op_f1"]);
    assert_ne!(code, 0, "the forged scope was signed: {out} {err}");
    assert_eq!(out["error"]["code"], "approval_exceeds_policy", "{out}");
    let why = out["error"]["message"].as_str().unwrap();
    for differs in ["mode window", "max_uses 50", "duration 86400 s"] {
        assert!(why.contains(differs), "the refusal names {differs}: {why}");
    }
    // Refused while preparing: the operator key signed nothing.
    assert!(!err.contains("signing with the operator key"), "{err}");
    // Narrowing cannot turn a window into one execution: still refused.
    let (code, out, _) = approve_cli(&env, &["op_f1", "--max-uses", "1"]);
    assert_ne!(code, 0, "{out}");
    assert_eq!(out["error"]["code"], "approval_exceeds_policy", "{out}");
    // The editors' path (prepare, sign what the server prepared, decide) is refused alike.
    let mut op = env.operator();
    let r = env.decide(
        &mut op,
        json!({"id": "op_f1", "decision": "approve", "expected_revision": 1, "idempotency_key": "ed"}),
    );
    assert_eq!(err_code(&r), "approval_exceeds_policy", "{r}");
    let a = op.call("approvals/get", json!({"id": "op_f1"}));
    assert_eq!(a["status"], "pending", "{a}");
    // The agent's next write of that path is no use of any window: it waits for a human.
    let evil = write(&mut agent, "notes/todo.txt", "AGENT CONTENT\n", "evil");
    assert_eq!(evil["state"], "pending", "{evil}");
    assert_ne!(evil["approval_id"], a["approval_id"], "{evil}");
    assert_eq!(read(&env, "notes/todo.txt"), None, "nothing was written");
}

/// A payload signed with the operator's key over the forged scope (as a gaffer that copied
/// the stored request prepared it, or a hand-made one through `gaffer operator sign`) is not
/// recorded: `approvals/decide` bounds what it records by the policy itself.
#[test]
fn f1_a_decision_signed_over_a_forged_scope_is_not_recorded() {
    let env = Env::new(Some(POLICY));
    let mut agent = env.agent("agent-1");
    forge_request(
        env.root(),
        "op_f1s",
        "notes/todo.txt",
        "- buy milk\n",
        FORGED_WINDOW,
    );
    let mut op = env.operator();
    let a = op.call("approvals/get", json!({"id": "op_f1s"}));
    let ws = gaffer::workspace::Workspace::open(env.root()).unwrap();
    let now = gaffer::util::now_ms();
    let payload = gaffer::operations::decision::DecisionPayload {
        domain: "gaffer/decision/v1".into(),
        workspace_id: ws.workspace_id().unwrap(),
        approval_id: "ap_op_f1s".into(),
        operation_id: "op_f1s".into(),
        client: "agent-1".into(),
        operation: "file.write".into(),
        plan_digest: a["plan_digest"].as_str().unwrap().into(),
        classification_digest: gaffer::operations::decision::classification_digest(
            &serde_json::from_value(a["classification"].clone()).unwrap(),
        ),
        mode: GrantMode::Window,
        decision: gaffer::operations::state::DecisionKind::Approve,
        revision: 2,
        decided_at_ms: now,
        expires_at_ms: Some(now + 86_400_000),
        max_uses: 50,
        narrowed_duration_seconds: None,
        narrowed_max_uses: None,
        reason: None,
        head: ws.journal_head(),
    };
    drop(ws);
    let sig = gaffer::operator::OperatorSignature::sign(&env.signer(), &payload);
    let r = op.request(
        "approvals/decide",
        json!({"payload": sig.payload, "signature": sig.signature, "idempotency_key": "old"}),
    );
    assert_eq!(err_code(&r), "approval_exceeds_policy", "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("mode window") && msg.contains("max_uses 50"),
        "{msg}"
    );
    let a = op.call("approvals/get", json!({"id": "op_f1s"}));
    assert_eq!(a["status"], "pending", "{a}");
    let evil = write(&mut agent, "notes/todo.txt", "AGENT CONTENT\n", "evil");
    assert_eq!(evil["state"], "pending", "{evil}");
    assert_eq!(read(&env, "notes/todo.txt"), None);
}

/// A forged one-execution request that asks for 50 uses and a day: refused as it stands,
/// naming what exceeds the policy; narrowed to what the policy grants, still refused, since
/// no gaffer on this machine accepted it. Nothing is written, and the agent's next write of
/// the path waits for a human.
#[test]
fn f1_a_forged_request_narrowed_within_the_policy_is_still_not_approved() {
    let env = Env::new(Some(POLICY));
    let mut agent = env.agent("agent-1");
    let asked = (GrantMode::Execution, 50, 86_400);
    forge_request(env.root(), "op_n", "notes/todo.txt", "- buy milk\n", asked);
    let (code, out, _) = approve_cli(&env, &["op_n"]);
    assert_ne!(code, 0, "{out}");
    let why = out["error"]["message"].as_str().unwrap();
    assert!(
        why.contains("max_uses 50") && why.contains("duration 86400 s"),
        "{why}"
    );
    assert!(!why.contains("mode window"), "{why}");
    let narrow = ["op_n", "--max-uses", "1", "--duration-seconds", "300"];
    let (code, out, err) = approve_cli(&env, &narrow);
    assert_ne!(code, 0, "{out} {err}");
    assert_eq!(out["error"]["code"], "request_unverified", "{out}");
    assert_eq!(read(&env, "notes/todo.txt"), None);
    let evil = write(&mut agent, "notes/todo.txt", "AGENT CONTENT\n", "evil");
    assert_eq!(evil["state"], "pending", "{evil}");
    assert_eq!(read(&env, "notes/todo.txt"), None);
}

/// A trusted window rule still yields a working window through `gaffer approve`, which shows
/// what it signs first; `--max-uses 1` still narrows one to a single use.
#[test]
fn a_window_rule_yields_a_working_window_and_narrowing_still_narrows() {
    let env = Env::new(Some(POLICY));
    let mut agent = env.agent("agent-1");
    let first = write(&mut agent, "drafts/a.md", "1", "a1");
    assert_eq!(first["state"], "pending", "{first}");
    let (code, out, err) = approve_cli(&env, &[id(&first)]);
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(out["mode"], "window", "{out}");
    for shown in [
        "signing with the operator key",
        "Write drafts/a.md",
        "mode: window (up to 2 operations",
        "max_uses: 2",
        "expires: ",
        "(in 300 s)",
    ] {
        assert!(
            err.contains(shown),
            "gaffer approve shows {shown:?} first: {err}"
        );
    }
    let v = wait_state(&mut agent, id(&first), &["succeeded", "failed"]);
    assert_eq!(v["state"], "succeeded", "{v}");
    let second = write(&mut agent, "drafts/a.md", "2", "a2");
    assert_eq!(second["approval_id"], first["approval_id"], "{second}");
    let v = wait_state(&mut agent, id(&second), &["succeeded", "failed"]);
    assert_eq!(v["state"], "succeeded", "{v}");
    assert_eq!(read(&env, "drafts/a.md").as_deref(), Some("2"));
    let third = write(&mut agent, "drafts/a.md", "3", "a3");
    assert_eq!(third["state"], "pending", "two uses spent: {third}");
    // Narrowed to one use, the window covers its own write and no other.
    let b = write(&mut agent, "drafts/b.md", "1", "b1");
    let (code, out, err) = approve_cli(&env, &[id(&b), "--max-uses", "1"]);
    assert_eq!(code, 0, "{out} {err}");
    assert!(err.contains("max_uses: 1"), "{err}");
    let v = wait_state(&mut agent, id(&b), &["succeeded", "failed"]);
    assert_eq!(v["state"], "succeeded", "{v}");
    let again = write(&mut agent, "drafts/b.md", "2", "b2");
    assert_eq!(again["state"], "pending", "{again}");
    assert_eq!(read(&env, "drafts/b.md").as_deref(), Some("1"));
}

/// A window covers another plan only within what the policy trusted now grants one approval
/// of it: once the operator narrows the rule to one execution (and trusts it), the window
/// approved before, whose signature still verifies, covers no further write; the next one asks
/// for an approval under the policy as it is now. (The claim's own check of a window against
/// the policy is `authorize::tests::a_window_wider_than_the_policy_covers_only_its_own_plan`.)
#[test]
fn a_window_covers_no_other_plan_once_the_trusted_policy_narrows() {
    let env = Env::new(Some(POLICY));
    let mut agent = env.agent("agent-1");
    let first = write(&mut agent, "drafts/c.md", "1", "c1");
    let (code, out, err) = approve_cli(&env, &[id(&first)]);
    assert_eq!(code, 0, "{out} {err}");
    let v = wait_state(&mut agent, id(&first), &["succeeded", "failed"]);
    assert_eq!(v["state"], "succeeded", "{v}");
    let narrowed = POLICY.replace(
        "grant_policy: {mode: window, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10, default_max_uses: 2, max_uses: 3}",
        "grant_policy: {mode: execution, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10}",
    );
    assert_ne!(narrowed, POLICY);
    std::fs::write(env.root().join(".gaffer/policy.yaml"), narrowed).unwrap();
    let before = agent.call("gaffer/status", json!({}))["store"]["seq"].clone();
    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "{out} {err}");
    let seen = agent.call(
        "gaffer/status",
        json!({"after_seq": before, "timeout_ms": 10000}),
    );
    assert_eq!(
        seen["timed_out"], false,
        "the agent's process read the trust: {seen}"
    );
    let second = write(&mut agent, "drafts/c.md", "2", "c2");
    assert_eq!(second["state"], "pending", "{second}");
    assert_ne!(second["approval_id"], first["approval_id"], "{second}");
    let asked = env.cli(&["approvals"]).1;
    let asked: Value = serde_json::from_str(&asked).unwrap();
    let request = asked["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["operation_id"] == second["id"])
        .unwrap_or_else(|| panic!("{asked}"));
    assert_eq!(request["mode"], "execution", "{request}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(read(&env, "drafts/c.md").as_deref(), Some("1"));
}
