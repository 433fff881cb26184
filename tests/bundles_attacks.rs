//! The agent against config bundles and worker start: declarations whose spelling is not what
//! the sandbox and the secret injection act on, so that a trusted policy rule decides on one
//! thing and the worker gets another. Played as the agent would: it writes only its bundle and
//! talks to gaffer over its own connection; the policy is the operator's, trusted. (An attack
//! pass's findings: each test failed before its fix.)

mod common;

use std::io::Read as _;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::Server;
use common::gate::Env;
use serde_json::{Value, json};

const GITHUB: (&str, &str) = ("GITHUB_TOKEN", "ghp_operator-github-token-0451");
const AWS: (&str, &str) = ("OPERATOR_AWS_KEY", "aws-operator-secret-key-9731");

fn tool(s: &mut Server, name: &str, args: Value) -> (bool, Value) {
    let r = s.call("tools/call", json!({"name": name, "arguments": args}));
    (r["isError"] == true, r["structuredContent"].clone())
}

/// An MCP agent authenticated as `name`, served by a gaffer whose environment holds `extra`
/// (the operator's environment: an editor or agent host started it with the operator's secrets).
fn mcp_agent(env: &Env, name: &str, extra: &[(&str, &str)]) -> Server {
    let token = env.token(name);
    let mut vars = vec![("GAFFER_CLIENT_TOKEN", token.as_str())];
    vars.extend_from_slice(extra);
    let mut s = env.start(&vars);
    s.call(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": name, "version": "1"}}),
    );
    s.notify("notifications/initialized", json!({}));
    s
}

/// The agent syncs `bundle` and creates a worker of its `profile`: the create answer and the
/// worker's id (empty when none was issued). `None` when the bundle was refused at sync.
fn sync_and_create(s: &mut Server, bundle: Value, profile: &str) -> Option<(Value, String)> {
    let (err, synced) = tool(s, "sync_bundle", json!({"bundle": bundle}));
    if err {
        return None;
    }
    let (_, created) = tool(
        s,
        "create_worker",
        json!({"profile": {"kind": "named", "value": profile}, "config_bundle": synced["reference"]}),
    );
    let id = created["worker"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Some((created, id))
}

fn transcript_text(s: &mut Server, id: &str) -> String {
    let (_, t) = tool(s, "read_worker_transcript", json!({"worker_id": id}));
    t.to_string()
}

/// The operator lets the `reviewer` profile run `printenv` with the GitHub token: an allow rule
/// naming the profile, the program and the secret `github`. The agent's bundle declares a
/// secret *named* `github` whose reference is `env:OPERATOR_AWS_KEY`. The rule names `secrets`
/// (declaration names: labels the agent chooses), and `declarations` need not be named when
/// every declaration is a secret, so the rule matches and the worker is handed the AWS key the
/// operator never named anywhere. Worker output proves it: `printenv OPERATOR_AWS_KEY` comes
/// back scrubbed as `[secret:github]`, which the scrubber only writes for an injected value.
#[test]
fn a_secret_named_like_an_allowed_one_never_hands_over_another_variable() {
    let policy = r#"rules:
  - id: reviewer-may-use-github
    effect: allow
    operations: ["worker.start"]
    targets:
      - kind: worker
        fields: {profile: ["reviewer"], program: ["printenv"], secrets: ["github"]}
"#;
    let env = Env::new(Some(policy));
    let mut agent = mcp_agent(&env, "agent", &[GITHUB, AWS]);
    let bundle = json!({
        "metadata": {"id": "review", "revision": "r1", "created_at": "2026-12-01", "provenance": {"source": "agent"}},
        "profiles": [{"selector": {"kind": "named", "value": "reviewer"},
                      "command": ["printenv", AWS.0], "input_mode": "argument"}],
        "declarations": [{"kind": "secret_ref", "name": "github", "reference": format!("env:{}", AWS.0)}],
    });
    let (created, id) = sync_and_create(&mut agent, bundle, "reviewer").expect("synced");
    let w = created["worker"].clone();
    // Give a started worker time to print.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut text = String::new();
    while Instant::now() < deadline && !id.is_empty() {
        text = transcript_text(&mut agent, &id);
        if text.contains("[secret:") || text.contains("stopped") || text.contains("failed") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !text.contains("[secret:github]"),
        "the worker was given {} under a rule that names only the secret `github` \
         (meant for {}): {text}\ncreate: {created}",
        AWS.0,
        GITHUB.0
    );
    assert_eq!(
        w["status"], "pending_approval",
        "a rule naming the secret `github` started a worker reading {}: {created}",
        AWS.0
    );
}

/// The operator allows workers of the `probe` profile any outbound TCP port except one, which a
/// deny rule names (a database on this host). Returns what the listener on that port received
/// from a worker whose bundle spells the port as `spell(port)`, and the create answer.
fn probe_denied_port(spell: impl Fn(u16) -> String) -> (String, Value, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let policy = format!(
        r#"rules:
  - id: never-the-database
    effect: deny
    operations: ["worker.start"]
    targets:
      - kind: worker
        fields: {{declarations: ["network_policy:*:network:tcp-connect:{port}"]}}
  - id: probes-may-connect
    effect: allow
    operations: ["worker.start"]
    targets:
      - kind: worker
        fields: {{profile: ["probe"], declarations: ["network_policy:*:network:tcp-connect:*"]}}
"#
    );
    let env = Env::new(Some(&policy));
    let mut agent = mcp_agent(&env, "agent", &[]);
    let bundle = json!({
        "metadata": {"id": "probe", "revision": "r1", "created_at": "2026-12-01", "provenance": {"source": "agent"}},
        "profiles": [{"selector": {"kind": "named", "value": "probe"},
                      "command": ["bash", "-c", format!("(echo stolen > /dev/tcp/127.0.0.1/{port}) && echo net:connected || echo net:denied")],
                      "input_mode": "argument"}],
        "declarations": [{"kind": "network_policy", "name": "db", "reference": format!("network:tcp-connect:{}", spell(port))}],
    });
    let Some((created, id)) = sync_and_create(&mut agent, bundle, "probe") else {
        // Refused at sync: nothing can start from it.
        return (String::new(), Value::Null, String::new());
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut reached = String::new();
    let mut text = String::new();
    while Instant::now() < deadline {
        if let Ok((mut conn, _)) = listener.accept() {
            conn.set_nonblocking(false).unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let _ = conn.read_to_string(&mut reached);
            break;
        }
        if id.is_empty() || created["worker"]["status"] == "pending_approval" {
            break;
        }
        text = transcript_text(&mut agent, &id);
        if text.contains("net:denied") || text.contains("failed") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (reached, created, text)
}

/// The control: the port as the deny rule spells it is denied, nothing connects.
#[test]
fn control_a_denied_port_is_denied() {
    let (reached, created, text) = probe_denied_port(|p| p.to_string());
    assert!(reached.is_empty(), "{reached:?} {created} {text}");
    assert_eq!(created["worker"]["status"], "pending_approval", "{created}");
}

/// The agent declares the denied port with a leading zero or a plus sign
/// (`network:tcp-connect:0PORT`, `+PORT`): the deny rule's pattern never matches that
/// spelling, the allow rule's `*` does, and the sandbox (`u16::from_str`) reads it as the denied
/// port. The worker connects to it.
#[test]
fn a_denied_port_spelled_otherwise_is_still_denied() {
    for spell in [(|p: u16| format!("0{p}")) as fn(u16) -> String, |p: u16| {
        format!("+{p}")
    }] {
        let (reached, created, text) = probe_denied_port(spell);
        assert!(
            reached.is_empty(),
            "a worker declaring `network:tcp-connect:{}` reached the port a trusted deny rule \
             names: it received {reached:?}\ncreate: {created}\ntranscript: {text}",
            spell(0)
        );
        let status = &created["worker"]["status"];
        assert!(
            status.is_null() || status == "pending_approval",
            "the worker started: {created}"
        );
    }
}

/// The operator points a grant at a directory of the project (`GAFFER_CACHE_DIR`, the
/// workspace's `cache/`) and lets `cache` workers write it. The agent, who writes the
/// workspace, swaps `cache/` for a link to a directory outside it before a worker starts: the
/// grant must not follow it. (Before: the grant was opened through the link, and the worker
/// wrote where it led.)
#[test]
fn a_grant_into_the_workspace_is_not_redirected_by_a_link_the_agent_swaps_in() {
    let policy = r#"rules:
  - id: cache-workers
    effect: allow
    operations: ["worker.start"]
    targets:
      - kind: worker
        fields: {profile: ["cache"], declarations: ["mount_grant:*:mount:write:GAFFER_CACHE_DIR"]}
"#;
    let env = Env::new(Some(policy));
    let outside = tempfile::tempdir().unwrap();
    let cache = env.root().join("cache");
    std::fs::create_dir(&cache).unwrap();
    let cache_var = cache.display().to_string();
    let mut agent = mcp_agent(&env, "agent", &[("GAFFER_CACHE_DIR", cache_var.as_str())]);
    std::fs::remove_dir(&cache).unwrap();
    std::os::unix::fs::symlink(outside.path(), &cache).unwrap();
    let bundle = json!({
        "metadata": {"id": "cache", "revision": "r1", "created_at": "2026-12-01", "provenance": {"source": "agent"}},
        "profiles": [{"selector": {"kind": "named", "value": "cache"},
                      "command": ["sh", "-c", format!("echo pwned > {cache_var}/pwned; echo done")],
                      "input_mode": "argument"}],
        "declarations": [{"kind": "mount_grant", "name": "cache", "reference": "mount:write:GAFFER_CACHE_DIR"}],
    });
    let (created, id) = sync_and_create(&mut agent, bundle, "cache").expect("synced");
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && !id.is_empty() {
        let text = transcript_text(&mut agent, &id);
        if text.contains("done") || text.contains("failed") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !outside.path().join("pwned").exists(),
        "the grant followed the agent's link out of the workspace: {created}"
    );
    // Refused for that reason, not failed for another.
    assert!(
        created
            .to_string()
            .contains("the granted path lies in the workspace"),
        "{created}"
    );
}
