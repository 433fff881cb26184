//! What the sandbox costs, printed as live measurements (no baselines, no ratios):
//!
//! - spawn → first output byte of `sh -c 'echo ready; cat'` (a worker's shape), unconfined
//!   (process group + death with parent only) and sandboxed;
//! - one whole `command.run`-shaped run of `true` (spawn, exit, reap), unconfined and
//!   sandboxed: the per-run overhead;
//! - `workers/create` → first output through the real runtime (create, `worker.start`
//!   execution, spawn, journalled output), with the authorizing rule in place, sandboxed and
//!   with the trusted policy's `sandbox: off`.
//!
//! `cargo bench --bench sandbox` (ROUNDS=N to change the sample count).

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::process::Command;

fn rounds() -> usize {
    std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

fn report(what: &str, mut v: Vec<Duration>) -> Duration {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let median = v[v.len() / 2];
    println!(
        "{what:<44} median {:>8.0} µs   p90 {:>8.0} µs   min {:>8.0} µs   (n={})",
        us(median),
        us(v[v.len() * 9 / 10]),
        us(v[0]),
        v.len()
    );
    median
}

fn command(ws: &std::path::Path, argv: &[&str], sandboxed: bool) -> Command {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..])
        .current_dir(ws)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let setting = if sandboxed {
        gaffer::sandbox::Setting::Required
    } else {
        gaffer::sandbox::Setting::Off
    };
    let spec = gaffer::sandbox::Spec::new(ws).with_timeout_ms(Some(60_000));
    gaffer::sandbox::confine(&mut cmd, &spec, setting).expect("the sandbox is available");
    cmd
}

async fn first_output(ws: &std::path::Path, sandboxed: bool) -> Duration {
    let t = Instant::now();
    let mut child = command(ws, &["sh", "-c", "echo ready; cat"], sandboxed)
        .spawn()
        .expect("spawn");
    let mut out = child.stdout.take().expect("stdout");
    let mut b = [0u8; 1];
    out.read_exact(&mut b).await.expect("first byte");
    let d = t.elapsed();
    drop(child.stdin.take());
    let _ = child.wait().await;
    d
}

async fn whole_run(ws: &std::path::Path, sandboxed: bool) -> Duration {
    let t = Instant::now();
    let status = command(ws, &["true"], sandboxed)
        .stdin(Stdio::null())
        .status()
        .await
        .expect("run");
    assert!(status.success());
    t.elapsed()
}

fn main() {
    let cfg = tempfile::tempdir().expect("cfg");
    let key = cfg.path().join("operator.key");
    gaffer::operator::OperatorSigner::init(&key, &key.with_extension("pub"), None).expect("key");
    // SAFETY: set before any other thread exists.
    unsafe { std::env::set_var("GAFFER_OPERATOR_KEY_FILE", &key) };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join(".gaffer")).expect(".gaffer");
    let ws = dir.path();
    let n = rounds();
    println!("kernel: {:?}", gaffer::sandbox::probe());
    rt.block_on(async {
        // Warm up the page cache and the binaries.
        for s in [false, true] {
            first_output(ws, s).await;
        }
        let mut plain = Vec::new();
        let mut boxed = Vec::new();
        for _ in 0..n {
            plain.push(first_output(ws, false).await);
            boxed.push(first_output(ws, true).await);
        }
        let a = report("spawn → first output, unconfined", plain);
        let b = report("spawn → first output, sandboxed", boxed);
        println!(
            "{:<44} {:>+8.0} µs (difference of the medians above)",
            "  sandbox adds",
            (b.as_secs_f64() - a.as_secs_f64()) * 1e6
        );
        let mut plain = Vec::new();
        let mut boxed = Vec::new();
        for _ in 0..n {
            plain.push(whole_run(ws, false).await);
            boxed.push(whole_run(ws, true).await);
        }
        let a = report("command run of `true`, unconfined", plain);
        let b = report("command run of `true`, sandboxed", boxed);
        println!(
            "{:<44} {:>+8.0} µs (difference of the medians above)",
            "  sandbox adds per run",
            (b.as_secs_f64() - a.as_secs_f64()) * 1e6
        );
    });
    runtime_create(&rt, &key, n.min(50));
}

/// A workspace whose trusted policy lets the bench worker start, sandboxed or `sandbox: off`,
/// served by the library as a serving gaffer runs it.
fn runtime_app(
    dir: &std::path::Path,
    key: &std::path::Path,
    sandboxed: bool,
) -> std::sync::Arc<gaffer::methods::App> {
    use gaffer::methods::{App, AppConfig};
    std::fs::create_dir(dir.join(".gaffer")).expect(".gaffer");
    std::fs::write(
        dir.join(".gaffer/policy.yaml"),
        format!(
            "sandbox: {}\nrules:\n  - id: b\n    effect: allow\n    clients: [anonymous]\n    operations: [\"worker.start\"]\n",
            if sandboxed { "on" } else { "off" }
        ),
    )
    .expect("policy");
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--workspace")
        .arg(dir)
        .arg("trust")
        .env("GAFFER_OPERATOR_KEY_FILE", key)
        .output()
        .expect("trust");
    assert!(st.status.success(), "{st:?}");
    App::open(dir, AppConfig::default()).expect("open")
}

/// One `workers/create` → its first journalled output.
async fn create_once(
    app: &std::sync::Arc<gaffer::methods::App>,
    reference: &serde_json::Value,
) -> Duration {
    use gaffer::methods::call_local;
    use gaffer::rpc::Role;
    use serde_json::json;
    let mut notices = app.workspace.subscribe();
    let t = Instant::now();
    let w = call_local(
        app.clone(),
        Role::Agent,
        "workers/create",
        json!({"profile": {"kind": "named", "value": "echo"}, "config_bundle": reference}),
    )
    .await
    .expect("create");
    let id = w["worker"]["id"].as_str().expect("id").to_string();
    loop {
        let n = notices.recv().await.expect("notice");
        if &*n.method == "workers/output" && n.params.str_field("worker_id") == Some(id.as_str()) {
            break;
        }
    }
    let d = t.elapsed();
    let _ = call_local(
        app.clone(),
        Role::Agent,
        "workers/stop",
        json!({"worker_id": id}),
    )
    .await;
    d
}

/// `workers/create` → first output through the runtime, `sandbox: off` and sandboxed rounds
/// interleaved so both see the same machine.
fn runtime_create(rt: &tokio::runtime::Runtime, key: &std::path::Path, n: usize) {
    use gaffer::methods::call_local;
    use gaffer::rpc::Role;
    use serde_json::json;
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    rt.block_on(async {
        let mut apps = Vec::new();
        for (dir, sandboxed) in dirs.iter().zip([false, true]) {
            let app = runtime_app(dir.path(), key, sandboxed);
            gaffer::operations::start_runtime(&app.operations);
            let bundle = json!({"metadata": {"id": "bench", "revision": "r1", "created_at": "now", "provenance": {"source": "bench"}},
                "profiles": [{"selector": {"kind": "named", "value": "echo"}, "command": ["sh", "-c", "echo ready; cat"]}]});
            let r = call_local(app.clone(), Role::Agent, "bundles/sync", json!({"bundle": bundle}))
                .await
                .expect("sync");
            apps.push((app, r["reference"].clone()));
        }
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for _ in 0..n {
            off.push(create_once(&apps[0].0, &apps[0].1).await);
            on.push(create_once(&apps[1].0, &apps[1].1).await);
        }
        let a = report("workers/create → first output, sandbox: off", off);
        let b = report("workers/create → first output, sandboxed", on);
        println!(
            "{:<44} {:>+8.0} µs (difference of the medians above)",
            "  sandbox adds",
            (b.as_secs_f64() - a.as_secs_f64()) * 1e6
        );
    });
}
