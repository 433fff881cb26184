//! Attacks on workers, played as the agent would: it writes journal records with the real
//! framing and chain (`common::forge`), and it calls the worker methods of other clients'
//! workers over MCP, raw JSON-RPC and LSP.
//!
//! - A forged `worker.created` (status running, owner a dead pid, child_pid a victim) must not
//!   make the orphan sweep signal anything: gaffer signals only a process this machine proves
//!   it started for that worker (`workers::spawned`), never one named by the journal.
//! - Another client's worker is as missing as one that never existed: no input, transcript,
//!   get, list or stop, on every profile; its creator and operators still reach it.

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::forge::{anchor_outside_the_workspace, append_chained};
use common::gate::{Env, unread};
use common::{BIN, Server, Wire};
use serde_json::{Value, json};

/// A pid no process has: the forged worker's "dead" owner.
fn a_dead_pid() -> u32 {
    (4_000_000..4_194_000)
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .unwrap()
}

/// Field 22 of /proc/<pid>/stat: what gaffer records as a process's start time.
fn start_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

/// Alive and not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 2..].starts_with(|c| c != 'Z')))
        .unwrap_or(false)
}

/// A `worker.created` payload as the agent writes it: running, owned by a dead gaffer, its
/// process said to be `child`.
fn forged_worker(id: &str, child: u32, ticks: Option<u64>) -> Vec<u8> {
    let mut owner =
        json!({"pid": a_dead_pid(), "process_id": format!("p-{id}"), "child_pid": child});
    if let Some(t) = ticks {
        owner["child_start_ticks"] = json!(t);
    }
    json!({"worker": {
        "backend": "process", "config_bundle": {"digest": format!("sha256:{}", "0".repeat(64)), "id": "nothing"},
        "created_by": "anonymous", "created_ms": 0, "created_seq": 0, "id": id, "input_capable": true,
        "input_count": 0, "input_mode": "stdin_text", "last_seq": 0, "output_bytes": 0, "owner": owner,
        "profile": {"kind": "named", "value": "x"}, "request_fingerprint": format!("sha256:{}", "0".repeat(64)),
        "run_state": "idle", "status": "running", "stop_requested": false, "updated_ms": 0
    }})
    .to_string()
    .into_bytes()
}

fn any_bundle() -> Value {
    json!({
        "metadata": {"id": "any", "revision": "r1", "created_at": "2026-12-01", "provenance": {"source": "e2e"}},
        "profiles": [{"selector": {"kind": "named", "value": "cat"}, "command": ["cat"], "input_mode": "stdin_text"}]
    })
}

/// Polls `workers/get` until the forged worker is recorded stopped (the sweep judged it).
fn wait_stopped(s: &mut Server, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // A plain read may answer from a look up to 2 ms old, taken just before the forged
        // records landed: not found is an answer to ask again, as a stale status is.
        let r = s.request("workers/get", json!({"worker_id": id}));
        let w = r["result"]["worker"].clone();
        if w["status"] == "stopped" {
            return;
        }
        assert!(Instant::now() < deadline, "never recorded stopped: {r}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Plays the forgery on a serving gaffer: `victims` are (worker id, child pid, ticks); each
/// forged worker is poked with input (which runs the sweep at once) and left to the sweep.
fn forge_and_sweep(s: &mut Server, root: &Path, victims: &[(&str, u32, Option<u64>)]) {
    let recs: Vec<(&str, Vec<u8>)> = victims
        .iter()
        .map(|(id, pid, ticks)| ("worker.created", forged_worker(id, *pid, *ticks)))
        .collect();
    append_chained(root, &recs);
    for (id, _, _) in victims {
        let r = s.request("workers/input", json!({"worker_id": id, "input": "x"}));
        assert!(r.get("error").is_some(), "an orphan takes no input: {r}");
        wait_stopped(s, id);
    }
    // Another full sweep interval (2 s) on top, for any sweep still to come.
    std::thread::sleep(Duration::from_millis(2500));
}

struct Victim(Child);

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_forged_running_worker_never_gets_another_process_group_killed() {
    anchor_outside_the_workspace();
    let ws = common::workspace();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &[]);
    s.call("bundles/sync", json!({"bundle": any_bundle()}));
    s.call("workers/list", json!({}));
    // An unrelated process group of the user: an editor, a shell job, a build.
    let victim = Victim(
        Command::new("setsid")
            .args(["sleep", "300"])
            .spawn()
            .unwrap(),
    );
    let pid = victim.0.id();
    std::thread::sleep(Duration::from_millis(200));
    let ticks = start_ticks(pid);
    // With the victim's true start time, and with none (which switched the check off).
    let forged = [
        ("0197a000-0000-7000-8000-000000000001", pid, Some(ticks)),
        ("0197a000-0000-7000-8000-000000000002", pid, None),
    ];
    forge_and_sweep(&mut s, ws.path(), &forged);
    assert!(alive(pid), "the victim's process group was killed");
    assert_eq!(start_ticks(pid), ticks, "the same process");
}

/// The process whose command line is `argv` joined by NULs, seen from this PID namespace.
fn find_process(argv: &[&str]) -> Option<u32> {
    let want = format!("{}\0", argv.join("\0"));
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        (cmdline == want.as_bytes()).then_some(pid)
    })
}

/// `child_pid: 1` made gaffer call `kill(-1, SIGKILL)`: every process of the user. Played in a
/// throwaway user + PID namespace where gaffer is PID 1, so that, were the forgery obeyed,
/// only the victim beside it dies (kill(-1) spares the caller), never this machine's processes.
#[test]
fn a_forged_worker_naming_pid_1_signals_nothing() {
    anchor_outside_the_workspace();
    let ws = common::workspace();
    // A fresh store first, made outside the namespace.
    Server::start(ws.path(), Wire::Ndjson, &[])
        .call("bundles/sync", json!({"bundle": any_bundle()}));
    let nonce = format!("4242.{}", std::process::id());
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--user",
        "--map-root-user",
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child",
    ])
    .arg("sh")
    .arg("-c")
    .arg(format!(
        "setsid sleep {nonce} & exec \"$0\" --workspace \"$1\" serve"
    ))
    .arg(BIN)
    .arg(ws.path());
    let mut s = Server::start_cmd(cmd, ws.path(), Wire::Ndjson);
    s.call("workers/list", json!({}));
    let deadline = Instant::now() + Duration::from_secs(10);
    let victim = loop {
        if let Some(pid) = find_process(&["sleep", &nonce]) {
            break pid;
        }
        assert!(Instant::now() < deadline, "the victim never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    let forged = [
        ("0197a000-0000-7000-8000-000000000011", 1, None),
        ("0197a000-0000-7000-8000-000000000012", 1, Some(0)),
    ];
    forge_and_sweep(&mut s, ws.path(), &forged);
    assert!(alive(victim), "kill(-1) reached the victim");
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "gaffer is still serving"
    );
}

// ---- another client's worker ----

const CI_ONLY: &str = r#"
rules:
  - id: ci-starts-its-cat
    effect: allow
    clients: ["ci"]
    operations: ["worker.start"]
    targets:
      - kind: worker
        fields:
          bundle_id: ["ci-cat"]
          profile: ["cat"]
"#;

fn ci_bundle() -> Value {
    json!({
        "metadata": {"id": "ci-cat", "revision": "r1", "created_at": "2026-12-01", "provenance": {"source": "ci"}},
        "profiles": [{"selector": {"kind": "named", "value": "cat"}, "command": ["cat"], "input_mode": "stdin_text"}]
    })
}

/// The error code a refusal carries (`data.code`), on raw/LSP replies or MCP tool results.
fn code(r: &Value) -> String {
    let e = if r["result"]["isError"] == true {
        &r["result"]["structuredContent"]["error"]
    } else {
        &r["error"]
    };
    e["data"]["code"].as_str().unwrap_or("(none)").to_string()
}

/// Every worker method on `id`, each answered as it would be for an id that never existed.
fn refused_like_a_missing_worker(s: &mut Server, mcp: bool, id: &str) {
    let missing = "0197a000-0000-7000-8000-0000000000ff";
    let calls: [(&str, &str, Value); 4] = [
        ("workers/get", "get_worker", json!({"worker_id": id})),
        (
            "workers/transcript",
            "read_worker_transcript",
            json!({"worker_id": id}),
        ),
        (
            "workers/input",
            "send_worker_input",
            json!({"worker_id": id, "input": "echo pwned"}),
        ),
        (
            "workers/stop",
            "stop_worker",
            json!({"worker_id": id, "reason": "not yours"}),
        ),
    ];
    for (method, tool, params) in calls {
        let ask = |s: &mut Server, p: Value| {
            if mcp {
                s.request("tools/call", json!({"name": tool, "arguments": p}))
            } else {
                s.request(method, p)
            }
        };
        let theirs = ask(s, params.clone());
        let mut other = params.clone();
        other["worker_id"] = json!(missing);
        let none = ask(s, other);
        assert_eq!(code(&theirs), "worker_not_found", "{method}: {theirs}");
        assert_eq!(code(&theirs), code(&none), "{method}");
    }
    let list = if mcp {
        s.request(
            "tools/call",
            json!({"name": "list_workers", "arguments": {}}),
        )["result"]["structuredContent"]
            .clone()
    } else {
        s.call("workers/list", json!({}))
    };
    let ids: Vec<&Value> = list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| &w["id"])
        .collect();
    assert!(!ids.contains(&&json!(id)), "listed: {list}");
}

fn transcript_text(s: &mut Server, id: &str) -> String {
    s.call("workers/transcript", json!({"worker_id": id}))["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn mcp_anonymous(env: &Env) -> Server {
    let mut s = env.start(&[]);
    s.call(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "ci", "version": "1"}}),
    );
    s.notify("notifications/initialized", json!({}));
    s
}

/// Client `ci` (by its credential) with a running `cat` worker of its own.
fn ci_runs_cat(env: &Env) -> (Server, String) {
    let mut ci = env.agent("ci");
    let reference = ci.call("bundles/sync", json!({"bundle": ci_bundle()}))["reference"].clone();
    let w = ci.call(
        "workers/create",
        json!({"profile": {"kind": "named", "value": "cat"}, "config_bundle": reference}),
    )["worker"]
        .clone();
    assert_eq!(w["status"], "running", "{w}");
    (ci, w["id"].as_str().unwrap().to_string())
}

fn lsp_anonymous(env: &Env) -> Server {
    let key = env.key_file.display().to_string();
    let mut s = Server::start_env(
        env.root(),
        Wire::Lsp,
        &[],
        &[("GAFFER_OPERATOR_KEY_FILE", &key)],
    );
    s.call(
        "initialize",
        json!({"capabilities": {}, "clientInfo": {"name": "ci"}}),
    );
    s.notify("initialized", json!({}));
    s
}

#[test]
fn another_clients_worker_is_not_found_on_every_profile_but_its_creator_and_operators_reach_it() {
    let env = Env::new(Some(CI_ONLY));
    let (mut ci, id) = ci_runs_cat(&env);

    // Anonymous over raw JSON-RPC (no handshake), over LSP (naming itself "ci"), and over MCP;
    // and another credentialed client.
    let mut raw = env.start(&[]);
    refused_like_a_missing_worker(&mut raw, false, &id);
    let mut lsp = lsp_anonymous(&env);
    refused_like_a_missing_worker(&mut lsp, false, &id);
    let mut mcp = mcp_anonymous(&env);
    refused_like_a_missing_worker(&mut mcp, true, &id);
    let mut other = env.agent("other");
    refused_like_a_missing_worker(&mut other, false, &id);

    // Its creator still drives it, and nothing the others sent reached it.
    let got = ci.call("workers/get", json!({"worker_id": id}))["worker"].clone();
    assert_eq!(got["status"], "running", "{got}");
    ci.call(
        "workers/input",
        json!({"worker_id": id, "input": "hello from ci"}),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    // The input, then cat's echo of it.
    while transcript_text(&mut ci, &id)
        .matches("hello from ci")
        .count()
        < 2
    {
        assert!(
            Instant::now() < deadline,
            "{}",
            transcript_text(&mut ci, &id)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!transcript_text(&mut ci, &id).contains("pwned"));
    let mine = ci.call("workers/list", json!({}))["workers"].clone();
    assert_eq!(mine.as_array().unwrap().len(), 1, "{mine}");

    // An operator sees every worker and may stop any.
    let mut op = env.operator();
    let all = op.call("workers/list", json!({}))["workers"].clone();
    assert!(
        all.as_array().unwrap().iter().any(|w| w["id"] == json!(id)),
        "{all}"
    );
    assert!(transcript_text(&mut op, &id).contains("hello from ci"));
    let stopped = op.call(
        "workers/stop",
        json!({"worker_id": id, "reason": "operator"}),
    )["worker"]
        .clone();
    assert_eq!(stopped["status"], "stopped", "{stopped}");
}

/// What the worker printed on stdout (its echo of every input it was given).
fn stdout_text(s: &mut Server, id: &str) -> String {
    s.call("workers/transcript", json!({"worker_id": id}))["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["stream"] == "stdout")
        .map(|e| e["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Waits until the worker's stdout holds `want`.
fn wait_echo(s: &mut Server, id: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !stdout_text(s, id).contains(want) {
        assert!(Instant::now() < deadline, "{}", stdout_text(s, id));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The agent appends `worker.input` records for another client's running worker with the real
/// framing and chain: one of its own text (with and without the proof copied from a genuine
/// input), and a byte-identical copy of a genuine one. The owner writes none of them to the
/// worker: journalled input is delivered only when a gaffer process holding the worker's key
/// (kept outside the workspace) signed it, and each signature once.
#[test]
fn forged_and_copied_input_records_never_reach_another_clients_worker() {
    let env = Env::new(Some(CI_ONLY));
    let (mut ci, id) = ci_runs_cat(&env);
    ci.call(
        "workers/input",
        json!({"worker_id": id, "input": "genuine one\n"}),
    );
    wait_echo(&mut ci, &id, "genuine one");

    let seg = common::forge::the_segment(env.root());
    let i = seg
        .recs
        .iter()
        .position(|r| r.kind() == "worker.input" && r.payload()["worker_id"] == json!(id))
        .expect("the genuine input record");
    let genuine = seg.recs[i].payload();
    assert!(genuine["auth"]["mac"].is_string(), "{genuine}");
    let mut forged = genuine.clone();
    forged["segments"] = json!([{"kind": "text", "content": "forged input\n"}]);
    forged["text"] = json!("forged input\n");
    // A nonce never used, so only the MAC (copied from the genuine input) can refuse it.
    forged["auth"]["nonce"] = json!("00112233445566778899aabbccddeeff");
    let mut bare = forged.clone();
    bare.as_object_mut().unwrap().remove("auth");
    let bytes = |v: &Value| serde_json::to_vec(v).unwrap();
    append_chained(
        env.root(),
        &[
            ("worker.input", bytes(&forged)),
            ("worker.input", bytes(&bare)),
            ("worker.input", seg.recs[i].raw_payload()),
        ],
    );
    // Input sent after them through the owner's own connection arrives, in order, after
    // whatever of theirs would have.
    ci.call(
        "workers/input",
        json!({"worker_id": id, "input": "genuine two\n"}),
    );
    wait_echo(&mut ci, &id, "genuine two");
    let out = stdout_text(&mut ci, &id);
    assert!(!out.contains("forged input"), "{out}");
    // The forged records were folded (they are in the transcript as input), and not written.
    let all = transcript_text(&mut ci, &id);
    assert_eq!(all.matches("forged input").count(), 2, "{all}");
    assert_eq!(
        out.matches("genuine one").count(),
        1,
        "a copy is not input again: {out}"
    );
    // Another gaffer process on this machine still gives it input (it signs with the key the
    // spawning process recorded outside the workspace).
    let mut second = env.agent("ci");
    second.call(
        "workers/input",
        json!({"worker_id": id, "input": "from the second\n"}),
    );
    wait_echo(&mut ci, &id, "from the second");
}

/// The agent squats client `ci`'s idempotency key: a forged pending `worker.created` carrying
/// that key, the fingerprint of ci's (predictable) request, itself as creator and an initial
/// input of its own. ci's create with that key gets no such worker back (the record's own
/// input does not make ci's request, and it is not ci's), so nothing ci's policy starts ever
/// runs the agent's input or becomes the agent's to drive.
#[test]
fn a_squatted_idempotency_key_never_hands_the_agent_a_worker_ci_starts() {
    let env = Env::new(Some(CI_ONLY));
    let mut ci = env.agent("ci");
    let reference = ci.call("bundles/sync", json!({"bundle": ci_bundle()}))["reference"].clone();
    let request = gaffer::workers::request::CreateRequest {
        profile: serde_json::from_value(json!({"kind": "named", "value": "cat"})).unwrap(),
        config_bundle: serde_json::from_value(reference.clone()).unwrap(),
        initial_input: Some(vec![gaffer::workers::types::Segment::Text {
            content: "hello from ci\n".into(),
        }]),
        display_name: None,
        idempotency_key: None,
        created_by: None,
    };
    let forged = [
        (
            "anonymous",
            "0197a000-0000-7000-8000-00000000abcd",
            "nightly",
        ),
        ("ci", "0197a000-0000-7000-8000-00000000abce", "weekly"),
    ];
    for (created_by, forged_id, key) in forged {
        let worker = json!({
            "backend": "process", "config_bundle": reference, "created_by": created_by,
            "created_ms": 0, "created_seq": 0, "id": forged_id, "input_capable": false,
            "input_count": 0, "input_mode": "stdin_text", "last_seq": 0, "output_bytes": 0,
            "owner": {"pid": 1, "process_id": "p-agent"},
            "profile": {"kind": "named", "value": "cat"},
            "request_fingerprint": request.fingerprint(), "idempotency_key": key,
            "run_state": "stopped", "status": "pending_approval", "stop_requested": false,
            "updated_ms": 0
        });
        let payload = json!({"worker": worker, "initial_input": [{"kind": "text", "content": "AGENT-CHOSEN\n"}]});
        append_chained(
            env.root(),
            &[("worker.created", serde_json::to_vec(&payload).unwrap())],
        );
        let r = ci.request(
            "workers/create",
            json!({"profile": {"kind": "named", "value": "cat"}, "config_bundle": reference,
                   "idempotency_key": key, "initial_input": "hello from ci\n"}),
        );
        let got = &r["result"]["worker"]["id"];
        assert_ne!(
            got,
            &json!(forged_id),
            "{created_by}: ci got the forged worker: {r}"
        );
    }
    std::thread::sleep(Duration::from_millis(500));
    let mut op = env.operator();
    for (_, forged_id, _) in forged {
        let w = op.call("workers/get", json!({"worker_id": forged_id}))["worker"].clone();
        assert_eq!(w["status"], "pending_approval", "never started: {w}");
    }
}

/// Notifications follow the same rule as requests: a connection that is not the worker's
/// creator (anonymous over raw JSON-RPC, or another credentialed client) is sent neither
/// `workers/changed` nor `workers/output` about it, nor `operations/changed` about ci's
/// operations, while ci's own connection and an operator's get them.
#[test]
fn another_clients_worker_and_operations_send_it_no_notifications() {
    let env = Env::new(Some(CI_ONLY));
    let mut raw = env.start(&[]);
    raw.call("initialize", json!({}));
    let mut other = env.agent("other");
    let mut op = env.operator();
    let (mut ci, id) = ci_runs_cat(&env);
    ci.call(
        "workers/input",
        json!({"worker_id": id, "input": "CI-PRIVATE-OUTPUT\n"}),
    );
    wait_echo(&mut ci, &id, "CI-PRIVATE-OUTPUT");
    let submitted = common::gate::submit(
        &mut ci,
        "kv.set",
        json!({"key": "ci-private-key"}),
        json!({"value": 1}),
        "ci-op",
    );
    let op_id = submitted["result"]["id"]
        .as_str()
        .expect("an operation")
        .to_string();
    let seen_by_op = op
        .wait_for(Duration::from_secs(10), |v| {
            v["method"] == "workers/output" && v["params"]["worker_id"] == json!(id)
        })
        .is_some();
    assert!(seen_by_op, "the operator is sent the worker's output");
    for (who, s) in [("anonymous", &mut raw), ("other", &mut other)] {
        let got = unread(s);
        assert!(!got.contains(&id), "{who} was told of ci's worker: {got}");
        assert!(!got.contains("CI-PRIVATE-OUTPUT"), "{who}: {got}");
        assert!(
            !got.contains(&op_id),
            "{who} was told of ci's operation: {got}"
        );
    }
}
