//! `plans/launch` on the real binary: every mechanism end to end with scripted lane workers
//! (tests/scripts/lane_worker.py) that read their prompt and call back over their lane
//! connection; task-graph order and blocking; fail-closed refusals; lane identity and scope;
//! completion only with verified evidence (forged records included); kill -9 mid-plan.

mod common;

use std::time::{Duration, Instant};

use common::Server;
use common::gate::{append_as_agent, workspace_id};
use common::plans::*;
use serde_json::{Value, json};

fn run_to_completion(
    s: &mut Setup,
    request: Value,
    profiles: Value,
    mechanism: Option<&str>,
) -> Value {
    let extra = match mechanism {
        Some(m) => json!({"mechanism": m}),
        None => json!({}),
    };
    let key = format!(
        "run-{}-{}",
        mechanism.unwrap_or("primary"),
        &gaffer::util::sha256_hex(request.to_string().as_bytes())[..12]
    );
    let r = launch(s, request, profiles, extra, &key);
    let id = r["result"]["plan"]["plan_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{r:#}"))
        .to_string();
    assert_eq!(r["result"]["verdict"]["effect"], "allow", "{r:#}");
    let p = wait_plan(&mut s.planner, &id, &["completed", "incomplete", "stopped"]);
    if p["status"] != "completed" {
        let said: Vec<String> = p["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| transcript(&mut s.planner, &l["worker_id"]))
            .collect();
        panic!("not completed: {p:#}\n{said:#?}\n{}", s.env.logs());
    }
    for l in p["lanes"].as_array().unwrap() {
        assert_eq!(l["status"], "done", "{l:#}");
        for e in l["expectations"].as_array().unwrap() {
            assert_eq!(e["status"], "verified", "{e:#}");
        }
        // Every lane read its prompt and spoke as itself.
        let w = l["worker_id"].clone();
        let said = transcript(&mut s.planner, &w);
        assert!(said.contains("prompt "), "{said}");
        assert!(
            said.contains(&format!(
                "\"client\": \"{}\"",
                l["client_id"].as_str().unwrap()
            )),
            "{said}"
        );
    }
    p
}

#[test]
fn every_mechanism_runs_its_lanes_to_a_verified_completion() {
    let mut s = setup();
    let all = json!({"builder": "good", "integrator": "good", "reviewer": "good", "phase-worker": "good"});
    // ephemeral_workers (module-swarm's primary): four lanes, at most two at once.
    let p = run_to_completion(&mut s, swarm(), all.clone(), None);
    assert_eq!(p["mechanism"], "ephemeral_workers");
    assert_eq!(p["max_parallel"], 2);
    assert_eq!(p["pattern"], "module-swarm");
    assert_eq!(
        p["overlays"],
        json!(["twin-inspection"]),
        "the reviewer overlay stays"
    );
    assert_eq!(p["lanes"].as_array().unwrap().len(), 4);
    // task_graph (phased-assembly's primary).
    let p = run_to_completion(&mut s, phased(), all.clone(), None);
    assert_eq!(p["mechanism"], "task_graph");
    assert_eq!(
        lane(&p, "lane-2-phase-worker")["depends_on"],
        json!(["lane-1-phase-worker"])
    );
    // direct (sequential's primary): one lane worker carrying the whole contract.
    let p = run_to_completion(
        &mut s,
        json!({"objective": "Fix the typo in the README"}),
        all.clone(),
        None,
    );
    assert_eq!(p["mechanism"], "direct");
    assert_eq!(p["lanes"].as_array().unwrap().len(), 1);
    // continuation (a fallback sequential lists): each step gets the previous one's outcome.
    let p = run_to_completion(
        &mut s,
        json!({"objective": "Fix the typo in the README"}),
        all.clone(),
        Some("continuation"),
    );
    let second = lane(&p, "lane-2-reviewer")["worker_id"].clone();
    let said = transcript(&mut s.planner, &second);
    assert!(
        said.contains("Previous step (lane-1-builder) outcome"),
        "{said}"
    );
    assert!(said.contains("lane finished"), "{said}");
    // persistent_workers: the roster's named profiles, no mapping given.
    let p = run_to_completion(
        &mut s,
        json!({"objective": "Refactor the auth module", "persistent_workers": true}),
        json!({}),
        None,
    );
    assert_eq!(p["mechanism"], "persistent_workers");
    assert!(
        p["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["profile"] == "worker-code-fast")
    );
}

#[test]
fn a_task_starts_after_its_dependency_succeeded_and_a_failed_one_blocks_its_dependents() {
    let mut s = setup();
    let good = json!({"phase-worker": "good", "reviewer": "good"});
    let p = run_to_completion(&mut s, phased(), good, None);
    // Order: each phase's worker was created only after the previous phase's worker ended.
    let mut last_end = 0;
    for id in [
        "lane-1-phase-worker",
        "lane-2-phase-worker",
        "lane-3-phase-worker",
        "lane-4-reviewer",
    ] {
        let w = s.planner.call(
            "workers/get",
            json!({"worker_id": lane(&p, id)["worker_id"]}),
        )["worker"]
            .clone();
        let created = w["created_seq"].as_u64().unwrap();
        assert!(
            created > last_end,
            "{id} started before its dependency ended: {w:#}"
        );
        last_end = w["last_seq"].as_u64().unwrap();
    }
    let fail = json!({"phase-worker": "fail", "reviewer": "good"});
    let r = launch(&mut s, phased(), fail, json!({}), "failing");
    let id = r["result"]["plan"]["plan_id"].as_str().unwrap().to_string();
    let p = wait_plan(&mut s.planner, &id, &["completed", "incomplete"]);
    assert_eq!(p["status"], "incomplete", "{p:#}");
    assert_eq!(lane(&p, "lane-1-phase-worker")["status"], "failed");
    for id in [
        "lane-2-phase-worker",
        "lane-3-phase-worker",
        "lane-4-reviewer",
    ] {
        let l = lane(&p, id);
        assert_eq!(l["status"], "blocked", "{l:#}");
        assert!(
            l.get("worker_id").is_none(),
            "a blocked lane never starts: {l:#}"
        );
        assert!(
            l["detail"].as_str().unwrap().contains("did not succeed"),
            "{l:#}"
        );
    }
    let missing = p["missing"].to_string();
    assert!(
        missing.contains("lane-2-phase-worker: blocked"),
        "{missing}"
    );
}

#[test]
fn a_shape_gaffer_cannot_honour_is_refused_and_nothing_is_written() {
    let mut s = setup();
    let before = common::journal_bytes(s.env.root()).len();
    let all = json!({"builder": "good", "integrator": "good", "reviewer": "good"});
    let cases = [
        (
            json!({"mechanism": "kubernetes"}),
            all.clone(),
            "mechanism_unsupported",
            "mechanism",
        ),
        (
            json!({"mechanism": "task_graph"}),
            all.clone(),
            "mechanism_not_listed",
            "mechanism",
        ),
        (
            json!({}),
            json!({"builder": "good", "integrator": "good"}),
            "lane_unmapped",
            "lane_profiles.reviewer",
        ),
        (
            json!({}),
            json!({"builder": "good", "integrator": "good", "reviewer": "nope"}),
            "lane_unmapped",
            "lane_profiles.reviewer",
        ),
    ];
    for (extra, profiles, code, field) in cases {
        let r = launch(&mut s, swarm(), profiles, extra.clone(), "refused");
        assert_eq!(r["error"]["data"]["code"], code, "{extra} {r:#}");
        assert_eq!(r["error"]["data"]["field"], field, "{r:#}");
    }
    let r = s.planner.request(
        "plans/launch",
        json!({"config_bundle": s.bundle, "idempotency_key": "k"}),
    );
    assert_eq!(r["error"]["data"]["field"], "request", "{r:#}");
    assert_eq!(
        common::journal_bytes(s.env.root()).len(),
        before,
        "a refusal writes nothing"
    );
    assert_eq!(s.planner.call("plans/list", json!({}))["plans"], json!([]));
    assert_eq!(
        s.planner.call("workers/list", json!({}))["workers"],
        json!([])
    );
}

#[test]
fn a_dry_run_shows_lanes_workers_and_verdict_and_starts_nothing() {
    let mut s = setup();
    let all = json!({"builder": "good", "integrator": "good", "reviewer": "good"});
    let before = common::journal_bytes(s.env.root()).len();
    let r = launch(&mut s, swarm(), all, json!({"dry_run": true}), "dry");
    let res = &r["result"];
    assert_eq!(res["dry_run"], true, "{r:#}");
    assert_eq!(res["verdict"]["effect"], "allow");
    assert_eq!(res["verdict"]["rule_ids"], json!(["planner-launches"]));
    let lanes = res["launch"]["lanes"].as_array().unwrap();
    assert_eq!(lanes.len(), 4);
    assert_eq!(
        lanes[0]["argv"],
        json!(["python3", "lanes/lane_worker.py", "good"])
    );
    assert!(
        lanes[0]["prompt"]
            .as_str()
            .unwrap()
            .contains("Role: builder lane")
    );
    assert_eq!(common::journal_bytes(s.env.root()).len(), before);
}

#[test]
fn a_lane_is_its_connection_and_its_scope_bounds_what_it_may_write() {
    let mut s = setup();
    let token = s.env.token("planner");
    let profiles = json!({"builder": "write", "integrator": "spoof", "reviewer": "note"});
    let r = launch(&mut s, swarm(), profiles, json!({}), "identity");
    let id = r["result"]["plan"]["plan_id"].as_str().unwrap().to_string();
    let p = wait_plan(&mut s.planner, &id, &["completed", "incomplete"]);
    // The router builder wrote inside its scope; its write outside was refused by the rule.
    assert_eq!(
        std::fs::read_to_string(s.env.root().join("router/ok.txt")).unwrap(),
        "from the lane\n"
    );
    assert!(!s.env.root().join("elsewhere/bad.txt").exists());
    let said = transcript(&mut s.planner, &lane(&p, "lane-1-builder")["worker_id"]);
    let out = said
        .lines()
        .find(|l| l.contains("lane-1-builder-out"))
        .unwrap_or_else(|| panic!("{said}"));
    assert!(out.contains("\"state\": \"denied\""), "{out}");
    // The integrator lane presented a client token, named another lane and asked to log in
    // as the operator: it stayed itself, was refused, and never became the operator.
    let said = transcript(&mut s.planner, &lane(&p, "lane-3-integrator")["worker_id"]);
    let me = format!("\"client\": \"{id}/lane-3-integrator\"");
    assert!(said.matches(&me).count() >= 2, "{said}");
    assert!(said.contains("not_this_lane"), "{said}");
    assert!(said.contains("lane_not_operator"), "{said}");
    // A connection with the planner's own credential cannot record for a lane either.
    let mut other = s.env.agent("planner");
    let r = other.request(
        "plans/evidence",
        json!({"plan_id": id, "lane_id": "lane-1-builder", "expectation": "e1", "kind": "note", "text": "x"}),
    );
    assert_eq!(r["error"]["data"]["code"], "not_this_lane", "{r:#} {token}");
}

#[test]
fn only_verified_evidence_completes_a_plan_and_forged_records_do_not_verify() {
    let mut s = setup();
    let profiles = json!({"builder": "good", "integrator": "good", "reviewer": "note"});
    let r = launch(&mut s, swarm(), profiles, json!({}), "notes");
    let id = r["result"]["plan"]["plan_id"].as_str().unwrap().to_string();
    let p = wait_plan(&mut s.planner, &id, &["completed", "incomplete"]);
    assert_eq!(p["status"], "incomplete", "{p:#}");
    let reviewer = lane(&p, "lane-4-reviewer");
    assert_eq!(reviewer["status"], "ended", "{reviewer:#}");
    assert!(
        reviewer["expectations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["status"] == "claimed")
    );
    // The agent appends evidence records of its own, with valid framing: another lane's
    // succeeded operation, an operation that does not exist, a file with a made-up digest.
    let builder_op = {
        let b = lane(&p, "lane-1-builder");
        b["expectations"][0]["evidence"][0]["evidence"]["operation_id"].clone()
    };
    std::fs::write(s.env.root().join("claimed.txt"), "real bytes").unwrap();
    let forged = |n: u32, evidence: Value| {
        (
            "plan.evidence",
            json!({"evidence_id": format!("ev_forged{n}"), "plan_id": id, "lane_id": "lane-4-reviewer",
                   "expectation": "e1", "evidence": evidence, "recorded_by": format!("{id}/lane-4-reviewer"),
                   "verified": true}),
        )
    };
    append_as_agent(
        s.env.root(),
        vec![
            forged(1, json!({"kind": "operation", "operation_id": builder_op})),
            forged(
                2,
                json!({"kind": "operation", "operation_id": "op_doesnotexist"}),
            ),
            forged(
                3,
                json!({"kind": "file", "path": "claimed.txt", "sha256": "00".repeat(32)}),
            ),
        ],
    );
    let until = Instant::now() + Duration::from_secs(10);
    let p = loop {
        let p = plan(&mut s.planner, &id);
        let n = lane(&p, "lane-4-reviewer")["expectations"][0]["evidence"]
            .as_array()
            .unwrap()
            .len();
        if n >= 4 || Instant::now() > until {
            break p;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let e1 = &lane(&p, "lane-4-reviewer")["expectations"][0];
    assert_eq!(e1["evidence"].as_array().unwrap().len(), 4, "{e1:#}");
    assert_eq!(e1["status"], "claimed", "{e1:#}");
    assert!(
        e1["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["verified"] == false),
        "{e1:#}"
    );
    assert_eq!(p["status"], "incomplete");
    // The operator waives the reviewer's expectations with signed decisions: now complete.
    let mut op = s.env.operator();
    let ws_id = workspace_id(s.env.root());
    let n = lane(&p, "lane-4-reviewer")["expectations"]
        .as_array()
        .unwrap()
        .len();
    for i in 1..=n {
        let status = op.call("gaffer/status", json!({}));
        let head = status["store"]["chain"]["head"].clone();
        let text = lane(&p, "lane-4-reviewer")["expectations"][i - 1]["text"]
            .as_str()
            .unwrap()
            .to_string();
        let payload = json!({"domain": "gaffer/plan-waive/v1", "workspace_id": ws_id, "plan_id": id,
            "lane_id": "lane-4-reviewer", "expectation": format!("e{i}"), "reason": "reviewed by hand",
            "expectation_sha256": gaffer::util::sha256_hex(text.as_bytes()),
            "waived_at_ms": 1, "head": head});
        let text = gaffer::jcs::canonicalize(&payload);
        let text = String::from_utf8(text).unwrap();
        let sig = s.env.signer().sign(text.as_bytes());
        let r = op.request("plans/waive", json!({"payload": text, "signature": sig}));
        assert!(r.get("result").is_some(), "{r:#}");
    }
    // The process that ran the plan vouches for its lanes' evidence; the waivers do the rest.
    let p = plan(&mut s.planner, &id);
    assert_eq!(p["attested"], true, "{p:#}");
    assert_eq!(p["status"], "completed", "{p:#}");
    assert_eq!(
        lane(&p, "lane-4-reviewer")["expectations"][0]["status"],
        "waived"
    );
}

#[test]
fn kill_9_mid_plan_leaves_a_truthful_stopped_plan_and_nothing_respawns() {
    let mut s = setup();
    let profiles = json!({"builder": "sleep", "integrator": "sleep", "reviewer": "sleep"});
    let r = launch(&mut s, swarm(), profiles, json!({}), "crash");
    let id = r["result"]["plan"]["plan_id"].as_str().unwrap().to_string();
    let until = Instant::now() + Duration::from_secs(30);
    let running = loop {
        let p = plan(&mut s.planner, &id);
        let n = p["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["status"] == "running")
            .count();
        if n == 2 {
            break p;
        }
        assert!(Instant::now() < until, "{p:#}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(running["status"], "running");
    s.planner.child.kill().unwrap();
    let _ = s.planner.child.wait();
    let mut after = s.env.agent("planner");
    let p = wait_plan(&mut after, &id, &["stopped"]);
    for l in p["lanes"].as_array().unwrap() {
        assert_eq!(l["status"], "stopped", "{l:#}");
    }
    let workers = |s: &mut Server| {
        s.call("workers/list", json!({}))["workers"]
            .as_array()
            .unwrap()
            .len()
    };
    let n = workers(&mut after);
    assert_eq!(n, 2, "only the two lanes that ran have workers");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(workers(&mut after), n, "nothing relaunched");
    let ws = after.call("workers/list", json!({}));
    assert!(
        ws["workers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["status"] == "stopped"),
        "{ws:#}"
    );
}

#[test]
fn under_a_request_rule_the_operator_approves_the_launch_once_for_all_its_lanes() {
    // A request rule for this client: the launch waits; one signed approval covers every lane.
    let s = setup();
    let mut other = s.env.agent("other");
    other.call("bundles/sync", json!({"bundle": bundle()}));
    let p = json!({"request": swarm(), "config_bundle": s.bundle, "idempotency_key": "needs-human",
                   "lane_profiles": {"builder": "good", "integrator": "good", "reviewer": "good"}});
    let r = other.call("plans/launch", p);
    assert_eq!(r["verdict"]["effect"], "approval", "{r:#}");
    let plan_id = r["plan"]["plan_id"].as_str().unwrap().to_string();
    let op_id = r["plan"]["operation_id"].clone();
    assert_eq!(r["plan"]["status"], "pending_approval", "{r:#}");
    let mut op = s.env.operator();
    let approval = op.call("operations/get", json!({"id": op_id}))["approval_id"].clone();
    // The operator sees each lane's argv in what they approve.
    let detail = op.call("approvals/get", json!({"id": approval}));
    assert!(
        detail.to_string().contains("lanes/lane_worker.py"),
        "{detail:#}"
    );
    s.env.decide_ok(
        &mut op,
        json!({"id": approval, "decision": "approve", "expected_revision": detail["revision"]}),
    );
    // Whichever serving process executed the approved launch runs the lanes and vouches for
    // them; the other sees the same journal and says nobody here observed the run.
    wait_plan(
        &mut other,
        &plan_id,
        &["completed", "unattested", "incomplete"],
    );
    let seen = [plan(&mut other, &plan_id), plan(&mut op, &plan_id)];
    let ran = seen
        .iter()
        .find(|p| p["attested"] == true)
        .expect("one process ran it");
    assert_eq!(ran["status"], "completed", "{ran:#}");
    let watched = seen
        .iter()
        .find(|p| p["attested"] == false)
        .expect("one only watched");
    assert_eq!(watched["status"], "unattested", "{watched:#}");
    let approvals = op.call("approvals/list", json!({"all": true}));
    assert_eq!(
        approvals["approvals"].as_array().unwrap().len(),
        1,
        "one approval for 4 lanes"
    );
}

#[test]
fn mcp_hosts_launch_read_and_record_through_the_tools() {
    let s = setup();
    let token = s.env.token("planner");
    let mut mcp = s.env.start(&[("GAFFER_CLIENT_TOKEN", &token)]);
    mcp.call(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "host", "version": "1"}}),
    );
    mcp.notify("notifications/initialized", json!({}));
    let tools = mcp.call("tools/list", json!({}));
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for t in ["launch_plan", "get_plan", "record_evidence"] {
        assert!(names.contains(&t), "{names:?}");
    }
    let r = mcp.call(
        "tools/call",
        json!({"name": "launch_plan", "arguments": {"request": swarm(), "config_bundle": s.bundle,
               "lane_profiles": {"builder": "good", "integrator": "good", "reviewer": "good"}, "idempotency_key": "mcp"}}),
    );
    assert_ne!(r["isError"], true, "{r:#}");
    let id = r["structuredContent"]["plan"]["plan_id"]
        .as_str()
        .unwrap()
        .to_string();
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let g = mcp.call(
            "tools/call",
            json!({"name": "get_plan", "arguments": {"plan_id": id}}),
        );
        if g["structuredContent"]["plan"]["status"] == "completed" {
            break;
        }
        assert!(Instant::now() < until, "{g:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The host is not a lane: it cannot record a lane's evidence.
    let r = mcp.call(
        "tools/call",
        json!({"name": "record_evidence", "arguments": {"plan_id": id, "lane_id": "lane-1-builder",
               "expectation": "e1", "kind": "note", "text": "x"}}),
    );
    assert_eq!(r["isError"], true, "{r:#}");
}

#[test]
fn the_cli_runs_an_allowed_launch_to_its_end_and_waives_with_the_operator_key() {
    let s = setup();
    let token = s.env.token("planner");
    let digest = s.bundle["digest"].as_str().unwrap().to_string();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(common::BIN)
            .arg("--workspace")
            .arg(s.env.root())
            .args(args)
            .env("GAFFER_OPERATOR_KEY_FILE", &s.env.env()[0].1)
            .env("GAFFER_CLIENT_TOKEN", &token)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = cli(&[
        "plan",
        "launch",
        "--objective",
        SWARM,
        "--scope",
        "router",
        "--scope",
        "billing",
        "--tests",
        "--bundle",
        "lanes",
        "--digest",
        &digest,
        "--lane",
        "builder=good",
        "--lane",
        "integrator=good",
        "--lane",
        "reviewer=note",
        "--key",
        "cli",
    ]);
    // The reviewer only left notes: the plan ends incomplete (exit 1) with the reason shown.
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("\"incomplete\""), "{out}");
    let id = out
        .split("\"plan_id\": \"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap()
        .to_string();
    for i in 1..=8 {
        let (code, out, err) = cli(&[
            "plan",
            "waive",
            &id,
            "lane-4-reviewer",
            &format!("e{i}"),
            "--reason",
            "checked",
        ]);
        assert_eq!(code, 0, "{out}\n{err}");
    }
    // The process that ran the plan is gone: another one sees every lane done in the
    // journal, but nobody who observed the run vouches for it, so it says so.
    let (code, out, _) = cli(&["plan", "show", &id]);
    assert_eq!(code, 0);
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["plan"]["status"], "unattested", "{shown:#}");
    assert_eq!(shown["plan"]["attested"], false);
    assert!(
        shown["plan"]["missing"].as_array().unwrap().is_empty(),
        "{shown:#}"
    );
    let (code, out, _) = cli(&["plan", "list"]);
    assert_eq!(code, 0);
    assert!(out.contains(&id));
}

#[test]
fn a_waiver_signed_with_any_other_key_waives_nothing() {
    let mut s = setup();
    let profiles = json!({"builder": "good", "integrator": "good", "reviewer": "note"});
    let r = launch(&mut s, swarm(), profiles, json!({}), "forged-waiver");
    let id = r["result"]["plan"]["plan_id"].as_str().unwrap().to_string();
    wait_plan(&mut s.planner, &id, &["incomplete"]);
    let ws_id = workspace_id(s.env.root());
    let head = s.planner.call("gaffer/status", json!({}))["store"]["chain"]["head"].clone();
    let p = plan(&mut s.planner, &id);
    let e1 = lane(&p, "lane-4-reviewer")["expectations"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let payload = json!({"domain": "gaffer/plan-waive/v1", "workspace_id": ws_id, "plan_id": id,
        "lane_id": "lane-4-reviewer", "expectation": "e1", "reason": "trust me", "waived_at_ms": 1,
        "expectation_sha256": gaffer::util::sha256_hex(e1.as_bytes()), "head": head});
    let text = String::from_utf8(gaffer::jcs::canonicalize(&payload)).unwrap();
    let forged = common::gate::agent_signer(&s.env).sign(text.as_bytes());
    let r = s
        .planner
        .request("plans/waive", json!({"payload": text, "signature": forged}));
    assert_eq!(r["error"]["data"]["code"], "waiver_invalid", "{r:#}");
    // Written straight into the journal, it is folded but never counted.
    append_as_agent(
        s.env.root(),
        vec![(
            "plan.waived",
            json!({"plan_id": id, "operator_signature": {"head": head, "payload": text, "signature": forged}}),
        )],
    );
    std::thread::sleep(Duration::from_millis(300));
    let p = plan(&mut s.planner, &id);
    assert_eq!(p["status"], "incomplete", "{p:#}");
    assert_eq!(
        lane(&p, "lane-4-reviewer")["expectations"][0]["status"],
        "claimed"
    );
}
