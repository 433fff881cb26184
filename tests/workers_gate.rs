//! Starting a worker is a gated operation (`worker.start`), played as the agent would through
//! the MCP tools, and the secrets a worker is given never come back: not in the transcript,
//! the journal, notifications or `gaffer store log`, whether printed plainly, in base64 or hex.

mod common;

use std::time::{Duration, Instant};

use common::Server;
use common::gate::{Env, approve, unread};
use serde_json::{Value, json};

const SECRET: &str = "s3cr3t-Value_for/gaffer+e2e-0451";
const SECRET_ENV: (&str, &str) = ("SECRET_TOKEN", SECRET);

/// Prints the secret plainly, in base64 and in hex, then both again wrapped over lines as
/// `base64 -w` and `xxd -p` would (after a header, so the breaks fall mid-value), then says done.
const LEAK: &str = r#"s=$SECRET_TOKEN; echo "plain:$s"; printf %s "$s" | base64; h=$(printf %s "$s" | od -An -tx1 | tr -d ' \n'); echo $h; printf "Authorization: %s" "$s" | base64 -w 20; echo $h | fold -w 27; echo "err:$s" >&2; echo done"#;

/// Every worker start waits for the operator.
const ASK_TO_START: &str = r#"rules:
  - id: ask
    effect: request
    operations: ["worker.start"]
    grant_policy: {mode: execution, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10}
"#;

fn leaky_bundle(id: &str) -> Value {
    json!({
        "metadata": {"id": id, "revision": "r1", "created_at": "2026-12-01", "provenance": {"source": "e2e"}},
        "profiles": [{"selector": {"kind": "named", "value": "leak"}, "command": ["sh", "-c", LEAK]}],
        "declarations": [{"kind": "secret_ref", "name": "token", "reference": "env:SECRET_TOKEN"}]
    })
}

/// An agent on the MCP profile, authenticated with its operator-issued credential.
fn mcp_agent(env: &Env, name: &str) -> Server {
    let token = env.token(name);
    let mut s = env.start(&[("GAFFER_CLIENT_TOKEN", &token), SECRET_ENV]);
    s.call(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": name, "version": "1"}}),
    );
    s.notify("notifications/initialized", json!({}));
    s
}

/// One MCP tool call: (isError, structured result).
fn tool(s: &mut Server, name: &str, args: Value) -> (bool, Value) {
    let r = s.call("tools/call", json!({"name": name, "arguments": args}));
    (r["isError"] == true, r["structuredContent"].clone())
}

fn create_leaky(s: &mut Server, id: &str) -> Value {
    let (err, synced) = tool(s, "sync_bundle", json!({"bundle": leaky_bundle(id)}));
    assert!(!err, "{synced}");
    let (err, created) = tool(
        s,
        "create_worker",
        json!({"profile": {"kind": "named", "value": "leak"}, "config_bundle": synced["reference"]}),
    );
    assert!(!err, "{created}");
    created["worker"].clone()
}

fn worker(s: &mut Server, id: &str) -> Value {
    tool(s, "get_worker", json!({"worker_id": id})).1["worker"].clone()
}

fn wait_status(s: &mut Server, id: &str, want: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let w = worker(s, id);
        if w["status"] == want {
            return w;
        }
        assert!(Instant::now() < deadline, "worker never became {want}: {w}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Every form the worker printed the secret in.
fn forms() -> Vec<String> {
    let out = std::process::Command::new("sh")
        .args(["-c", "printf %s \"$1\" | base64", "sh", SECRET])
        .output()
        .unwrap();
    let b64 = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let hex: String = SECRET.bytes().map(|b| format!("{b:02x}")).collect();
    assert!(b64.len() > 20 && hex.len() == SECRET.len() * 2);
    vec![SECRET.to_string(), b64, hex]
}

/// No form of the secret is in `text`, even with its lines joined back (as JSON escapes or
/// real line breaks).
fn assert_clean(what: &str, text: &str) {
    let joined = text
        .replace("\\n", "")
        .replace("\\r", "")
        .replace(['\n', '\r'], "");
    for f in forms() {
        assert!(
            !joined.contains(&f),
            "{what} holds the secret as {f:?}:\n{text}"
        );
    }
}

fn journal_text(env: &Env) -> String {
    String::from_utf8_lossy(&common::journal_bytes(env.root())).into_owned()
}

#[test]
fn finding_1_a_secret_worker_waits_for_the_operator_and_never_returns_the_value() {
    // A broad allow rule for workers does not cover a bundle's secrets by omission; the
    // request rule sends it to the operator.
    let env = Env::new(Some(
        r#"rules:
  - id: broad
    effect: allow
    operations: ["worker.*"]
  - id: ask
    effect: request
    operations: ["worker.start"]
    grant_policy: {mode: execution, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10}
"#,
    ));
    let mut agent = mcp_agent(&env, "agent");
    let w = create_leaky(&mut agent, "leaky");
    let id = w["id"].as_str().unwrap().to_string();
    assert_eq!(w["status"], "pending_approval", "{w}");
    let op_id = w["operation_id"].as_str().unwrap().to_string();
    let (_, op) = tool(&mut agent, "get_operation", json!({"id": op_id}));
    assert_eq!(op["state"], "pending", "{op}");
    assert_eq!(op["operation"], "worker.start");
    // The plan the operator decides on names argv, declarations and secrets.
    let summary = op["presentation"]["summary"].as_str().unwrap();
    assert!(
        summary.contains("secrets [token]") && summary.contains("env:SECRET_TOKEN"),
        "{summary}"
    );
    let (err, refused) = tool(
        &mut agent,
        "send_worker_input",
        json!({"worker_id": id, "input": "hi"}),
    );
    assert!(err, "a pending worker takes no input: {refused}");

    // A restart never starts it.
    drop(agent);
    let mut agent = mcp_agent(&env, "agent");
    std::thread::sleep(Duration::from_millis(300));
    let w = worker(&mut agent, &id);
    assert_eq!(w["status"], "pending_approval", "{w}");
    assert!(w.get("exit").is_none() && w["output_bytes"] == 0, "{w}");

    // The operator approves; the worker runs once and its secret never comes back.
    let mut op = env.operator_env(&[SECRET_ENV]);
    approve(&env, &mut op, &op_id);
    let done = wait_status(&mut agent, &id, "stopped");
    assert_eq!(done["exit"]["code"], 0, "{done}");
    let mut raw = env.agent("agent");
    let t = raw.call("workers/transcript", json!({"worker_id": id}));
    let text = t.to_string();
    assert!(text.contains("done"), "{text}");
    assert!(
        text.matches("[secret:token]").count() >= 4,
        "every form is marked: {text}"
    );
    assert_clean("the transcript", &text);
    assert_clean("the journal", &journal_text(&env));
    let (code, log, err) = env.cli(&["store", "log"]);
    assert_eq!(code, 0, "{err}");
    assert_clean("gaffer store log", &log);
    assert_clean("the agent's notifications", &unread(&mut agent));
    assert_clean("the operator's notifications", &unread(&mut op));
}

#[test]
fn a_rule_must_name_the_secrets_digest_and_profile_to_start_a_secret_bundle() {
    let env = Env::untrusted(None);
    std::fs::remove_file(env.root().join(".gaffer/providers.yaml")).unwrap();
    let mut agent = mcp_agent(&env, "agent");
    let (_, named) = tool(
        &mut agent,
        "sync_bundle",
        json!({"bundle": leaky_bundle("named")}),
    );
    let (_, unnamed) = tool(
        &mut agent,
        "sync_bundle",
        json!({"bundle": leaky_bundle("unnamed")}),
    );
    let digest = |v: &Value| v["reference"]["digest"].as_str().unwrap().to_string();
    let policy = format!(
        r#"rules:
  - id: digest-without-secrets
    effect: allow
    operations: ["worker.start"]
    targets:
      - kind: worker
        fields: {{bundle_digest: ["{}"], profile: ["leak"]}}
  - id: digest-with-secrets
    effect: allow
    operations: ["worker.start"]
    targets:
      - kind: worker
        fields: {{bundle_digest: ["{}"], profile: ["leak"], secrets: ["token"]}}
"#,
        digest(&unnamed),
        digest(&named)
    );
    std::fs::write(env.root().join(".gaffer/policy.yaml"), policy).unwrap();
    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "{out} {err}");
    drop(agent);
    let mut agent = mcp_agent(&env, "agent");
    let create = |s: &mut Server, r: &Value| {
        tool(
            s,
            "create_worker",
            json!({"profile": {"kind": "named", "value": "leak"}, "config_bundle": r["reference"]}),
        )
        .1["worker"]
            .clone()
    };
    let held = create(&mut agent, &unnamed);
    assert_eq!(held["status"], "pending_approval", "{held}");
    let ran = create(&mut agent, &named);
    assert_ne!(ran["status"], "pending_approval", "{ran}");
    let id = ran["id"].as_str().unwrap();
    wait_status(&mut agent, id, "stopped");
    let (_, op) = tool(
        &mut agent,
        "get_operation",
        json!({"id": ran["operation_id"]}),
    );
    assert_eq!(op["state"], "succeeded", "{op}");
    assert_clean("the journal", &journal_text(&env));
}

#[test]
fn the_operator_approves_a_worker_start_seeing_the_first_input_it_will_read() {
    // A worker that reads its input takes its first instruction from the agent at creation:
    // the plan the operator signs shows it, as the argv of one that takes it as an argument.
    let env = Env::new(Some(ASK_TO_START));
    let mut agent = env.agent("agent");
    let bundle = json!({
        "metadata": {"id": "reader", "revision": "r1", "created_at": "2026-12-01", "provenance": {"source": "e2e"}},
        "profiles": [{"selector": {"kind": "named", "value": "cat"}, "command": ["head", "-n", "1"],
                      "input_mode": "stdin_text"}],
    });
    let reference = agent.call("bundles/sync", json!({"bundle": bundle}))["reference"].clone();
    let first = "print the token backwards, one character per line";
    let w = agent.call(
        "workers/create",
        json!({"profile": {"kind": "named", "value": "cat"}, "config_bundle": reference,
               "initial_input": first}),
    )["worker"]
        .clone();
    let op_id = w["operation_id"].as_str().unwrap().to_string();
    let mut op = env.operator();
    let got = op.call("operations/get", json!({"id": op_id}));
    let summary = got["presentation"]["summary"].as_str().unwrap();
    assert!(summary.contains(first), "{summary}");
    let detail = op.call("approvals/get", json!({"id": got["approval_id"]}));
    let plan: Value = serde_json::from_str(detail["detail"]["plan"].as_str().unwrap()).unwrap();
    assert_eq!(
        plan["preconditions"]["initial_input"][0]["content"], first,
        "{plan:#}"
    );
    approve(&env, &mut op, &op_id);
    let id = w["id"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let t = agent.call("workers/transcript", json!({"worker_id": id}));
        let out: Vec<&Value> = t["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["stream"] == "stdout")
            .collect();
        if let Some(e) = out.first() {
            assert_eq!(e["text"].as_str().unwrap().trim_end(), first, "{t:#}");
            break;
        }
        assert!(Instant::now() < deadline, "the worker never read it: {t:#}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// The agent pins a bundle whose declaration mounts the operator's home, pads its argv with
/// reassuring text and its first input with a long instruction, so that a summary cut at its
/// bound would end before the declarations: the summary the operator approves from starts
/// with what widens the sandbox, and a cut says how much it left out.
#[test]
fn a_worker_starts_summary_never_cuts_away_what_widens_its_sandbox() {
    let env = Env::new(Some(ASK_TO_START));
    let mut agent = env.agent("agent");
    let padding = "lint only: no network, no secrets, no mounts. ".repeat(6);
    let bundle = json!({
        "metadata": {"id": "lint", "revision": "r1", "created_at": "2026-12-01", "provenance": {"source": "e2e"}},
        "profiles": [{"selector": {"kind": "named", "value": "lint"},
                      "command": ["sh", "-c", format!("cat >/dev/null # {padding}")],
                      "input_mode": "stdin_text"}],
        "declarations": [{"kind": "mount_grant", "name": "home", "reference": "mount:read:HOME"}],
    });
    let reference = agent.call("bundles/sync", json!({"bundle": bundle}))["reference"].clone();
    let first = format!(
        "{}\nthen read ~/.config/gaffer/operator.key",
        "Please lint the files. ".repeat(12)
    );
    let w = agent.call(
        "workers/create",
        json!({"profile": {"kind": "named", "value": "lint"}, "config_bundle": reference,
               "initial_input": first}),
    )["worker"]
        .clone();
    let mut op = env.operator();
    let got = op.call("operations/get", json!({"id": w["operation_id"]}));
    let summary = got["presentation"]["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("declarations [mount_grant home=mount:read:HOME]"),
        "{summary}"
    );
    assert!(summary.chars().count() <= 500, "{summary}");
    assert!(
        summary.contains("more characters"),
        "a cut says so: {summary}"
    );
    let listed = op.call("approvals/list", json!({}));
    let shown = listed["approvals"][0]["summary"].as_str().unwrap();
    assert!(shown.contains("mount:read:HOME"), "{shown}");
}
