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
        summary.contains("secrets [SECRET_TOKEN]") && summary.contains("env:SECRET_TOKEN"),
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
        fields: {{bundle_digest: ["{}"], profile: ["leak"], secrets: ["SECRET_TOKEN"]}}
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
    let first = "print the token backwards, one character per line";
    let (_, w) = common::gate::reader_worker(&mut agent, first);
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
        summary.starts_with(
            "declarations 1 (mount:read 1): mount_grant mount:read:HOME; named home; secrets []"
        ),
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

/// The name the agent gave a declaration that mounts the operator's home for writing: text
/// posing as the end of a harmless summary, then 400 Hangul fillers (blank on a terminal)
/// pushing the real grant and the secret past the summary's bound.
fn posing_name() -> String {
    format!(
        "docs=mount:read:DOCS_DIR]; secrets []; bundle lint sha256:{}; argv [\"sh\", \"-c\", \
         \"cat >/dev/null\"]; input StdinText{}",
        "0".repeat(64),
        "\u{3164}".repeat(400)
    )
}

fn posing_bundle(name: &str) -> Value {
    json!({
        "metadata": {"id": "lint", "revision": "r1", "created_at": "2026-12-01", "provenance": {"source": "e2e"}},
        "profiles": [{"selector": {"kind": "named", "value": "lint"}, "command": ["sh", "-c", "cat >/dev/null"]}],
        "declarations": [
            {"kind": "mount_grant", "name": name, "reference": "mount:write:HOME"},
            {"kind": "secret_ref", "name": "token", "reference": "env:SECRET_TOKEN"},
        ],
    })
}

/// A declaration name is a label, not text: the posing name is refused at sync, by the real
/// binary's `gaffer bundle sync` and by an agent's `bundles/sync`, naming the field, and
/// nothing is stored.
#[test]
fn a_declaration_name_posing_as_a_summary_is_refused_at_sync() {
    let env = Env::new(Some(ASK_TO_START));
    let file = env.root().join("lint.json");
    std::fs::write(&file, posing_bundle(&posing_name()).to_string()).unwrap();
    let (code, out, err) = env.cli(&["bundle", "sync", file.to_str().unwrap()]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(out.contains("declarations[0].name"), "{out}");
    assert!(out.contains("letters, digits and . _ -"), "{out}");
    let mut agent = env.agent("agent");
    let r = agent.request(
        "bundles/sync",
        json!({"bundle": posing_bundle(&posing_name())}),
    );
    assert!(
        r["error"].to_string().contains("declarations[0].name"),
        "{r}"
    );
    for name in ["", "a b", "x=y", &"n".repeat(65), "tok\u{3164}"] {
        let r = agent.request("bundles/sync", json!({"bundle": posing_bundle(name)}));
        assert!(r.get("error").is_some(), "{name:?} was accepted: {r}");
    }
    let (code, out, err) = env.cli(&["bundle", "list"]);
    assert_eq!(code, 0, "{out}{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["bundles"], json!([]), "{out}");
}

/// The agent writes the posing bundle into the store itself (blob and `bundle.synced`
/// record, as write access to `.gaffer/` allows), around sync's checks: the body is held to
/// the same rules when a worker is planned from it, and nothing waits for the operator.
#[test]
fn a_bundle_written_into_the_store_around_sync_meets_the_same_rules() {
    let env = Env::new(Some(ASK_TO_START));
    let mut agent = env.agent("agent");
    let bundle = gaffer::bundles::parse_value(posing_bundle(&posing_name())).unwrap();
    let canonical = gaffer::bundles::digest::canonicalize(&bundle);
    let blob = gaffer::store::put_blob_in(&env.root().join(".gaffer"), &canonical.bytes).unwrap();
    let summary = json!({
        "id": "lint", "digest": canonical.digest, "digest_algorithm": "sha256",
        "revision": "r1", "created_at": "2026-12-01", "provenance": {"source": "e2e"},
        "profile_count": 1, "declaration_count": 2,
        "profiles": [{"kind": "named", "value": "lint"}], "size_bytes": canonical.bytes.len(),
    });
    common::gate::append_as_agent(
        env.root(),
        vec![(
            "bundle.synced",
            json!({"id": "lint", "digest": canonical.digest, "blob": blob, "summary": summary}),
        )],
    );
    let reference = json!({"id": "lint", "digest": canonical.digest});
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        let r = agent.request("bundles/check", json!(reference.clone()));
        if r.get("error").is_none() || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(r.get("error").is_none(), "the forged record is folded: {r}");
    let r = agent.request(
        "workers/create",
        json!({"profile": {"kind": "named", "value": "lint"}, "config_bundle": reference}),
    );
    let text = r.to_string();
    assert!(
        text.contains("boundary rules") && text.contains(".name"),
        "{r}"
    );
    let mut op = env.operator();
    let listed = op.call("approvals/list", json!({}));
    assert_eq!(listed["approvals"], json!([]), "{listed}");
}

/// Many declarations with the longest names allowed, a padded argv and a long first input:
/// the summary the operator approves from still names every declaration's kind and reference,
/// with the count of each grant first and the riskiest first, and a cut says how much it left
/// out.
#[test]
fn a_worker_starts_summary_shows_every_grant_of_a_long_valid_set() {
    let env = Env::new(Some(ASK_TO_START));
    let docs = env.root().display().to_string();
    let vars: Vec<(String, &str)> = (0..5)
        .map(|i| (format!("DOCS_DIR_{i}"), docs.as_str()))
        .collect();
    let mut extra: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    extra.push(SECRET_ENV);
    let mut agent = env.agent_env("agent", &extra);
    let mut decls: Vec<Value> = (0..5)
        .map(|i| {
            json!({"kind": "mount_grant", "name": format!("{i}").repeat(64),
                   "reference": format!("mount:read:DOCS_DIR_{i}")})
        })
        .collect();
    decls.push(
        json!({"kind": "mount_grant", "name": "h".repeat(64), "reference": "mount:write:HOME"}),
    );
    decls.push(json!({"kind": "network_policy", "name": "n".repeat(64), "reference": "network:tcp-connect:443"}));
    decls.push(
        json!({"kind": "secret_ref", "name": "t".repeat(64), "reference": "env:SECRET_TOKEN"}),
    );
    let bundle = json!({
        "metadata": {"id": "many", "revision": "r1", "created_at": "2026-12-01", "provenance": {"source": "e2e"}},
        "profiles": [{"selector": {"kind": "named", "value": "lint"},
                      "command": ["sh", "-c", format!("cat >/dev/null # {}", "lint only. ".repeat(20))]}],
        "declarations": decls,
    });
    let reference = agent.call("bundles/sync", json!({"bundle": bundle}))["reference"].clone();
    let w = agent.call(
        "workers/create",
        json!({"profile": {"kind": "named", "value": "lint"}, "config_bundle": reference,
               "initial_input": "Please lint the files. ".repeat(12)}),
    )["worker"]
        .clone();
    let mut op = env.operator();
    let got = op.call("operations/get", json!({"id": w["operation_id"]}));
    let summary = got["presentation"]["summary"].as_str().unwrap();
    assert!(summary.chars().count() <= 500, "{summary}");
    assert!(
        summary.starts_with(
            "declarations 8 (mount:write 1, network:tcp-connect 1, env 1, mount:read 5): \
             mount_grant mount:write:HOME, "
        ),
        "{summary}"
    );
    for d in &decls {
        let grant = format!(
            "{} {}",
            d["kind"].as_str().unwrap(),
            d["reference"].as_str().unwrap()
        );
        assert!(summary.contains(&grant), "{grant} is not shown: {summary}");
    }
    assert!(
        summary.contains("more characters"),
        "a cut says so: {summary}"
    );
}
