//! A pending worker is started only by the operation its creator submitted for it. Another
//! client (here `anonymous`, whose own worker starts a trusted rule allows) submits
//! `worker.start` naming the id of `ci-agent`'s pending worker: it must not start it under its
//! own rule, read its first input, nor tell that it exists.

mod common;

use common::gate::Env;
use serde_json::{Value, json};

/// Anonymous connections may start echo workers; `ci-agent`'s starts wait for the operator.
const POLICY: &str = r#"rules:
  - id: anonymous-starts
    effect: allow
    clients: ["anonymous"]
    operations: ["worker.start"]
  - id: ci-asks
    effect: request
    clients: ["ci-agent"]
    operations: ["worker.start"]
    grant_policy: {mode: execution, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10}
"#;

const FIRST: &str = "CI INSTRUCTIONS: deploy with the release key";

fn submit_start(s: &mut common::Server, worker_id: &str, target: &Value, key: &str) -> Value {
    let mut target = target.clone();
    target["worker_id"] = json!(worker_id);
    common::gate::submit(s, "worker.start", target, json!({}), key)
}

#[test]
fn another_clients_pending_worker_is_neither_started_nor_shown() {
    let env = Env::new(Some(POLICY));
    let mut ci = env.agent("ci-agent");
    let (reference, w) = common::gate::reader_worker(&mut ci, FIRST);
    assert_eq!(w["status"], "pending_approval", "{w}");
    let id = w["id"].as_str().unwrap();

    let mut anon = env.start(&[]);
    anon.call("initialize", json!({"clientInfo": {"name": "ci-agent"}}));
    anon.notify("initialized", json!({}));
    let target = json!({"config_bundle": reference, "profile": {"kind": "named", "value": "cat"}});
    let theirs = submit_start(&mut anon, id, &target, "mine-1");
    let missing = submit_start(&mut anon, "wk_doesnotexist", &target, "mine-2");
    let text = theirs.to_string();
    assert!(theirs.get("error").is_some(), "{theirs}");
    assert!(!text.contains("deploy with the release key"), "{text}");
    // Answered as a worker that does not exist.
    assert_eq!(
        theirs["error"]["message"], missing["error"]["message"],
        "{theirs} {missing}"
    );
    assert_eq!(
        theirs["error"]["data"], missing["error"]["data"],
        "{theirs} {missing}"
    );

    // The worker still waits for its own start, which the operator decides.
    let again = ci.call("workers/get", json!({"worker_id": id}));
    assert_eq!(again["worker"]["status"], "pending_approval", "{again}");
}
