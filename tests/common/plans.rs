//! Plan test environment: a trusted policy for a `planner` client and its lanes, the scripted
//! lane worker (tests/scripts/lane_worker.py) copied into the workspace, a bundle with one
//! profile per lane behaviour, and helpers to launch and follow plans.

use std::time::{Duration, Instant};

use super::Server;
use super::gate::Env;
use serde_json::{Value, json};

pub const POLICY: &str = r#"rules:
  - id: planner-launches
    effect: allow
    clients: ["planner"]
    operations: ["plan.launch"]
    targets: [{kind: plan, fields: {bundle_id: ["lanes"]}}]
  - id: others-ask-the-operator
    effect: request
    clients: ["other"]
    operations: ["plan.launch"]
    grant_policy: {mode: execution, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10}
  - id: lanes-run-checks
    effect: allow
    clients: ["pl_*/*"]
    operations: ["command.run"]
    targets: [{kind: command, fields: {program: ["true"]}}]
  - id: lanes-write-in-scope
    effect: allow
    clients: ["pl_*/*"]
    operations: ["file.write"]
    lane_scope: inside
  - id: lanes-stay-in-scope
    effect: deny
    clients: ["pl_*/*"]
    operations: ["file.*"]
    lane_scope: outside
"#;

pub const MODES: [&str; 6] = ["good", "note", "fail", "write", "spoof", "sleep"];

pub fn bundle() -> Value {
    let mut profiles: Vec<Value> = MODES
        .iter()
        .map(|m| {
            json!({"selector": {"kind": "named", "value": m},
                   "command": ["python3", "lanes/lane_worker.py", m], "input_mode": "stdin_text"})
        })
        .collect();
    // The roster names persistent-worker lanes use.
    profiles.push(
        json!({"selector": {"kind": "named", "value": "worker-code-fast"},
        "command": ["python3", "lanes/lane_worker.py", "good"], "input_mode": "stdin_text"}),
    );
    json!({"metadata": {"id": "lanes", "revision": "r1", "created_at": "2026-12-01", "provenance": {"source": "e2e"}},
           "profiles": profiles})
}

pub struct Setup {
    pub env: Env,
    pub planner: Server,
    pub bundle: Value,
}

pub fn setup() -> Setup {
    setup_with(POLICY)
}

pub fn setup_with(policy: &str) -> Setup {
    let env = Env::new(Some(policy));
    let lanes = env.root().join("lanes");
    std::fs::create_dir_all(&lanes).unwrap();
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scripts/lane_worker.py"),
        lanes.join("lane_worker.py"),
    )
    .unwrap();
    let mut planner = env.agent("planner");
    let synced = planner.call("bundles/sync", json!({"bundle": bundle()}));
    let bundle = synced["reference"].clone();
    Setup {
        env,
        planner,
        bundle,
    }
}

pub const SWARM: &str = "Add rate limiting to the API router and the billing module, with tests";

pub fn swarm() -> Value {
    json!({"objective": SWARM, "scopes": ["router", "billing"], "tests_required": true})
}

pub fn phased() -> Value {
    json!({"objective": "Migrate the database schema in phases: first the schema, then the data, then the API",
           "dependencies": ["schema", "data", "api"], "durable": true})
}

pub fn launch(s: &mut Setup, request: Value, profiles: Value, extra: Value, key: &str) -> Value {
    let mut p = json!({"request": request, "config_bundle": s.bundle, "lane_profiles": profiles,
                       "idempotency_key": key});
    for (k, v) in extra.as_object().unwrap() {
        p[k] = v.clone();
    }
    s.planner.request("plans/launch", p)
}

pub fn plan(s: &mut Server, id: &str) -> Value {
    s.call("plans/get", json!({"plan_id": id}))["plan"].clone()
}

pub fn wait_plan(s: &mut Server, id: &str, want: &[&str]) -> Value {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let p = plan(s, id);
        if want.contains(&p["status"].as_str().unwrap_or_default()) {
            return p;
        }
        assert!(Instant::now() < until, "plan never reached {want:?}: {p:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn lane<'a>(p: &'a Value, id: &str) -> &'a Value {
    p["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["lane_id"] == id)
        .unwrap_or_else(|| panic!("no lane {id}: {p:#}"))
}

pub fn transcript(s: &mut Server, worker: &Value) -> String {
    let t = s.call(
        "workers/transcript",
        json!({"worker_id": worker, "limit": 1000}),
    );
    t["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| format!("{} {}", e["stream"], e["text"].as_str().unwrap_or_default()))
        .collect::<Vec<_>>()
        .join("")
}
