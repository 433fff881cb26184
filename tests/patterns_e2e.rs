//! End to end: the real binary, over NDJSON JSON-RPC, MCP and the CLI.

mod common;
#[path = "patterns_support.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::Path;

use common::{Server, Wire, run_cli, workspace};
use serde_json::{Value, json};

/// A workspace holding the conformance fixtures under `fixtures/` (case env paths are relative).
fn fixture_workspace() -> tempfile::TempDir {
    let ws = workspace();
    let dst = ws.path().join("fixtures");
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(support::data_dir().join("fixtures"))
        .unwrap()
        .flatten()
    {
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    ws
}

fn assert_clean_env() {
    let polluted: Vec<String> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("WORKER_PATTERNS_") || k.starts_with("HERMES_"))
        .collect();
    assert!(
        polluted.is_empty(),
        "unset {polluted:?} before running these tests"
    );
}

#[test]
fn every_conformance_case_through_patterns_select_over_ndjson() {
    assert_clean_env();
    let ws = fixture_workspace();
    let cases = support::cases();
    // One server per distinct environment; every case of that environment is sent at once.
    let mut groups: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for case in &cases {
        groups
            .entry(case["env"].to_string())
            .or_default()
            .push(case);
    }
    let mut failures = Vec::new();
    let mut checked = 0;
    for group in groups.values() {
        let env: Vec<(String, String)> = group[0]["env"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect();
        let env_refs: Vec<(&str, &str)> =
            env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut server = Server::start_env(ws.path(), Wire::Ndjson, &[], &env_refs);
        let ids: Vec<i64> = group
            .iter()
            .map(|case| server.send_request("patterns/select", case["request"].clone()))
            .collect();
        for (case, id) in group.iter().zip(ids) {
            let reply = server.response(id);
            let name = case["id"].as_str().unwrap();
            checked += 1;
            if let Some(err) = case.get("expect_error") {
                if reply["error"]["code"] != -32602
                    || reply["error"]["data"]["field"] != err["field"]
                {
                    failures.push(format!(
                        "{name}: expected -32602 on {}, got {reply}",
                        err["field"]
                    ));
                }
                continue;
            }
            let Some(result) = reply.get("result") else {
                failures.push(format!("{name}: error {reply}"));
                continue;
            };
            if result["kind"] != case["expect_kind"] {
                failures.push(format!(
                    "{name}: kind {} expected {}",
                    result["kind"], case["expect_kind"]
                ));
            }
            if let Some(expect) = case.get("expect").and_then(Value::as_object) {
                let d = support::diff(&case["expect"], &support::decision(result, expect));
                if !d.is_empty() {
                    failures.push(format!("{name}:\n{}", d.join("\n")));
                }
            }
        }
        assert_eq!(server.finish(), 0);
    }
    assert_eq!(checked, 84);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn mcp_server(ws: &Path, env: &[(&str, &str)]) -> Server {
    let mut s = Server::start_env(ws, Wire::Ndjson, &["--mcp"], env);
    let init = s.call(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "agent", "version": "1"}}),
    );
    assert!(init.get("protocolVersion").is_some());
    s.notify("notifications/initialized", json!({}));
    s
}

/// CLI arguments for a request in the reference vocabulary (the subset used below).
fn cli_args(req: &Value) -> Vec<String> {
    let mut a = vec![req["objective"].as_str().unwrap().to_owned()];
    for (key, flag) in [
        ("scopes", "--scope"),
        ("dependencies", "--dependency"),
        ("notes", "--note"),
    ] {
        for v in req[key].as_array().into_iter().flatten() {
            a.push(format!("{flag}={}", v.as_str().unwrap()));
        }
    }
    if let Some(r) = req["risk_level"].as_str() {
        a.push(format!("--risk={r}"));
    }
    if req["review_required"] == false {
        a.push("--no-review".into());
    }
    for (key, flag) in [
        ("tests_required", "--tests-required"),
        ("durable", "--durable"),
        ("persistent_workers", "--persistent-workers"),
        ("recovery", "--recovery"),
    ] {
        if req[key] == true {
            a.push(flag.into());
        }
    }
    if let Some(n) = req["variants_requested"].as_i64() {
        a.push(format!("--variant-count={n}"));
    }
    if let Some(n) = req["max_parallel_lanes"].as_i64() {
        a.push(format!("--max-parallel-lanes={n}"));
    }
    a
}

#[test]
fn mcp_tools_rpc_and_cli_give_the_same_plan() {
    assert_clean_env();
    let ws = workspace();
    let requests = [
        json!({"objective": "small docs update"}),
        json!({"objective": "Refactor auth and billing modules", "scopes": ["auth", "billing"], "tests_required": true}),
        json!({"objective": "Compare alternative dashboard designs", "variants_requested": 3, "risk_level": "critical"}),
        json!({"objective": "Migrate in ordered phases", "dependencies": ["schema", "api", "cutover"], "review_required": false}),
        json!({"objective": "Recover the stale build", "recovery": true, "persistent_workers": true, "notes": ["pattern:bridge-lane"]}),
        json!({"objective": "Bump headers", "scopes": ["a", "b", "c", "d", "e", "f"], "max_parallel_lanes": 2, "durable": true}),
    ];
    let mut mcp = mcp_server(ws.path(), &[]);
    let tools = mcp.call("tools/list", json!({}));
    let by_name = |name: &str| {
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .cloned()
    };
    for tool in ["select_worker_pattern", "render_execution_plan"] {
        let t = by_name(tool).unwrap_or_else(|| panic!("{tool} missing from {tools}"));
        assert_eq!(t["inputSchema"]["type"], "object");
        assert_eq!(t["inputSchema"]["required"], json!(["objective"]));
    }
    let mut rpc = Server::start(ws.path(), Wire::Ndjson, &[]);
    for req in &requests {
        // MCP: `output` is honoured; without it the selection tool answers the selection form.
        let mut args = req.clone();
        args["output"] = json!("task_graph");
        let graph = mcp.call(
            "tools/call",
            json!({"name": "select_worker_pattern", "arguments": args}),
        );
        assert_eq!(
            graph["structuredContent"]["kind"], "worker_pattern_task_graph_spec",
            "{graph}"
        );
        let via_mcp = mcp.call(
            "tools/call",
            json!({"name": "select_worker_pattern", "arguments": req}),
        );
        assert_eq!(via_mcp["isError"], false, "{via_mcp}");
        let mcp_result = &via_mcp["structuredContent"];
        assert_eq!(mcp_result["kind"], "worker_pattern_selection");
        let text: Value =
            serde_json::from_str(via_mcp["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(&text, mcp_result);

        let plan_tool = mcp.call(
            "tools/call",
            json!({"name": "render_execution_plan", "arguments": req}),
        );
        assert_eq!(
            plan_tool["structuredContent"]["kind"],
            "worker_pattern_execution_plan"
        );

        let mut select_req = req.clone();
        select_req["output"] = json!("select");
        let via_rpc = rpc.call("patterns/select", select_req);
        let via_rpc_default = rpc.call("patterns/select", req.clone());
        assert_eq!(via_rpc_default["kind"], "worker_pattern_execution_plan");
        assert_eq!(
            via_rpc_default["execution_plan"],
            plan_tool["structuredContent"]["execution_plan"]
        );

        let mut argv = vec!["patterns".to_owned(), "select".to_owned()];
        argv.extend(cli_args(req));
        argv.push("--json".into());
        let argv_refs: Vec<&str> = argv.iter().map(String::as_str).collect();
        let (code, stdout, stderr) = run_cli(ws.path(), &argv_refs);
        assert_eq!(code, 0, "{stderr}");
        assert!(
            !stdout.ends_with('\n'),
            "the CLI prints JSON without a trailing newline"
        );
        let via_cli: Value = serde_json::from_str(&stdout).unwrap();

        assert_eq!(mcp_result["plan"], via_rpc["plan"], "{req}");
        assert_eq!(via_rpc["plan"], via_cli, "{req}");
        assert_eq!(via_rpc["plan"], via_rpc_default["plan"]);
        assert_eq!(plan_tool["structuredContent"]["plan"], via_cli);
    }
    // Invalid tool input is a tool error the agent can read, naming the field.
    let bad = mcp.call(
        "tools/call",
        json!({"name": "select_worker_pattern", "arguments": {"objective": "  "}}),
    );
    assert_eq!(bad["isError"], true);
    assert_eq!(
        bad["structuredContent"]["error"]["data"]["field"],
        "objective"
    );
    // Roster paths from clients stay inside the workspace.
    let escape = mcp.call(
        "tools/call",
        json!({"name": "select_worker_pattern", "arguments": {"objective": "x", "roster_path": "/etc/hostname"}}),
    );
    assert_eq!(
        escape["structuredContent"]["error"]["data"]["field"],
        "roster_path"
    );
    assert_eq!(mcp.finish(), 0);
    assert_eq!(rpc.finish(), 0);
}

#[test]
fn broken_roster_only_matters_with_persistent_workers() {
    assert_clean_env();
    let ws = fixture_workspace();
    let env = [(
        "WORKER_PATTERNS_ROSTER_PATH",
        "fixtures/roster-bad-yaml.yaml",
    )];
    let mut s = Server::start_env(ws.path(), Wire::Ndjson, &[], &env);
    let ok = s.call(
        "patterns/select",
        json!({"objective": "Refactor auth and billing", "scopes": ["auth", "billing"]}),
    );
    assert_eq!(ok["plan"]["selection"]["selected_pattern"], "module-swarm");
    assert_eq!(ok["diagnostics"].as_array().map(Vec::len), Some(1));
    let err = s.request(
        "patterns/select",
        json!({"objective": "Fix it", "persistent_workers": true}),
    );
    assert_eq!(err["error"]["code"], -32602);
    assert_eq!(err["error"]["data"]["field"], "roster");
    // The server is still healthy afterwards.
    let again = s.call(
        "patterns/select",
        json!({"objective": "Fix it", "output": "select"}),
    );
    assert_eq!(again["kind"], "worker_pattern_selection");
    assert_eq!(s.finish(), 0);

    let out = std::process::Command::new(common::BIN)
        .arg("--workspace")
        .arg(ws.path())
        .args(["patterns", "select", "Fix it", "--persistent-workers"])
        .envs(env)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`roster`"));
    let out = std::process::Command::new(common::BIN)
        .arg("--workspace")
        .arg(ws.path())
        .args(["patterns", "select", "Fix it"])
        .envs(env)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("note:"));
}

#[test]
fn render_and_roster_validate_methods() {
    assert_clean_env();
    let ws = fixture_workspace();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &[]);
    let req = json!({"objective": "Refactor auth and billing", "scopes": ["auth", "billing"], "form": "summary"});
    let summary = s.call("patterns/render", req);
    assert_eq!(summary["dry_run"], true);
    let text = summary["text"].as_str().unwrap();
    assert!(
        text.starts_with("selected_pattern: module-swarm\n"),
        "{text}"
    );
    let contract = s.call("patterns/render", json!({"objective": "Fix it"}));
    assert_eq!(contract["kind"], "worker_pattern_prompt_contract");
    let bad_form = s.request(
        "patterns/render",
        json!({"objective": "Fix it", "form": "html"}),
    );
    assert_eq!(bad_form["error"]["data"]["field"], "form");

    let report = s.call(
        "roster/validate",
        json!({"path": "fixtures/roster-invalid.yaml"}),
    );
    assert_eq!(report["ok"], false);
    assert_eq!(report["worker_count"], 7);
    let good = s.call(
        "roster/validate",
        json!({"path": "fixtures/roster-basic.yaml"}),
    );
    assert_eq!(good["ok"], true);
    for escape in ["../outside.yaml", "/etc/hostname"] {
        let r = s.request("roster/validate", json!({"path": escape}));
        assert_eq!(r["error"]["data"]["field"], "path", "{escape}");
    }
    let none = s.request("roster/validate", json!({}));
    assert_eq!(none["error"]["data"]["field"], "path");
    let unknown = s.request("roster/validate", json!({"paht": "x"}));
    assert_eq!(unknown["error"]["code"], -32602);
    assert_eq!(s.finish(), 0);
}

#[test]
fn workspace_policy_override_changes_decisions_and_bad_policy_is_named() {
    assert_clean_env();
    let ws = workspace();
    std::fs::create_dir_all(ws.path().join(".gaffer")).unwrap();
    // Add "docs" to the recovery-lane keywords: it must show up among the matched signals.
    std::fs::write(
        ws.path().join(".gaffer/patterns.yaml"),
        "keywords:\n  recovery-lane: [docs]\n",
    )
    .unwrap();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &[]);
    let r = s.call(
        "patterns/select",
        json!({"objective": "small docs update", "output": "select"}),
    );
    assert_eq!(
        r["plan"]["selection"]["matched_signals"],
        json!(["docs", "small"])
    );
    std::fs::write(
        ws.path().join(".gaffer/patterns.yaml"),
        "weights:\n  sequential:\n    positive: {speed: 1}\n",
    )
    .unwrap();
    let r = s.request("patterns/select", json!({"objective": "small docs update"}));
    assert_eq!(r["error"]["data"]["code"], "patterns_policy_invalid");
    assert_eq!(
        r["error"]["data"]["key"],
        "weights.sequential.positive.speed"
    );
    assert_eq!(s.finish(), 0);
}

#[test]
fn cli_commands_mirror_the_reference() {
    assert_clean_env();
    let ws = fixture_workspace();
    let p = ws.path();
    // Deprecated names warn on stderr and print what the new names print.
    for (old, new) in [
        ("render-delegate", "render-ephemeral-workers"),
        ("render-swarm", "render-persistent-workers"),
        ("render-kanban", "render-task-graph"),
    ] {
        let (c1, new_out, new_err) = run_cli(
            p,
            &[
                "patterns",
                new,
                "Refactor",
                "--scope=a",
                "--scope=b",
                "--dry-run",
            ],
        );
        let (c2, old_out, old_err) = run_cli(
            p,
            &[
                "patterns",
                old,
                "Refactor",
                "--scope=a",
                "--scope=b",
                "--dry-run",
            ],
        );
        assert_eq!((c1, c2), (0, 0), "{new_err}{old_err}");
        assert_eq!(new_out, old_out);
        assert!(new_err.is_empty(), "{new_err}");
        assert!(old_err.contains(old) && old_err.contains(new), "{old_err}");
        let v: Value = serde_json::from_str(&new_out).unwrap();
        assert_eq!(v["dry_run"], true);
    }
    let (code, _, err) = run_cli(p, &["patterns", "render-task-graph", "Refactor"]);
    assert_eq!(code, 2);
    assert!(err.contains("--dry-run"));
    let (code, out, err) = run_cli(p, &["patterns", "select", "Fix", "--execute"]);
    assert_eq!((code, out.as_str()), (2, ""));
    assert!(err.contains("--execute"));
    let (code, _, err) = run_cli(
        p,
        &["patterns", "select", "Fix", "--max-parallel-lanes", "0"],
    );
    assert_eq!(code, 2);
    assert!(err.contains("max_parallel_lanes"));
    let (code, _, _) = run_cli(p, &["patterns", "select", "Fix", "--risk", "medium"]);
    assert_eq!(code, 2);
    let (code, text, _) = run_cli(p, &["patterns", "select", "Fix", "--text"]);
    assert_eq!(code, 0);
    assert!(text.starts_with("selected_pattern: sequential\n") && text.ends_with('\n'));
    let (code, contract, _) = run_cli(p, &["patterns", "render", "Fix", "--text"]);
    assert_eq!(code, 0);
    assert!(!contract.ends_with('\n'));
    let (_, prompts_text, _) = run_cli(p, &["patterns", "render-prompts", "Fix", "--text"]);
    assert_eq!(prompts_text, contract);
    let (code, plan, _) = run_cli(p, &["patterns", "render-execution-plan", "Fix"]);
    assert_eq!(code, 0);
    let plan: Value = serde_json::from_str(&plan).unwrap();
    assert_eq!(plan["mechanism"], "direct");
    assert_eq!(plan["commands"], json!([]));

    // validate-roster exit codes.
    let invalid = p.join("fixtures/roster-invalid.yaml");
    let (code, out, _) = run_cli(
        p,
        &[
            "patterns",
            "validate-roster",
            invalid.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(code, 1);
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["ok"], false);
    let basic = p.join("fixtures/roster-basic.yaml");
    let (code, out, _) = run_cli(p, &["patterns", "validate-roster", basic.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out.starts_with("OK "));

    // init-config prints by default, writes once, refuses to overwrite.
    let (code, printed, _) = run_cli(p, &["patterns", "init-config"]);
    assert_eq!(code, 0);
    assert!(printed.contains("workers:"));
    let target = p.join(".gaffer/roster.yaml");
    assert!(!target.exists());
    let (code, _, _) = run_cli(p, &["patterns", "init-config", "--write", "--dry-run"]);
    assert_eq!(code, 0);
    assert!(!target.exists());
    let (code, _, _) = run_cli(p, &["patterns", "init-config", "--write"]);
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), printed);
    std::fs::write(&target, "workers: []\n").unwrap();
    let (code, _, err) = run_cli(p, &["patterns", "init-config", "--write"]);
    assert_eq!(code, 1);
    assert!(err.contains("refusing"));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "workers: []\n");
    let (code, _, _) = run_cli(p, &["patterns", "init-config", "--write", "--force"]);
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), printed);

    // doctor: the written template is the workspace roster and validates.
    let (code, out, _) = run_cli(p, &["patterns", "doctor", "--json"]);
    assert_eq!(code, 0, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["ok"], true);
    for key in [
        "Package",
        "Policy files",
        "MCP entrypoint",
        "Roster",
        "Credentials",
        "Runtime launch",
        "Import path",
    ] {
        assert!(
            report["checks"].get(key).is_some(),
            "{key} missing from {report}"
        );
    }
    let (code, _, _) = run_cli(
        p,
        &["patterns", "doctor", "--roster", invalid.to_str().unwrap()],
    );
    assert_eq!(code, 1);
}

#[test]
fn wrong_types_are_invalid_params_naming_the_field_and_the_server_survives() {
    assert_clean_env();
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &[]);
    let huge_scopes: Vec<String> = (0..10_000).map(|i| format!("s{i}")).collect();
    for (params, field) in [
        (
            json!({"objective": "x", "max_parallel_lanes": [1]}),
            "max_parallel_lanes",
        ),
        (
            json!({"objective": "x", "max_parallel_lanes": 1e300}),
            "max_parallel_lanes",
        ),
        (json!({"objective": "x", "scopes": 7}), "scopes"),
        (
            json!({"objective": "x", "variant_count": "2.5"}),
            "variant_count",
        ),
        (json!({"objective": "x", "output": {"a": 1}}), "output"),
        (
            json!({"objective": "x", "roster_path": "../../etc/passwd"}),
            "roster_path",
        ),
        (json!({"objective": ["   "]}), ""),
    ] {
        let r = s.request("patterns/select", params.clone());
        if field.is_empty() {
            // `["   "]` is a non-blank string after Python's str(): accepted, like the reference.
            assert!(r.get("result").is_some(), "{params}: {r}");
        } else {
            assert_eq!(r["error"]["code"], -32602, "{params}: {r}");
            assert_eq!(r["error"]["data"]["field"], field, "{params}: {r}");
        }
    }
    let big = s.call(
        "patterns/select",
        json!({"objective": "x", "scopes": huge_scopes, "output": "select"}),
    );
    assert_eq!(
        big["plan"]["module_swarm_scale"]["requested_lane_count"],
        10_000
    );
    assert_eq!(s.finish(), 0);
}
