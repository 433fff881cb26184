//! End-to-end tests of the worker runtime on the real binary: one test per canonical invariant
//! of the creation audit (I-1 .. I-6), plus output across processes, restart, crash during
//! create, idempotency and boundary refusals.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Server, journal_bytes};
use serde_json::{Value, json};

/// Lets anonymous clients start workers of the test bundles (naming the one secret they
/// declare), so these tests exercise the runtime; the gate itself is tested in
/// `workers_gate.rs`.
pub const WORKER_POLICY: &str = r#"
rules:
  - id: test-workers
    effect: allow
    clients: [anonymous]
    operations: ["worker.start"]
    targets:
      - kind: worker
        fields:
          bundle_id: ["team-bundle", "other-bundle"]
      - kind: worker
        fields:
          bundle_id: ["marked"]
          secrets: ["GAFFER_E2E_MARKER"]
"#;

/// A workspace with the test scripts under `scripts/` and a trusted worker policy.
struct Ws {
    env: common::gate::Env,
}

impl Ws {
    fn path(&self) -> &Path {
        self.env.root()
    }
    fn start(&self, extra: &[(&str, &str)]) -> Server {
        self.env.start(extra)
    }
    fn cli(&self, args: &[&str]) -> (i32, String, String) {
        self.env.cli(args)
    }
}

fn workspace() -> Ws {
    let env = common::gate::Env::untrusted(Some(WORKER_POLICY));
    std::fs::remove_file(env.root().join(".gaffer/providers.yaml")).unwrap();
    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "gaffer trust: {out} {err}");
    let ws = env.root();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts");
    std::fs::create_dir(ws.join("scripts")).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), ws.join("scripts").join(e.file_name())).unwrap();
    }
    std::fs::write(ws.join("notes.md"), "some notes\n").unwrap();
    Ws { env }
}

fn bundle() -> Value {
    json!({
        "metadata": {"id": "team-bundle", "revision": "r1", "created_at": "2026-11-29",
                     "provenance": {"source": "e2e"}},
        "profiles": [
            {"selector": {"kind": "named", "value": "echo"}, "command": ["sh", "scripts/echo_lines.sh"]},
            {"selector": {"kind": "named", "value": "sleeper"}, "command": ["sh", "scripts/sleeper.sh"]},
            {"selector": {"kind": "named", "value": "args"}, "command": ["sh", "scripts/args.sh"], "input_mode": "argument"},
            {"selector": {"kind": "named", "value": "broken"}, "command": ["gaffer-no-such-program-e2e"]},
            {"selector": {"kind": "named", "value": "no-command"}, "label": "declares nothing to run"}
        ]
    })
}

/// Syncs the test bundle and returns its reference.
fn sync(s: &mut Server) -> Value {
    let r = s.call("bundles/sync", json!({"bundle": bundle()}));
    r["reference"].clone()
}

fn create(s: &mut Server, reference: &Value, profile: &str, input: Option<&str>) -> Value {
    let mut p = json!({"profile": {"kind": "named", "value": profile}, "config_bundle": reference});
    if let Some(i) = input {
        p["initial_input"] = json!(i);
    }
    s.request("workers/create", p)
}

fn error_code(r: &Value) -> (i64, String) {
    let e = &r["error"];
    (
        e["code"].as_i64().unwrap_or(0),
        e["data"]["code"].as_str().unwrap_or("").to_string(),
    )
}

fn field(r: &Value) -> String {
    assert_eq!(r["error"]["code"], -32602, "expected invalid params: {r}");
    r["error"]["data"]["field"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// Polls `workers/get` until `pred` holds.
fn wait_worker(s: &mut Server, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let w = s.call("workers/get", json!({"worker_id": id}))["worker"].clone();
        if pred(&w) {
            return w;
        }
        assert!(
            Instant::now() < deadline,
            "worker never reached the expected state: {w}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Polls the transcript until its text contains `needle`.
fn wait_transcript(s: &mut Server, id: &str, needle: &str) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let t = s.call("workers/transcript", json!({"worker_id": id}));
        let entries = t["entries"].as_array().cloned().unwrap_or_default();
        if entries
            .iter()
            .any(|e| e["text"].as_str().unwrap_or("").contains(needle))
        {
            return entries;
        }
        assert!(
            Instant::now() < deadline,
            "transcript never showed {needle:?}: {entries:?}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn is_uuid_v7(id: &str) -> bool {
    id.len() == 36 && id.as_bytes()[14] == b'7' && id.chars().filter(|c| *c == '-').count() == 4
}

#[test]
fn i1_create_is_the_only_path_that_issues_worker_ids() {
    let ws = workspace();
    let mut s = ws.start(&[]);
    let reference = sync(&mut s);
    let a = create(&mut s, &reference, "echo", None)["result"]["worker"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let b = create(&mut s, &reference, "echo", None)["result"]["worker"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(is_uuid_v7(&a) && is_uuid_v7(&b), "{a} {b}");
    assert!(a < b, "ids are time-ordered");

    // A caller cannot choose an id, and no other method brings a worker into being.
    wait_transcript(&mut s, &a, "ready");
    wait_transcript(&mut s, &b, "ready");
    std::thread::sleep(Duration::from_millis(200)); // let the output flush settle
    let before = journal_bytes(ws.path());
    let chosen = "01900000-0000-7000-8000-000000000001";
    let mut p = json!({"profile": {"kind": "named", "value": "echo"}, "config_bundle": reference, "worker_id": chosen});
    assert_eq!(field(&s.request("workers/create", p.clone())), "worker_id");
    p.as_object_mut().unwrap().remove("worker_id");
    p["id"] = json!(chosen);
    assert_eq!(field(&s.request("workers/create", p)), "id");
    for (method, params) in [
        ("workers/input", json!({"worker_id": chosen, "input": "hi"})),
        ("workers/stop", json!({"worker_id": chosen})),
        ("workers/get", json!({"worker_id": chosen})),
        ("workers/transcript", json!({"worker_id": chosen})),
    ] {
        assert_eq!(
            error_code(&s.request(method, params)).1,
            "worker_not_found",
            "{method}"
        );
    }
    assert!(journal_bytes(ws.path()) == before, "the journal changed");
    let ids: Vec<String> = s.call("workers/list", json!({}))["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, vec![a, b]);
}

#[test]
fn i2_create_is_separate_from_launch_context() {
    let ws = workspace();
    let mut s = ws.start(&[]);
    let reference = sync(&mut s);
    let before = journal_bytes(ws.path());
    // Launch-side fields (intent, acceptance policy, names, capability wishes) never reach
    // runtime create.
    for f in [
        "intent",
        "acceptance",
        "requested_worker_name",
        "requested_capabilities",
        "profile_source",
        "command",
    ] {
        let p = json!({"profile": {"kind": "named", "value": "echo"}, "config_bundle": reference, f: "x"});
        assert_eq!(field(&s.request("workers/create", p)), f);
    }
    // No latest-for-profile shortcut: a bundle reference needs its digest.
    let p = json!({"profile": {"kind": "named", "value": "echo"}, "config_bundle": {"id": "team-bundle"}});
    assert_eq!(
        field(&s.request("workers/create", p)),
        "config_bundle.digest"
    );
    let p = json!({"profile": {"kind": "named", "value": "echo"}});
    assert_eq!(field(&s.request("workers/create", p)), "config_bundle");
    assert!(journal_bytes(ws.path()) == before, "the journal changed");
    assert_eq!(s.call("workers/list", json!({}))["workers"], json!([]));
}

#[test]
fn i3_create_verifies_the_synced_bundle_identity() {
    let ws = workspace();
    let mut s = ws.start(&[]);
    let reference = sync(&mut s);
    let before = journal_bytes(ws.path());

    let missing = json!({"id": "never-synced", "digest": reference["digest"]});
    let r = create(&mut s, &missing, "echo", Some("hi"));
    assert_eq!(error_code(&r), (-32001, "bundle_missing".into()), "{r}");

    let wrong = json!({"id": "team-bundle", "digest": format!("sha256:{}", "0".repeat(64))});
    let r = create(&mut s, &wrong, "echo", Some("hi"));
    assert_eq!(
        error_code(&r),
        (-32010, "bundle_digest_mismatch".into()),
        "{r}"
    );
    assert_eq!(r["error"]["data"]["expected_digest"], reference["digest"]);

    let r = create(&mut s, &reference, "not-in-bundle", Some("hi"));
    assert_eq!(field(&r), "profile");
    let p = json!({"profile": {"kind": "builtin", "value": "echo"}, "config_bundle": reference});
    assert_eq!(
        field(&s.request("workers/create", p)),
        "profile",
        "selector kind is part of identity"
    );

    assert!(journal_bytes(ws.path()) == before, "the journal changed");
    assert_eq!(s.call("workers/list", json!({}))["workers"], json!([]));
}

#[test]
fn i4_create_refuses_raw_paths_cwd_sockets_credentials_and_session_paths() {
    let ws = workspace();
    let mut s = ws.start(&[]);
    let reference = sync(&mut s);
    let before = journal_bytes(ws.path());
    let base = json!({"profile": {"kind": "named", "value": "echo"}, "config_bundle": reference, "initial_input": "hi"});
    for (f, v) in [
        ("cwd", json!("/tmp")),
        ("working_directory", json!({"working_directory_id": "w"})),
        (
            "working_directory_request",
            json!({"repository": {"local_path": "/src"}}),
        ),
        ("workspace_root", json!("/home/me/ws")),
        ("workspace_refs", json!([])),
        ("mount_refs", json!([])),
        ("path", json!("/etc")),
        ("socket", json!("/run/x.sock")),
        ("socket_path", json!("/run/x.sock")),
        ("credentials", json!({"user": "u"})),
        ("token", json!("ghp_x")),
        ("api_key", json!("k")),
        ("password", json!("p")),
        ("env", json!({"A": "1"})),
        ("session_path", json!(".yoi/sessions/1")),
        ("session_id", json!("s")),
        ("cache_path", json!(".cache/x")),
    ] {
        let mut p = base.clone();
        p[f] = v;
        let r = s.request("workers/create", p);
        assert_eq!(field(&r), f);
        assert!(!r["error"]["message"].as_str().unwrap().contains("ghp_x"));
    }
    // Paths hidden in values are refused too.
    let mut p = base.clone();
    p["display_name"] = json!("/home/me/.cache/worker");
    assert_eq!(field(&s.request("workers/create", p)), "display_name");
    let mut p = base.clone();
    p["display_name"] = json!("agent at run/user/1000/agent.sock");
    assert_eq!(field(&s.request("workers/create", p)), "display_name");
    let mut p = base.clone();
    p["config_bundle"]["socket"] = json!("x");
    assert_eq!(
        field(&s.request("workers/create", p)),
        "config_bundle.socket"
    );
    assert!(journal_bytes(ws.path()) == before, "the journal changed");
}

#[test]
fn i5_initial_input_is_written_with_the_worker_in_one_record() {
    let ws = workspace();
    let mut s = ws.start(&[]);
    let reference = sync(&mut s);
    let seq_before = s.call("gaffer/status", json!({}))["store"]["seq"]
        .as_u64()
        .unwrap();
    let r = create(&mut s, &reference, "echo", Some("first words"));
    let w = r["result"]["worker"].clone();
    let id = w["id"].as_str().unwrap().to_string();
    assert_eq!(
        w["created_seq"].as_u64().unwrap(),
        seq_before + 1,
        "create wrote exactly one record"
    );
    assert_eq!(w["input_count"], 1);
    let entries = wait_transcript(&mut s, &id, "echo: first words");
    assert_eq!(
        entries[0]["seq"], w["created_seq"],
        "the input is part of the creation record"
    );
    assert_eq!(entries[0]["stream"], "input");
    assert_eq!(entries[0]["text"], "first words");
    // The journal holds one worker.created record carrying the input.
    let journal = String::from_utf8_lossy(&journal_bytes(ws.path())).into_owned();
    assert_eq!(journal.matches("worker.created").count(), 1);
    assert_eq!(journal.matches("worker.input").count(), 0);
}

#[test]
fn i6_no_backend_fails_closed_and_a_failed_spawn_is_never_input_capable() {
    let ws = workspace();
    let mut s = ws.start(&[]);
    let reference = sync(&mut s);

    // No backend can run a profile that declares nothing to run: refused, nothing listed.
    let before = journal_bytes(ws.path());
    let r = create(&mut s, &reference, "no-command", Some("hi"));
    assert_eq!(
        error_code(&r),
        (-32004, "execution_backend_unavailable".into()),
        "{r}"
    );
    assert!(journal_bytes(ws.path()) == before, "the journal changed");
    assert_eq!(s.call("workers/list", json!({}))["workers"], json!([]));

    // A backend that cannot honour a declared policy fails closed the same way.
    let mut guarded = bundle();
    guarded["metadata"]["id"] = json!("guarded");
    guarded["declarations"] =
        json!([{"kind": "shell_policy", "name": "sh", "reference": "shell:strict"}]);
    let gref = s.call("bundles/sync", json!({"bundle": guarded}))["reference"].clone();
    let r = create(&mut s, &gref, "echo", None);
    assert_eq!(error_code(&r).1, "execution_backend_unavailable");
    assert_eq!(s.call("workers/list", json!({}))["workers"], json!([]));

    // A spawn that fails leaves a failed worker with a diagnostic that takes no input.
    let r = create(&mut s, &reference, "broken", Some("hi"));
    assert_eq!(
        error_code(&r),
        (-32005, "worker_spawn_failed".into()),
        "{r}"
    );
    let id = r["error"]["data"]["worker_id"]
        .as_str()
        .unwrap()
        .to_string();
    let w = s.call("workers/get", json!({"worker_id": id}))["worker"].clone();
    assert_eq!(w["status"], "failed");
    assert_eq!(w["input_capable"], false);
    assert!(
        w["diagnostic"]
            .as_str()
            .unwrap()
            .contains("program not found"),
        "{w}"
    );
    let r = s.request("workers/input", json!({"worker_id": id, "input": "x"}));
    assert_eq!(error_code(&r).1, "worker_not_input_capable");
    drop(s);

    // ... and it is never resurrected by a restart.
    let mut s = ws.start(&[]);
    let w = s.call("workers/get", json!({"worker_id": id}))["worker"].clone();
    assert_eq!(w["status"], "failed");
    assert_eq!(w["input_capable"], false);
}

#[test]
fn output_reaches_the_transcript_and_a_second_process_and_input_crosses_processes() {
    let ws = workspace();
    let mut a = ws.start(&[]);
    let reference = sync(&mut a);
    let mut b = ws.start(&[]);
    // B is up before the worker exists; it must learn of everything through the journal.
    b.call("gaffer/status", json!({}));

    let w = create(&mut a, &reference, "echo", Some("hello"))["result"]["worker"].clone();
    let id = w["id"].as_str().unwrap().to_string();
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !seen.contains("echo: hello") {
        assert!(
            Instant::now() < deadline,
            "B never saw the output: {seen:?}"
        );
        if let Some(n) = b.notification("workers/output", Duration::from_millis(200)) {
            assert_eq!(n["params"]["worker_id"], json!(id));
            seen.push_str(n["params"]["text"].as_str().unwrap());
        }
    }
    assert!(seen.starts_with("ready\n"), "{seen:?}");

    // Input sent through B is journalled and delivered by A, which owns the process.
    let r = b.call("workers/input", json!({"worker_id": id, "input": "from b"}));
    assert_eq!(r["worker"]["owner"]["pid"], w["owner"]["pid"]);
    let input_seq = r["seq"].as_u64().unwrap();
    let entries = wait_transcript(&mut b, &id, "echo: from b");
    let journalled = entries
        .iter()
        .find(|e| e["stream"] == "input" && e["text"] == "from b")
        .unwrap();
    assert_eq!(
        journalled["seq"].as_u64().unwrap(),
        input_seq,
        "the reply names the input's seq"
    );
    let texts: Vec<&str> = entries
        .iter()
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    let pos = |t: &str| texts.iter().position(|x| x.contains(t)).unwrap();
    assert!(
        pos("hello") < pos("echo: hello")
            && pos("echo: hello") < pos("from b")
            && pos("from b") < pos("echo: from b")
    );
    let seqs: Vec<u64> = entries.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|p| p[0] < p[1]),
        "ordered by seq: {seqs:?}"
    );
    // A's own client sees the same transcript.
    let a_entries = a.call("workers/transcript", json!({"worker_id": id}))["entries"]
        .as_array()
        .unwrap()
        .clone();
    assert!(a_entries.len() >= entries.len());
    assert_eq!(&a_entries[..entries.len()], &entries[..]);

    // A stop asked through B is carried out by A.
    let stopped = b.call(
        "workers/stop",
        json!({"worker_id": id, "reason": "done here"}),
    )["worker"]
        .clone();
    let stopped = if stopped["status"] == "running" {
        wait_worker(&mut b, &id, |w| w["status"] != "running")
    } else {
        stopped
    };
    assert_eq!(stopped["status"], "stopped");
    assert!(
        stopped["reason"]
            .as_str()
            .unwrap()
            .contains("stopped on request: done here"),
        "the reason given through B is kept: {stopped}"
    );
    let changed = a.notification("workers/changed", Duration::from_secs(5));
    assert!(changed.is_some());
}

#[test]
fn argument_profiles_take_input_only_at_creation() {
    let ws = workspace();
    let mut s = ws.start(&[]);
    let reference = sync(&mut s);
    let w = create(&mut s, &reference, "args", Some("one arg"))["result"]["worker"].clone();
    let id = w["id"].as_str().unwrap().to_string();
    assert_eq!(w["input_capable"], false);
    wait_transcript(&mut s, &id, "arg: one arg");
    let done = wait_worker(&mut s, &id, |w| w["status"] != "running");
    assert_eq!(done["status"], "stopped");
    assert_eq!(done["exit"]["code"], 0);
    let r = s.request("workers/input", json!({"worker_id": id, "input": "more"}));
    assert_eq!(error_code(&r).1, "worker_not_input_capable");

    // The transcript pages by seq: input, output, then the system note of the exit.
    let mut after = 0;
    let mut streams = Vec::new();
    loop {
        let page = s.call(
            "workers/transcript",
            json!({"worker_id": id, "after_seq": after, "limit": 1}),
        );
        let entries = page["entries"].as_array().unwrap();
        assert!(entries.len() <= 1);
        if let Some(e) = entries.first() {
            assert!(e["seq"].as_u64().unwrap() > after);
            streams.push(e["stream"].as_str().unwrap().to_string());
        }
        after = page["next_after_seq"].as_u64().unwrap();
        if page["has_more"] != true {
            break;
        }
    }
    assert_eq!(streams, vec!["input", "stdout", "system"]);
    let r = s.request("workers/transcript", json!({"worker_id": id, "limit": 0}));
    assert_eq!(field(&r), "limit");
}

#[test]
fn restart_shows_orphans_stopped_and_keeps_final_states() {
    let ws = workspace();
    let mut a = ws.start(&[]);
    let reference = sync(&mut a);
    let running = create(&mut a, &reference, "sleeper", None)["result"]["worker"].clone();
    let running_id = running["id"].as_str().unwrap().to_string();
    wait_transcript(&mut a, &running_id, "sleeping");
    let child = running["owner"]["child_pid"].as_u64().unwrap();
    let stopped_id = create(&mut a, &reference, "sleeper", None)["result"]["worker"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let st = a.call(
        "workers/stop",
        json!({"worker_id": stopped_id, "reason": "by hand"}),
    )["worker"]
        .clone();
    assert_eq!(st["status"], "stopped");
    let failed_id = create(&mut a, &reference, "broken", None)["error"]["data"]["worker_id"]
        .as_str()
        .unwrap()
        .to_string();

    // The owning gaffer dies without a word.
    a.child.kill().unwrap();
    a.child.wait().unwrap();

    let mut b = ws.start(&[]);
    let workers = b.call("workers/list", json!({}))["workers"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(workers.len(), 3);
    let by_id = |id: &str| {
        workers
            .iter()
            .find(|w| w["id"] == json!(id))
            .unwrap()
            .clone()
    };
    let r = by_id(&running_id);
    assert_eq!(r["status"], "stopped", "{r}");
    assert_eq!(r["input_capable"], false);
    assert!(r["reason"].as_str().unwrap().contains("ended"), "{r}");
    let s = by_id(&stopped_id);
    assert_eq!(s["status"], "stopped");
    assert!(s["reason"].as_str().unwrap().contains("by hand"), "{s}");
    assert_eq!(by_id(&failed_id)["status"], "failed");
    // Nothing was respawned, and the orphaned process is gone.
    assert_eq!(
        b.call("workers/list", json!({"status": "running"}))["workers"],
        json!([])
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{child}")).exists() && !proc_is_zombie(child) {
        assert!(
            Instant::now() < deadline,
            "orphaned worker process {child} still runs"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = b.request(
        "workers/input",
        json!({"worker_id": running_id, "input": "anyone?"}),
    );
    assert_eq!(error_code(&r).1, "worker_not_input_capable");
}

fn proc_is_zombie(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

#[test]
fn sigkill_during_create_leaves_a_whole_worker_or_none() {
    for round in 0..6u64 {
        let ws = workspace();
        let mut s = ws.start(&[]);
        let reference = sync(&mut s);
        for i in 0..8 {
            let p = json!({"profile": {"kind": "named", "value": "echo"}, "config_bundle": reference,
                           "initial_input": format!("input {i}"), "idempotency_key": format!("k{i}")});
            s.send_request("workers/create", p);
        }
        std::thread::sleep(Duration::from_millis(round * 7));
        s.child.kill().unwrap();
        s.child.wait().unwrap();

        let mut s = ws.start(&[]);
        let workers = s.call("workers/list", json!({}))["workers"]
            .as_array()
            .unwrap()
            .clone();
        for w in &workers {
            let id = w["id"].as_str().unwrap();
            assert_eq!(w["config_bundle"], reference);
            // Nothing runs after the crash: started ones are orphans (stopped), the rest never
            // start by a restart.
            assert!(
                w["status"] == "stopped" || w["status"] == "pending_approval",
                "round {round}: {w}"
            );
            let t = s.call("workers/transcript", json!({"worker_id": id}));
            let first = &t["entries"][0];
            assert_eq!(
                first["stream"], "input",
                "round {round}: the initial input came with the worker"
            );
            assert_eq!(first["seq"], w["created_seq"]);
            let key = w["idempotency_key"].as_str().unwrap();
            assert_eq!(first["text"], json!(format!("input {}", &key[1..])));
        }
        // Replaying a create after the crash gives the same worker, never a second one.
        for w in &workers {
            let key = w["idempotency_key"].as_str().unwrap();
            let p = json!({"profile": {"kind": "named", "value": "echo"}, "config_bundle": reference,
                           "initial_input": format!("input {}", &key[1..]), "idempotency_key": key});
            assert_eq!(s.call("workers/create", p)["worker"]["id"], w["id"]);
        }
    }
}

#[test]
fn idempotent_create_returns_the_same_worker_and_refuses_a_changed_request() {
    let ws = workspace();
    let mut s = ws.start(&[]);
    let reference = sync(&mut s);
    let p = json!({"profile": {"kind": "named", "value": "echo"}, "config_bundle": reference,
                   "initial_input": "once", "idempotency_key": "launch-42"});
    let first = s.call("workers/create", p.clone())["worker"].clone();
    let before = journal_bytes(ws.path()).len();
    let again = s.call("workers/create", p.clone())["worker"].clone();
    assert_eq!(again["id"], first["id"]);
    let mut changed = p.clone();
    changed["initial_input"] = json!("twice");
    let r = s.request("workers/create", changed);
    assert_eq!(
        error_code(&r),
        (-32010, "idempotency_conflict".into()),
        "{r}"
    );
    assert_eq!(r["error"]["data"]["worker_id"], first["id"]);
    // Output may have been journalled meanwhile, but no second worker.
    assert!(journal_bytes(ws.path()).len() >= before);
    assert_eq!(
        s.call("workers/list", json!({}))["workers"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let journal = String::from_utf8_lossy(&journal_bytes(ws.path())).into_owned();
    assert_eq!(journal.matches("worker.created").count(), 1);
}

#[test]
fn bad_input_is_refused_naming_the_field_and_nothing_is_written() {
    let ws = workspace();
    let mut s = ws.start(&[]);
    let reference = sync(&mut s);
    let id = create(&mut s, &reference, "echo", None)["result"]["worker"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_transcript(&mut s, &id, "ready");
    std::thread::sleep(Duration::from_millis(200)); // let the output flush settle
    let before = journal_bytes(ws.path());
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "x").unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        ws.path().join("escape.txt"),
    )
    .unwrap();
    let seg = |v: Value| json!({"worker_id": id, "input": {"segments": [v]}});
    let cases = [
        (
            seg(json!({"kind": "knowledge_ref", "id": "k"})),
            "input.segments[0].kind",
        ),
        (
            seg(json!({"kind": "workflow_invoke"})),
            "input.segments[0].kind",
        ),
        (
            seg(json!({"kind": "file_ref", "path": "../outside.txt"})),
            "input.segments[0].path",
        ),
        (
            seg(json!({"kind": "file_ref", "path": "/etc/passwd"})),
            "input.segments[0].path",
        ),
        (
            seg(json!({"kind": "file_ref", "path": "~/x"})),
            "input.segments[0].path",
        ),
        (
            seg(json!({"kind": "file_ref", "path": "escape.txt"})),
            "input.segments[0].path",
        ),
        (
            seg(json!({"kind": "file_ref", "path": ".gaffer/journal"})),
            "input.segments[0].path",
        ),
        (
            seg(json!({"kind": "text", "content": "x", "session_path": "s"})),
            "input.segments[0].session_path",
        ),
        (
            json!({"worker_id": id, "input": "x".repeat(1024 * 1024 + 1)}),
            "input",
        ),
        (
            json!({"worker_id": id, "input": {"segments": []}}),
            "input.segments",
        ),
        (json!({"worker_id": id, "input": "x", "cwd": "/"}), "cwd"),
        (
            json!({"worker_id": id, "input": "x", "socket": "/run/a.sock"}),
            "socket",
        ),
        (
            json!({"worker_id": id, "input": "x", "credentials": "c"}),
            "credentials",
        ),
        (
            json!({"worker_id": "not-a-uuid", "input": "x"}),
            "worker_id",
        ),
        (json!({"worker_id": id}), "input"),
    ];
    for (params, want) in cases {
        let r = s.request("workers/input", params);
        assert_eq!(field(&r), want, "{r}");
    }
    assert!(
        journal_bytes(ws.path()) == before,
        "nothing reached the store"
    );
    // A file inside the workspace is fine.
    s.call(
        "workers/input",
        seg(json!({"kind": "file_ref", "path": "notes.md"})),
    );
    wait_transcript(&mut s, &id, "echo: @notes.md");
}

#[test]
fn a_live_process_notices_when_another_owner_dies() {
    let ws = workspace();
    let mut a = ws.start(&[]);
    let reference = sync(&mut a);
    let mut b = ws.start(&[]);
    let w = create(&mut a, &reference, "sleeper", None)["result"]["worker"].clone();
    let id = w["id"].as_str().unwrap().to_string();
    assert_eq!(
        b.call("workers/get", json!({"worker_id": id}))["worker"]["status"],
        "running"
    );
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    // B keeps running and, without a restart, reports the worker stopped with the reason.
    let w = wait_worker(&mut b, &id, |w| w["status"] != "running");
    assert_eq!(w["status"], "stopped");
    assert!(w["reason"].as_str().unwrap().contains("ended"), "{w}");
    let changed = b.wait_for(Duration::from_secs(5), |v| {
        v["method"] == "workers/changed" && v["params"]["worker"]["status"] == "stopped"
    });
    assert!(changed.is_some(), "B's client is told");
}

#[test]
fn cli_creates_follows_lists_shows_and_logs_a_worker() {
    let ws = workspace();
    let file = ws.path().join("bundle.json");
    std::fs::write(&file, serde_json::to_vec(&bundle()).unwrap()).unwrap();
    let (code, out, err) = ws.cli(&[
        "worker",
        "create",
        "--bundle-file",
        file.to_str().unwrap(),
        "--profile",
        "args",
        "--input",
        "from the cli",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let id = lines[0]["worker"]["id"].as_str().unwrap().to_string();
    assert!(
        lines.iter().any(|l| l["text"] == "arg: from the cli\n"),
        "{out}"
    );
    assert_eq!(lines.last().unwrap()["ended"]["status"], "stopped");

    let (code, out, _) = ws.cli(&["worker", "list", "--status", "stopped"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["workers"][0]["id"], json!(id));
    let (code, out, _) = ws.cli(&["worker", "show", &id]);
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["worker"]["exit"]["code"],
        0
    );
    let (code, out, _) = ws.cli(&["worker", "logs", &id]);
    assert_eq!(code, 0);
    assert!(out.contains("arg: from the cli"), "{out}");
    let (code, out, _) = ws.cli(&["worker", "input", &id, "late"]);
    assert_eq!(code, 1);
    assert!(out.contains("worker_not_input_capable"), "{out}");
    // A spawn failure exits non-zero with the diagnostic.
    let (code, out, _) = ws.cli(&[
        "worker",
        "create",
        "--bundle-file",
        file.to_str().unwrap(),
        "--profile",
        "broken",
    ]);
    assert_eq!(code, 1);
    assert!(out.contains("worker_spawn_failed"), "{out}");
}

/// Pids of live processes whose environment holds `marker`.
fn processes_with_env(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()) && !proc_is_zombie(pid as u64) {
            out.push(pid);
        }
    }
    out
}

#[test]
fn no_worker_process_outlives_a_killed_gaffer() {
    let ws = workspace();
    let marker_value = format!("m{}", std::process::id());
    let marker = format!("GAFFER_E2E_MARKER={marker_value}");
    let mut s = ws.start(&[("GAFFER_E2E_MARKER", &marker_value)]);
    // Sleepers ignore stdin, so only the kernel can end them once gaffer is gone.
    let mut b = bundle();
    b["metadata"]["id"] = json!("marked");
    b["declarations"] =
        json!([{"kind": "secret_ref", "name": "marker", "reference": "env:GAFFER_E2E_MARKER"}]);
    let reference = s.call("bundles/sync", json!({"bundle": b}))["reference"].clone();
    let first = create(&mut s, &reference, "sleeper", None);
    assert!(first.get("result").is_some(), "{first}");
    for _ in 0..6 {
        s.send_request(
            "workers/create",
            json!({"profile": {"kind": "named", "value": "sleeper"}, "config_bundle": reference}),
        );
    }
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        !processes_with_env(&marker).is_empty(),
        "the marker reaches the workers"
    );
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = processes_with_env(&marker);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "worker processes outlived gaffer: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_clean_exit_stops_owned_workers_and_records_why() {
    let ws = workspace();
    let mut a = ws.start(&[]);
    let reference = sync(&mut a);
    let running = create(&mut a, &reference, "sleeper", None)["result"]["worker"].clone();
    let id = running["id"].as_str().unwrap().to_string();
    wait_transcript(&mut a, &id, "sleeping");
    // The client closes its end: the session ends and the workers it owned are wound down.
    assert_eq!(a.finish(), 0);
    let mut b = ws.start(&[]);
    let w = b.call("workers/get", json!({"worker_id": id}))["worker"].clone();
    assert_eq!(w["status"], "stopped", "{w}");
    assert_eq!(w["input_capable"], false);
    assert!(
        w["reason"]
            .as_str()
            .is_some_and(|r| r.contains("shutting down")),
        "stopped by its own gaffer on the way out, not found orphaned later: {w}"
    );
}
