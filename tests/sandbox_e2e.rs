//! Every process gaffer starts is sandboxed: a worker cannot read outside the workspace, write
//! (or read) `.gaffer/`, read the operator key, or connect to a loopback listener, unless a
//! declaration grants it. The same probe script run unsandboxed shows each check can fail.
//! These tests need Landlock ABI >= 6 and user namespaces and fail loudly without them.

mod common;

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use common::Server;
use common::gate::Env;
use serde_json::{Value, json};

const POLICY: &str = r#"
rules:
  - id: sandbox-tests
    effect: allow
    clients: [anonymous]
    operations: ["worker.start"]
  # A grant widens the sandbox: an allow rule covers declarations only by naming them.
  - id: sandbox-tests-with-grants
    effect: allow
    clients: [anonymous]
    operations: ["worker.start"]
    targets: [{kind: worker, fields: {declarations: ["mount_grant:**", "network_policy:**"]}}]
"#;

struct Fixture {
    env: Env,
    outside: tempfile::TempDir,
    listener: TcpListener,
    host: HostProcess,
}

/// A process outside the sandbox whose command line is the marker the probe looks for in
/// `/proc` (a secret an operator's tool passed on its command line, say).
struct HostProcess(std::process::Child);

impl HostProcess {
    fn marker(&self) -> String {
        format!("host-marker-{}", self.0.id())
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn host_process() -> HostProcess {
    // The marker is the process's argv[0]; `exec -a` names it after the shell's own pid, which
    // the exec keeps.
    let child = std::process::Command::new("bash")
        .args(["-c", "exec -a host-marker-$$ sleep 600"])
        .spawn()
        .unwrap();
    let host = HostProcess(child);
    let cmdline = format!("/proc/{}/cmdline", host.0.id());
    let until = Instant::now() + Duration::from_secs(10);
    while !std::fs::read(&cmdline).is_ok_and(|c| c.starts_with(host.marker().as_bytes())) {
        assert!(Instant::now() < until, "the marker process never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    host
}

fn fixture() -> Fixture {
    let (code, out, _) = common::run_cli(Path::new("/"), &["doctor"]);
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("doctor: {out}"));
    let sandbox = sandbox_check(&report);
    assert_eq!(
        sandbox["ok"], true,
        "this kernel cannot sandbox (exit {code}): {sandbox}"
    );
    let env = Env::untrusted(Some(POLICY));
    std::fs::remove_file(env.root().join(".gaffer/providers.yaml")).unwrap();
    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "{out} {err}");
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("private.txt"), "outside data\n").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    Fixture {
        env,
        outside,
        listener,
        host: host_process(),
    }
}

/// Prints one `name:result` line per boundary.
fn probe_script(f: &Fixture) -> String {
    let port = f.listener.local_addr().unwrap().port();
    format!(
        r#"G=.gaf""fer  # bundle validation refuses the store's name as written; an agent splits it
cat '{outside}/private.txt' >/dev/null 2>&1 && echo outside:readable || echo outside:denied
cat '{key}' >/dev/null 2>&1 && echo key:readable || echo key:denied
(echo pwn > $G/pwn) 2>/dev/null && echo gaffer:writable || echo gaffer:denied
ls $G/journal >/dev/null 2>&1 && echo journal:readable || echo journal:denied
(echo hi > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo net:connected || echo net:denied
(echo in > inside.txt) 2>/dev/null && echo workspace:writable || echo workspace:denied
# Builtins only, and the marker split as written, so no process of the probe's own carries it.
M={mark_head}""{mark_tail}; seen=hidden
for c in /proc/[0-9]*/cmdline; do IFS= read -r -d '' a < "$c" 2>/dev/null; [ "$a" = "$M" ] && seen=listed; done
echo hostproc:$seen
echo probe:done
"#,
        outside = f.outside.path().display(),
        key = f.env.key_file.display(),
        mark_head = &f.host.marker()[..4],
        mark_tail = &f.host.marker()[4..],
    )
}

fn results(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text
        .lines()
        .filter(|l| l.contains(':') && !l.starts_with("worker "))
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

/// Runs the probe as a worker with `declarations`; returns its stdout lines, sorted.
fn run_worker(f: &Fixture, id: &str, declarations: Value) -> Vec<String> {
    let data = f.outside.path().display().to_string();
    let s: Server = f.env.start(&[("E2E_DATA_DIR", &data)]);
    let (w, out) = worker_ended(s, f, id, declarations);
    assert_eq!(w["status"], "stopped", "{w}");
    out
}

/// `gaffer serve` where the kernel refuses a sandbox a `/proc` of its own, as in a container
/// that masks parts of its `/proc`: in a user and mount namespace of its own, a tmpfs covers
/// `/proc/sys`.
fn served_with_proc_masked(f: &Fixture) -> Server {
    Server::start_cmd(
        with_proc_masked(f, "serve"),
        f.env.root(),
        common::Wire::Ndjson,
    )
}

fn with_proc_masked(f: &Fixture, command: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["-Urm", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount -t tmpfs tmpfs /proc/sys && exec "$0" "$@""#)
        .arg(common::BIN)
        .arg("--workspace")
        .arg(f.env.root())
        .arg(command)
        .envs(f.env.env());
    cmd
}

/// `gaffer doctor`'s sandbox check where the kernel refuses a sandbox its own `/proc`.
fn doctor_with_proc_masked(f: &Fixture) -> Value {
    let out = with_proc_masked(f, "doctor").output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("doctor: {}", String::from_utf8_lossy(&out.stdout)));
    sandbox_check(&report)
}

fn sandbox_check(report: &Value) -> Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "sandbox")
        .cloned()
        .unwrap()
}

/// Creates the probe worker on `s` and waits for it to end: (the worker, its stdout lines),
/// or (the create's error, nothing).
fn worker_ended(mut s: Server, f: &Fixture, id: &str, declarations: Value) -> (Value, Vec<String>) {
    let bundle = json!({
        "metadata": {"id": id, "revision": "r1", "created_at": "2026-12-01", "provenance": {"source": "e2e"}},
        "profiles": [{"selector": {"kind": "named", "value": "probe"}, "command": ["bash", "-c", probe_script(f)]}],
        "declarations": declarations,
    });
    let reference = s.call("bundles/sync", json!({"bundle": bundle}))["reference"].clone();
    let created = s.request(
        "workers/create",
        json!({"profile": {"kind": "named", "value": "probe"}, "config_bundle": reference}),
    );
    if !created["error"].is_null() {
        // An allowed start runs within the create: a refusal is its error.
        return (created["error"].clone(), Vec::new());
    }
    let wid = created["result"]["worker"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    let w = loop {
        let w = s.call("workers/get", json!({"worker_id": wid}))["worker"].clone();
        if w["status"] == "stopped" || w["status"] == "failed" {
            break w;
        }
        assert!(Instant::now() < deadline, "worker never ended: {w}");
        std::thread::sleep(Duration::from_millis(25));
    };
    if w["status"] == "failed" {
        return (w, Vec::new());
    }
    let t = s.call("workers/transcript", json!({"worker_id": wid}));
    let out: String = t["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["stream"] == "stdout")
        .map(|e| e["text"].as_str().unwrap().to_string())
        .collect();
    assert!(out.contains("probe:done"), "{t}");
    (w, results(&out))
}

/// What a sandboxed probe without declarations reports, with what it saw in `/proc`.
fn confined(hostproc: &str) -> Vec<String> {
    expect(&[
        "outside:denied",
        "key:denied",
        "gaffer:denied",
        "journal:denied",
        "net:denied",
        "workspace:writable",
        hostproc,
    ])
}

fn expect(pairs: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = pairs.iter().map(|s| s.to_string()).collect();
    v.push("probe:done".into());
    v.sort();
    v
}

#[test]
fn unsandboxed_the_probe_reaches_everything() {
    let f = fixture();
    let out = std::process::Command::new("bash")
        .args(["-c", &probe_script(&f)])
        .current_dir(f.env.root())
        .output()
        .unwrap();
    assert_eq!(
        results(&String::from_utf8_lossy(&out.stdout)),
        expect(&[
            "outside:readable",
            "key:readable",
            "gaffer:writable",
            "journal:readable",
            "net:connected",
            "workspace:writable",
            "hostproc:listed",
        ])
    );
}

#[test]
fn a_sandboxed_worker_reaches_only_the_workspace() {
    let f = fixture();
    let got = run_worker(&f, "confined", json!([]));
    assert_eq!(got, confined("hostproc:hidden"));
    assert!(!f.env.root().join(".gaffer/pwn").exists());
    assert_eq!(
        std::fs::read_to_string(f.env.root().join("inside.txt")).unwrap(),
        "in\n"
    );
}

#[test]
fn declarations_grant_exactly_what_they_name() {
    let f = fixture();
    let port = f.listener.local_addr().unwrap().port();
    let got = run_worker(
        &f,
        "granted",
        json!([
            {"kind": "mount_grant", "name": "data", "reference": "mount:read:E2E_DATA_DIR"},
            {"kind": "network_policy", "name": "api", "reference": format!("network:tcp-connect:{port}")},
        ]),
    );
    assert_eq!(
        got,
        expect(&[
            "outside:readable",
            "key:denied",
            "gaffer:denied",
            "journal:denied",
            "net:connected",
            "workspace:writable",
            "hostproc:hidden",
        ])
    );
    // The listener really got the connection.
    f.listener.set_nonblocking(false).unwrap();
    let (mut conn, _) = f.listener.accept().unwrap();
    let mut buf = String::new();
    conn.read_to_string(&mut buf).unwrap();
    assert_eq!(buf, "hi\n");
}

#[test]
fn where_the_kernel_refuses_a_proc_of_its_own_nothing_starts_unless_the_operator_accepts_the_hosts()
{
    let f = fixture();
    // Required (the default): the worker fails to start, saying why and what would accept it.
    let (e, out) = worker_ended(served_with_proc_masked(&f), &f, "masked", json!([]));
    assert_eq!(e["data"]["code"], "worker_spawn_failed", "{e}");
    assert!(out.is_empty(), "{out:?}");
    let why = e["data"]["diagnostic"].to_string();
    assert!(
        why.contains("/proc of its own") && why.contains("shared_proc"),
        "{why}"
    );
    assert!(!f.env.root().join("inside.txt").exists(), "the probe ran");
    let check = doctor_with_proc_masked(&f);
    assert_eq!(check["ok"], false, "{check}");
    assert!(
        check["detail"].to_string().contains("refuses to start"),
        "{check}"
    );
    // The operator accepts the host's /proc in the trusted policy: the worker runs sandboxed,
    // and sees the host's processes' command lines, as the policy said it would.
    let policy = f.env.root().join(".gaffer/policy.yaml");
    let text = std::fs::read_to_string(&policy).unwrap();
    std::fs::write(&policy, format!("sandbox: shared_proc\n{text}")).unwrap();
    let (code, out, err) = f.env.trust_reviewed();
    assert_eq!(code, 0, "{out} {err}");
    let check = doctor_with_proc_masked(&f);
    assert_eq!(check["ok"], false, "{check}");
    assert!(
        check["detail"]
            .to_string()
            .contains("see every host process"),
        "{check}"
    );
    let (w, out) = worker_ended(served_with_proc_masked(&f), &f, "shared", json!([]));
    assert_eq!(w["status"], "stopped", "{w}");
    assert_eq!(out, confined("hostproc:listed"));
    // Where the kernel gives it one, a sandbox under `shared_proc` still gets its own.
    let got = run_worker(&f, "unmasked", json!([]));
    assert!(got.contains(&"hostproc:hidden".to_string()), "{got:?}");
}
