//! What launching a plan costs, printed as live measurements of this run (no baselines):
//!
//! - `plans/launch` → every lane worker running, for a 4-lane plan (persistent_workers, all
//!   lanes at once) under a trusted allow rule, through the library as a serving gaffer runs it;
//! - the same four workers started one by one with `workers/create` (the per-worker path a
//!   plan replaces), and four sandboxed spawns of the same program measured directly: what a
//!   lane costs above the process it runs;
//! - `plans/get` of a plan holding N evidence records (each verified when shown).
//!
//! `cargo bench --bench plans` (ROUNDS=N to change the sample count, default 20).

use std::time::{Duration, Instant};

use gaffer::methods::{App, AppConfig, call_local};
use gaffer::rpc::Role;
use serde_json::{Value, json};

fn rounds() -> usize {
    std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

fn report(what: &str, mut v: Vec<Duration>) -> Duration {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let median = v[v.len() / 2];
    println!(
        "{what:<52} median {:>8.2} ms   p90 {:>8.2} ms   min {:>8.2} ms   (n={})",
        ms(median),
        ms(v[v.len() * 9 / 10]),
        ms(v[0]),
        v.len()
    );
    median
}

const POLICY: &str = "rules:
  - id: launch
    effect: allow
    clients: [anonymous]
    operations: [\"plan.launch\", \"worker.start\"]
";

fn workspace() -> (tempfile::TempDir, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = tempfile::tempdir().expect("cfg");
    let key = cfg.path().join("operator.key");
    gaffer::operator::OperatorSigner::init(&key, &key.with_extension("pub"), None).expect("key");
    // SAFETY: set before any thread of this benchmark reads the environment.
    unsafe { std::env::set_var("GAFFER_OPERATOR_KEY_FILE", &key) };
    std::fs::create_dir(dir.path().join(".gaffer")).expect(".gaffer");
    std::fs::write(dir.path().join(".gaffer/policy.yaml"), POLICY).expect("policy");
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--workspace")
        .arg(dir.path())
        .arg("trust")
        .env("GAFFER_OPERATOR_KEY_FILE", &key)
        .output()
        .expect("trust");
    assert!(st.status.success(), "{st:?}");
    (dir, cfg)
}

const ARGV: [&str; 3] = ["sh", "-c", "cat >/dev/null"];

async fn call(app: &std::sync::Arc<App>, method: &str, params: Value) -> Value {
    call_local(app.clone(), Role::Agent, method, params)
        .await
        .unwrap_or_else(|e| panic!("{method}: {e:?}"))
}

async fn all_running(app: &std::sync::Arc<App>, plan_id: &str) {
    let mut notices = app.workspace.subscribe();
    loop {
        let n = app.workspace.read(|s| {
            s.plans.get(plan_id).map(|p| {
                p.lanes
                    .values()
                    .filter(|l| l.run == gaffer::plans::state::LaneRun::Running)
                    .count()
            })
        });
        if n == Some(4) {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_millis(50), notices.recv()).await;
    }
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (dir, _cfg) = workspace();
    let n = rounds();
    rt.block_on(async {
        let app = App::open(dir.path(), AppConfig::default()).expect("open");
        gaffer::operations::start_runtime(&app.operations);
        let bundle = json!({"metadata": {"id": "bench", "revision": "r1", "created_at": "now", "provenance": {"source": "bench"}},
            "profiles": [{"selector": {"kind": "named", "value": "worker-code-fast"}, "command": ARGV, "input_mode": "stdin_text"}]});
        let reference = call(&app, "bundles/sync", json!({"bundle": bundle})).await["reference"].clone();

        let mut launches = Vec::new();
        for i in 0..n {
            let t = Instant::now();
            let r = call(
                &app,
                "plans/launch",
                json!({"request": {"objective": "Refactor the auth module", "persistent_workers": true},
                       "config_bundle": reference, "idempotency_key": format!("bench-{i}")}),
            )
            .await;
            let id = r["plan"]["plan_id"].as_str().expect("plan id").to_string();
            all_running(&app, &id).await;
            launches.push(t.elapsed());
            call(&app, "plans/stop", json!({"plan_id": id, "reason": "bench"})).await;
        }
        let launch = report("plans/launch → 4 lane workers running", launches);

        let mut creates = Vec::new();
        for _ in 0..n {
            let t = Instant::now();
            let mut ids = Vec::new();
            for _ in 0..4 {
                let w = call(
                    &app,
                    "workers/create",
                    json!({"profile": {"kind": "named", "value": "worker-code-fast"}, "config_bundle": reference}),
                )
                .await;
                ids.push(w["worker"]["id"].clone());
            }
            creates.push(t.elapsed());
            for id in ids {
                call(&app, "workers/stop", json!({"worker_id": id})).await;
            }
        }
        let create = report("4 × workers/create (running)", creates);

        let mut spawns = Vec::new();
        for _ in 0..n {
            let t = Instant::now();
            let mut children = Vec::new();
            for _ in 0..4 {
                let mut cmd = tokio::process::Command::new(ARGV[0]);
                cmd.args(&ARGV[1..])
                    .current_dir(dir.path())
                    .stdin(std::process::Stdio::piped())
                    .kill_on_drop(true);
                let spec = gaffer::sandbox::Spec::new(dir.path());
                gaffer::sandbox::confine(&mut cmd, &spec, gaffer::sandbox::Setting::Required).expect("sandbox");
                children.push(cmd.spawn().expect("spawn"));
            }
            spawns.push(t.elapsed());
            drop(children);
        }
        let spawn = report("4 sandboxed spawns of the same program", spawns);
        let per = |d: Duration| d.as_secs_f64() * 1e3 / 4.0;
        println!(
            "{:<52} {:>8.2} ms per lane (launch), {:.2} ms per worker (create), {:.2} ms per spawn",
            "  per process, from the medians above",
            per(launch),
            per(create),
            per(spawn)
        );
        evidence_cost(&app, &reference).await;
    });
}

/// `plans/get` of one plan with N recorded evidence records (operation kind, each verified
/// against the operation state when shown).
async fn evidence_cost(app: &std::sync::Arc<App>, reference: &Value) {
    let r = call(
        app,
        "plans/launch",
        json!({"request": {"objective": "Refactor the auth module", "persistent_workers": true},
               "config_bundle": reference, "idempotency_key": "evidence"}),
    )
    .await;
    let id = r["plan"]["plan_id"].as_str().expect("plan id").to_string();
    all_running(app, &id).await;
    let op = r["plan"]["operation_id"].clone();
    for total in [10usize, 100, 1000] {
        let have = app
            .workspace
            .read(|s| s.plans.get(&id).map(|p| p.evidence.len()).unwrap_or(0));
        for _ in have..total {
            call_local(
                app.clone(),
                Role::Operator,
                "plans/evidence",
                json!({"plan_id": id, "lane_id": "lane-1-builder", "expectation": "e1",
                       "kind": "operation", "operation_id": op}),
            )
            .await
            .expect("evidence");
        }
        let mut v = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            call(app, "plans/get", json!({"plan_id": id})).await;
            v.push(t.elapsed());
        }
        let m = report(&format!("plans/get with {total} evidence records"), v);
        println!(
            "{:<52} {:>8.2} µs per evidence record",
            "",
            m.as_secs_f64() * 1e6 / total as f64
        );
    }
    call(app, "plans/stop", json!({"plan_id": id, "reason": "bench"})).await;
}
