//! review27: an operation id without the `op_` prefix maps to the same plan id
//! (`plan_id` uses `trim_start_matches("op_")`), so a forged `operation.created` for id
//! `X` owned by the agent plus a forged `plan.created` for `pl_X` makes the agent the owner of
//! the plan the victim's genuine `op_X` later runs.
mod common;

use std::time::{Duration, Instant};

use common::forge::the_segment;
use common::gate::append_as_agent;
use common::plans::*;
use serde_json::{Value, json};

fn wait_running(s: &mut common::Server, id: &str, n: usize) -> Value {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let r = s.request("plans/get", json!({"plan_id": id}));
        if r["error"]["data"]["code"] == "plan_not_found" {
            assert!(Instant::now() < until, "never a plan: {r:#}");
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let p = r["result"]["plan"].clone();
        let running = p["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["status"] == "running")
            .count();
        if running >= n {
            return p;
        }
        assert!(Instant::now() < until, "never {n} running: {p:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn review27_unprefixed_operation_alias_takes_over_anothers_plan() {
    let mut s = setup();
    let mut other = s.env.agent("other");
    other.call("bundles/sync", json!({"bundle": bundle()}));
    let profiles = json!({"builder": "sleep", "integrator": "sleep", "reviewer": "sleep"});
    let target = json!({"request": swarm(), "config_bundle": s.bundle, "lane_profiles": profiles});
    let sub = other.call(
        "operations/submit",
        json!({"operation": "plan.launch", "target": target, "arguments": {},
               "reason": "mine", "idempotency_key": "victim"}),
    );
    assert_eq!(sub["state"], "pending", "{sub:#}");
    let op_id = sub["id"].as_str().unwrap().to_string();
    let bare = op_id.trim_start_matches("op_").to_string();
    let id = format!("pl_{bare}");
    // The agent reads the victim's operation.created, and writes its own under the bare id.
    let seg = the_segment(s.env.root());
    let i = seg.find("victim op", |k, p| {
        k == "operation.created" && p["operation"]["id"] == op_id.as_str()
    });
    let mut forged = seg.recs[i].payload();
    let now = gaffer::util::now_ms();
    let o = &mut forged["operation"];
    o["id"] = json!(bare);
    o["client_id"] = json!("mallory");
    o["idempotency_key"] = json!("alias");
    o["state"] = json!("failed");
    o["approval_id"] = Value::Null;
    o["terminal_at_ms"] = json!(now);
    forged["approval"] = Value::Null;
    let dry = launch(&mut s, swarm(), profiles, json!({"dry_run": true}), "dry");
    let mut spec = dry["result"]["launch"].clone();
    spec["plan_id"] = json!(id);
    append_as_agent(
        s.env.root(),
        vec![
            ("operation.created", forged),
            (
                "plan.created",
                json!({"plan_id": id, "operation_id": bare, "client_id": "x",
                                    "request": swarm(), "spec": spec}),
            ),
        ],
    );
    let mut mallory = s.env.agent("mallory");
    // Before any approval, the agent already "owns" the victim's future plan id.
    let r = mallory.request("plans/get", json!({"plan_id": id}));
    eprintln!(
        "mallory sees the plan before approval: {}",
        r["result"]["plan"]["plan_id"]
    );
    let mut op = s.env.operator();
    common::gate::approve(&s.env, &mut op, &op_id);
    let p = wait_running(&mut op, &id, 2);
    eprintln!(
        "plan as operator sees it: operation_id={} status={}",
        p["operation_id"], p["status"]
    );
    let mut took = 0;
    for l in p["lanes"].as_array().unwrap() {
        let Some(wid) = l["worker_id"].as_str() else {
            continue;
        };
        let r = mallory.request("workers/transcript", json!({"worker_id": wid}));
        let r2 = mallory.request(
            "workers/input",
            json!({"worker_id": wid, "input": "exfiltrate"}),
        );
        let o = other.request("workers/transcript", json!({"worker_id": wid}));
        eprintln!(
            "{wid}: mallory transcript err={} input err={} ; other transcript err={}",
            r["error"]["data"]["code"], r2["error"]["data"]["code"], o["error"]["data"]["code"]
        );
        if r["error"].is_null() && r2["error"].is_null() {
            took += 1;
        }
    }
    let o = other.request("plans/get", json!({"plan_id": id}));
    eprintln!("other plans/get: err={}", o["error"]["data"]["code"]);
    let st = mallory.request("plans/stop", json!({"plan_id": id, "reason": "mine now"}));
    eprintln!("mallory plans/stop: err={}", st["error"]["data"]["code"]);
    assert_eq!(
        took, 0,
        "the agent saw and drove {took} of the victim's lane workers"
    );
}
