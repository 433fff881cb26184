//! Plans against a hostile agent, on the real binary. The agent writes journal records with the
//! store's own writer (valid framing and chain), talks to gaffer as a client, and runs lane
//! workers. None of it makes a plan look done, starts a lane early, takes over another plan,
//! widens a lane's scope or slips past a deny rule.

mod common;

use std::time::{Duration, Instant};

use common::Server;
use common::gate::append_as_agent;
use common::plans::*;
use serde_json::{Value, json};

fn plan_id(r: &Value) -> String {
    r["result"]["plan"]["plan_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{r:#}"))
        .to_string()
}

fn wait_running(s: &mut Server, id: &str, n: usize) -> Value {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        // A launch submitted through `operations/submit` is a plan once its operation has
        // executed, which its submitter does not wait for: until then it is not found.
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
fn forged_lane_and_evidence_records_do_not_complete_a_plan_whose_lanes_did_nothing() {
    let mut s = setup();
    let profiles = json!({"builder": "sleep", "integrator": "sleep", "reviewer": "sleep"});
    let r = launch(&mut s, swarm(), profiles, json!({}), "forge-complete");
    let id = plan_id(&r);
    let p = wait_running(&mut s.planner, &id, 2);
    std::fs::write(s.env.root().join("proof.txt"), "anything").unwrap();
    let sha = gaffer::util::sha256_hex(b"anything");
    let mut recs = Vec::new();
    for (n, l) in p["lanes"].as_array().unwrap().iter().enumerate() {
        let lane_id = l["lane_id"].as_str().unwrap().to_string();
        let mut change = json!({"plan_id": id, "lane_id": lane_id, "run": "succeeded"});
        if !l["worker_id"].is_null() {
            change["worker_id"] = l["worker_id"].clone();
        }
        recs.push(("plan.lane", change));
        for e in l["expectations"].as_array().unwrap() {
            recs.push((
                "plan.evidence",
                json!({"evidence_id": format!("ev_f{n}{}", e["id"].as_str().unwrap()), "plan_id": id,
                       "lane_id": lane_id, "expectation": e["id"], "recorded_by": format!("{id}/{lane_id}"),
                       "evidence": {"kind": "file", "path": "proof.txt", "sha256": sha}}),
            ));
        }
    }
    append_as_agent(s.env.root(), recs);
    std::thread::sleep(Duration::from_secs(2));
    // The process running the plan goes by what it observed: two lanes still run, two wait.
    let p = plan(&mut s.planner, &id);
    assert_eq!(p["attested"], true);
    assert_eq!(p["status"], "running", "{p:#}");
    let running = p["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["status"] == "running")
        .count();
    assert_eq!(running, 2, "{p:#}");
    for e in p["lanes"][0]["expectations"].as_array().unwrap() {
        assert_ne!(e["status"], "verified", "{e:#}");
    }
    // Another process sees only the journal, and will not call it completed either.
    let mut op = s.env.operator();
    let seen = plan(&mut op, &id);
    assert_eq!(seen["attested"], false);
    assert_ne!(seen["status"], "completed", "{seen:#}");
}

#[test]
fn a_forged_lane_success_does_not_start_its_dependent() {
    let mut s = setup();
    let profiles = json!({"phase-worker": "sleep", "reviewer": "sleep"});
    let r = launch(&mut s, phased(), profiles, json!({}), "dep-bypass");
    let id = plan_id(&r);
    let p = wait_running(&mut s.planner, &id, 1);
    let l1 = lane(&p, "lane-1-phase-worker").clone();
    append_as_agent(
        s.env.root(),
        vec![(
            "plan.lane",
            json!({"plan_id": id, "lane_id": "lane-1-phase-worker", "run": "succeeded", "worker_id": l1["worker_id"]}),
        )],
    );
    std::thread::sleep(Duration::from_secs(3));
    let p = plan(&mut s.planner, &id);
    assert_eq!(
        lane(&p, "lane-1-phase-worker")["status"],
        "running",
        "{p:#}"
    );
    assert_eq!(
        lane(&p, "lane-2-phase-worker")["status"],
        "waiting",
        "{p:#}"
    );
    assert!(lane(&p, "lane-2-phase-worker").get("worker_id").is_none());
}

#[test]
fn a_deny_rule_without_clients_reaches_lanes() {
    let policy = format!(
        r#"{POLICY}  - id: nobody-writes-router-ok
    effect: deny
    operations: ["file.write"]
    targets: [{{kind: file, fields: {{path: ["router/ok.txt"]}}}}]
"#
    );
    let mut s = setup_with(&policy);
    let profiles = json!({"builder": "write", "integrator": "note", "reviewer": "note"});
    let r = launch(&mut s, swarm(), profiles, json!({}), "deny");
    let id = plan_id(&r);
    let p = wait_plan(&mut s.planner, &id, &["completed", "incomplete", "stopped"]);
    let said = transcript(&mut s.planner, &lane(&p, "lane-1-builder")["worker_id"]);
    assert!(!s.env.root().join("router/ok.txt").exists(), "{said}");
}

#[test]
fn an_agent_chosen_scope_cannot_be_a_pattern_or_leave_the_workspace() {
    let mut s = setup();
    for scopes in [
        json!(["**", "billing"]),
        json!(["*", "billing"]),
        json!(["../outside", "billing"]),
        json!([".gaffer", "billing"]),
    ] {
        let request = json!({"objective": SWARM, "scopes": scopes, "tests_required": true});
        let profiles = json!({"builder": "write", "integrator": "note", "reviewer": "note"});
        let r = launch(
            &mut s,
            request,
            profiles,
            json!({}),
            &format!("scope-{scopes}"),
        );
        assert_eq!(
            r["error"]["data"]["field"], "request.scopes",
            "{scopes}: {r:#}"
        );
    }
    assert!(!s.env.root().join("elsewhere").exists());
}

#[test]
fn no_caller_names_a_plan_id_and_a_pending_plan_cannot_be_taken_over() {
    let mut s = setup();
    let mut other = s.env.agent("other");
    other.call("bundles/sync", json!({"bundle": bundle()}));
    let r = other.call(
        "plans/launch",
        json!({"request": swarm(), "config_bundle": s.bundle, "idempotency_key": "victim",
               "lane_profiles": {"builder": "good", "integrator": "good", "reviewer": "good"}}),
    );
    let victim = r["plan"]["plan_id"].as_str().unwrap().to_string();
    // Submitting plan.launch directly with the victim's plan id: the target has no such field.
    let sub = s.planner.request(
        "operations/submit",
        json!({"operation": "plan.launch",
               "target": {"plan_id": victim, "request": swarm(), "config_bundle": s.bundle,
                          "lane_profiles": {"builder": "sleep", "integrator": "sleep", "reviewer": "sleep"}},
               "arguments": {}, "reason": "squat", "idempotency_key": "squat"}),
    );
    assert_eq!(sub["error"]["code"], -32602, "{sub:#}");
    // A direct, well-formed submission gets a plan of its own.
    let sub = s.planner.call(
        "operations/submit",
        json!({"operation": "plan.launch",
               "target": {"request": swarm(), "config_bundle": s.bundle,
                          "lane_profiles": {"builder": "sleep", "integrator": "sleep", "reviewer": "sleep"}},
               "arguments": {}, "reason": "mine", "idempotency_key": "mine"}),
    );
    let mine = format!(
        "pl_{}",
        sub["id"].as_str().unwrap().trim_start_matches("op_")
    );
    assert_ne!(mine, victim);
    wait_running(&mut s.planner, &mine, 1);
    let p = plan(&mut other, &victim);
    assert_eq!(p["status"], "pending_approval", "{p:#}");
    assert_eq!(p["operation_id"], r["plan"]["operation_id"]);
    s.planner
        .call("plans/stop", json!({"plan_id": mine, "reason": "done"}));
}

#[test]
fn a_worker_made_to_look_like_a_lane_worker_is_not_reused_by_the_lane() {
    let mut s = setup();
    let profiles = json!({"builder": "good", "integrator": "good", "reviewer": "good"});
    let dry = launch(
        &mut s,
        swarm(),
        profiles.clone(),
        json!({"dry_run": true}),
        "dry",
    );
    let prompt = dry["result"]["launch"]["lanes"][0]["prompt"].clone();
    let squat = s.planner.call(
        "workers/create",
        json!({"profile": {"kind": "named", "value": "sleep"}, "config_bundle": s.bundle,
               "initial_input": prompt, "idempotency_key": "lane-1-builder"}),
    );
    let r = launch(&mut s, swarm(), profiles, json!({}), "real");
    let id = plan_id(&r);
    let p = wait_plan(&mut s.planner, &id, &["completed", "incomplete"]);
    assert_eq!(p["status"], "completed", "{p:#}");
    assert_ne!(
        lane(&p, "lane-1-builder")["worker_id"],
        squat["worker"]["id"]
    );
}

#[test]
fn a_lane_cannot_take_another_lanes_connection_through_proc() {
    // persistent_workers starts every lane at once: the spoofing lane runs beside the others.
    let mut s = setup();
    let request = json!({"objective": "Refactor the auth module", "persistent_workers": true});
    let profiles = json!({"builder": "sleep", "integrator": "spoof", "reviewer": "sleep"});
    let r = launch(&mut s, request, profiles, json!({}), "proc");
    let id = plan_id(&r);
    let until = Instant::now() + Duration::from_secs(60);
    let mut left = std::collections::HashSet::new();
    let said = loop {
        let p = plan(&mut s.planner, &id);
        let spoof = lane(&p, "lane-3-integrator").clone();
        leave_lane_pids(&mut s, &p, &mut left);
        if spoof["worker_id"].is_null() {
            assert!(Instant::now() < until, "{p:#}");
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        let said = transcript(&mut s.planner, &spoof["worker_id"]);
        if said.contains("lane finished") {
            break said;
        }
        assert!(Instant::now() < until, "{said}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(!said.contains("TOOK"), "{said}");
    assert!(said.matches("refused /proc/fd/3").count() >= 2, "{said}");
    // Through its connection a lane finds no other lane's worker.
    assert!(said.matches("worker_not_found").count() >= 2, "{said}");
    s.planner
        .call("plans/stop", json!({"plan_id": id, "reason": "done"}));
}

/// The launching agent sees its plan's lane workers (a lane does not see its siblings'): it
/// leaves each one's pid in the workspace, where the spoofing lane reads them.
fn leave_lane_pids(s: &mut Setup, p: &Value, done: &mut std::collections::HashSet<String>) {
    for l in p["lanes"].as_array().into_iter().flatten() {
        let Some(wid) = l["worker_id"].as_str() else {
            continue;
        };
        if done.contains(wid) {
            continue;
        }
        let w = s.planner.call("workers/get", json!({"worker_id": wid}))["worker"].clone();
        if let Some(pid) = w["owner"]["child_pid"].as_u64() {
            let dir = s.env.root().join("spoof-pids");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(wid), pid.to_string()).unwrap();
            done.insert(wid.to_string());
        }
    }
}

/// `other` submits a launch straight to `operations/submit`: it waits for the operator and has
/// no `plan.created` record yet. The agent, which reads and writes the journal, then writes
/// what `forge` makes of (setup, operation id, plan id, a valid launch spec for that plan).
/// After the operator approves, the plan and its lane workers are other's: the agent finds
/// neither.
fn forged_records_never_hand_the_agent_anothers_plan(
    forge: impl FnOnce(&Setup, &str, &str, Value) -> Vec<(&'static str, Value)>,
) {
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
    let id = format!("pl_{}", op_id.trim_start_matches("op_"));
    let dry = launch(&mut s, swarm(), profiles, json!({"dry_run": true}), "dry");
    let mut spec = dry["result"]["launch"].clone();
    spec["plan_id"] = json!(id);
    let records = forge(&s, &op_id, &id, spec);
    append_as_agent(s.env.root(), records);
    let mut mallory = s.env.agent("mallory");
    let r = mallory.request("plans/get", json!({"plan_id": id}));
    assert_eq!(r["error"]["data"]["code"], "plan_not_found", "{r:#}");
    let mut op = s.env.operator();
    common::gate::approve(&s.env, &mut op, &op_id);
    let p = wait_running(&mut op, &id, 2);
    assert_eq!(p["operation_id"], op_id.as_str(), "{p:#}");
    let r = mallory.request("plans/get", json!({"plan_id": id}));
    assert_eq!(r["error"]["data"]["code"], "plan_not_found", "{r:#}");
    let listed = mallory.call("plans/list", json!({}));
    assert!(!listed.to_string().contains(&id), "{listed:#}");
    for l in p["lanes"].as_array().unwrap() {
        let Some(wid) = l["worker_id"].as_str() else {
            continue;
        };
        let r = mallory.request("workers/transcript", json!({"worker_id": wid}));
        assert_eq!(r["error"]["data"]["code"], "worker_not_found", "{r:#}");
        let r = mallory.request(
            "workers/input",
            json!({"worker_id": wid, "input": "exfiltrate"}),
        );
        assert_eq!(r["error"]["data"]["code"], "worker_not_found", "{r:#}");
        other.call("workers/transcript", json!({"worker_id": wid}));
    }
    assert_eq!(plan(&mut other, &id)["status"], "running");
    other.call("plans/stop", json!({"plan_id": id, "reason": "done"}));
}

#[test]
fn a_forged_creation_record_never_makes_the_agent_the_owner_of_anothers_plan() {
    // A `plan.created` for the pending launch's plan naming the agent as its launcher.
    forged_records_never_hand_the_agent_anothers_plan(|_, op_id, id, spec| {
        vec![(
            "plan.created",
            json!({"plan_id": id, "operation_id": op_id, "client_id": "mallory",
                   "request": swarm(), "spec": spec}),
        )]
    });
}

#[test]
fn an_operation_id_aliasing_the_plans_never_makes_the_agent_its_owner() {
    // `X` and `op_X` would both name the plan `pl_X`: the agent copies the victim's
    // `operation.created` under the bare id `X`, as its own and already ended, and creates the
    // plan from that operation (a second reader's finding).
    forged_records_never_hand_the_agent_anothers_plan(|s, op_id, id, spec| {
        let seg = common::forge::the_segment(s.env.root());
        let i = seg.find("the victim's operation", |k, p| {
            k == "operation.created" && p["operation"]["id"] == op_id
        });
        let mut forged = seg.recs[i].payload();
        let bare = op_id.trim_start_matches("op_");
        let o = &mut forged["operation"];
        o["id"] = json!(bare);
        o["client_id"] = json!("mallory");
        o["idempotency_key"] = json!("alias");
        o["state"] = json!("failed");
        o["approval_id"] = Value::Null;
        o["terminal_at_ms"] = json!(gaffer::util::now_ms());
        forged["approval"] = Value::Null;
        vec![
            ("operation.created", forged),
            (
                "plan.created",
                json!({"plan_id": id, "operation_id": bare, "client_id": "mallory",
                       "request": swarm(), "spec": spec}),
            ),
        ]
    });
}

/// An honest builder recorded a verified operation for its expectations; the reviewer could
/// only leave notes. The agent appends evidence records that reuse those real evidence ids:
/// the builder's, now claimed for the reviewer's expectations, and the reviewer's own notes',
/// now pointing at a file it just wrote (with the file's true digest). The process that ran
/// the plan counts only evidence exactly as it was recorded through it: nothing new verifies.
#[test]
fn forged_records_reusing_real_evidence_ids_verify_nothing() {
    let mut s = setup();
    let profiles = json!({"builder": "good", "integrator": "good", "reviewer": "note"});
    let r = launch(&mut s, swarm(), profiles, json!({}), "reuse-ids");
    let id = plan_id(&r);
    let p = wait_plan(&mut s.planner, &id, &["completed", "incomplete"]);
    assert_eq!(p["status"], "incomplete", "{p:#}");
    let reviewer = lane(&p, "lane-4-reviewer").clone();
    let builder = lane(&p, "lane-1-builder").clone();
    let verified = &builder["expectations"][0]["evidence"][0];
    assert_eq!(verified["verified"], true, "{builder:#}");
    std::fs::write(s.env.root().join("proof.txt"), "looks done").unwrap();
    let sha = gaffer::util::sha256_hex(b"looks done");
    let mut recs = Vec::new();
    for (n, e) in reviewer["expectations"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let forged = |evidence_id: &Value, evidence: Value| {
            (
                "plan.evidence",
                json!({"evidence_id": evidence_id, "plan_id": id, "lane_id": "lane-4-reviewer",
                       "expectation": e["id"], "evidence": evidence,
                       "recorded_by": format!("{id}/lane-4-reviewer")}),
            )
        };
        recs.push(forged(
            &verified["evidence_id"],
            verified["evidence"].clone(),
        ));
        let note = &e["evidence"][0];
        assert_eq!(note["evidence"]["kind"], "note", "{e:#}");
        recs.push(forged(
            &note["evidence_id"],
            json!({"kind": "file", "path": "proof.txt", "sha256": sha}),
        ));
        assert!(n < 8);
    }
    let forged_count = recs.len();
    append_as_agent(s.env.root(), recs);
    let until = Instant::now() + Duration::from_secs(10);
    let p = loop {
        let p = plan(&mut s.planner, &id);
        let seen: usize = lane(&p, "lane-4-reviewer")["expectations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["evidence"].as_array().unwrap().len())
            .sum();
        let before: usize = reviewer["expectations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["evidence"].as_array().unwrap().len())
            .sum();
        if seen >= before + forged_count {
            break p;
        }
        assert!(
            Instant::now() < until,
            "the forged records never folded: {p:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(p["attested"], true, "{p:#}");
    assert_eq!(p["status"], "incomplete", "{p:#}");
    for e in lane(&p, "lane-4-reviewer")["expectations"]
        .as_array()
        .unwrap()
    {
        assert_eq!(e["status"], "claimed", "{e:#}");
        for ev in e["evidence"].as_array().unwrap() {
            assert_eq!(ev["verified"], false, "{ev:#}");
        }
    }
    // The builder's own record still verifies where it was recorded.
    assert_eq!(
        lane(&p, "lane-1-builder")["expectations"][0]["status"],
        "verified"
    );
}
