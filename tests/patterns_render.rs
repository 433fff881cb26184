//! The JSON contract of every `output` value and the text forms.

use gaffer::patterns::runtime::Mechanism;
use gaffer::patterns::{OutputKind, SelectContext, TextForm, render_text, select};
use serde_json::{Value, json};

const MECHANISMS: [&str; 5] = [
    "direct",
    "continuation",
    "ephemeral_workers",
    "persistent_workers",
    "task_graph",
];

fn run(req: Value) -> Value {
    select(&req, &SelectContext::isolated()).unwrap()
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    k.sort_unstable();
    k
}

#[test]
fn every_output_value_has_its_wrapper_keys_and_kind() {
    let base = json!({"objective": "Refactor auth and billing", "scopes": ["auth", "billing"]});
    let expected: [(&str, &str, &[&str]); 9] = [
        (
            "select",
            "worker_pattern_selection",
            &["dry_run", "kind", "plan"],
        ),
        (
            "execution_plan",
            "worker_pattern_execution_plan",
            &["dry_run", "execution_plan", "kind", "plan"],
        ),
        (
            "prompt_bundle",
            "worker_pattern_prompt_bundle",
            &["dry_run", "kind", "prompt_bundle"],
        ),
        (
            "ephemeral_workers",
            "worker_pattern_ephemeral_worker_spec",
            &["dry_run", "ephemeral_workers", "kind"],
        ),
        (
            "delegate",
            "worker_pattern_ephemeral_worker_spec",
            &["delegate", "dry_run", "ephemeral_workers", "kind"],
        ),
        (
            "persistent_workers",
            "worker_pattern_persistent_worker_spec",
            &["dry_run", "kind", "persistent_workers"],
        ),
        (
            "swarm",
            "worker_pattern_persistent_worker_spec",
            &["dry_run", "kind", "persistent_workers", "swarm"],
        ),
        (
            "task_graph",
            "worker_pattern_task_graph_spec",
            &["dry_run", "kind", "task_graph"],
        ),
        (
            "kanban",
            "worker_pattern_task_graph_spec",
            &["dry_run", "kanban", "kind", "task_graph"],
        ),
    ];
    for (output, kind, wrapper_keys) in expected {
        let mut req = base.clone();
        req["output"] = json!(output);
        let out = run(req);
        assert_eq!(out["kind"], kind, "{output}");
        assert_eq!(out["dry_run"], true, "{output}");
        assert_eq!(keys(&out), wrapper_keys, "{output}");
        assert_eq!(OutputKind::parse(output).map(|o| o.kind()), Some(kind));
    }
    let d = run(json!({"objective": "x", "output": "delegate"}));
    assert_eq!(d["delegate"], d["ephemeral_workers"]);
    let s = run(json!({"objective": "x", "output": "swarm"}));
    assert_eq!(s["swarm"], s["persistent_workers"]);
    let k = run(json!({"objective": "x", "output": "kanban"}));
    assert_eq!(k["kanban"], k["task_graph"]);
}

#[test]
fn spec_objects_have_the_reference_fields() {
    let req = json!({"objective": "Refactor auth and billing", "scopes": ["auth", "billing"]});
    let with = |output: &str| {
        let mut r = req.clone();
        r["output"] = json!(output);
        run(r)
    };
    let e = &with("ephemeral_workers")["ephemeral_workers"];
    assert_eq!(
        keys(e),
        [
            "dry_run",
            "mechanism",
            "safety_notes",
            "selected_pattern",
            "tasks",
            "workers"
        ]
    );
    assert_eq!(e["mechanism"], "ephemeral_workers");
    assert_eq!(e["workers"], e["tasks"]);
    assert_eq!(
        keys(&e["workers"][0]),
        [
            "context",
            "fallback_profiles",
            "goal",
            "role",
            "selected_profile",
            "toolsets"
        ]
    );

    let p = &with("persistent_workers")["persistent_workers"];
    assert_eq!(
        keys(p),
        [
            "dry_run",
            "mechanism",
            "safety_notes",
            "selected_pattern",
            "workers"
        ]
    );
    let w = &p["workers"][0];
    assert_eq!(
        keys(w),
        [
            "adapter_command",
            "adapter_hint",
            "fallback_profiles",
            "profile",
            "prompt",
            "role",
            "toolsets",
            "worker_profile"
        ]
    );
    assert_eq!(w["adapter_command"], Value::Null);
    assert_eq!(w["profile"], w["worker_profile"]);

    let b = &with("prompt_bundle")["prompt_bundle"];
    assert_eq!(
        keys(b),
        [
            "fallback_mechanisms",
            "invocation_hint",
            "lanes",
            "overlays_summary",
            "primary_mechanism",
            "proof_expectations",
            "safety_notes",
            "selected_pattern",
            "task_objective"
        ]
    );
    assert_eq!(
        keys(&b["lanes"][0]),
        [
            "allowed_edits",
            "expected_output",
            "fallback_profiles",
            "model_policy",
            "prompt",
            "proof_expectations",
            "purpose",
            "role",
            "scope",
            "scope_summary",
            "selected_profile",
            "toolsets"
        ]
    );
    assert_eq!(b["overlays_summary"], "twin-inspection");

    let g = &with("task_graph")["task_graph"];
    assert_eq!(
        keys(&g["tasks"][0]),
        [
            "depends_on",
            "dry_run",
            "id",
            "prompt",
            "role",
            "scope",
            "selected_profile",
            "title"
        ]
    );
    assert_eq!(g["tasks"][0]["title"], "builder: auth");
    let plan_notes = with("select")["plan"]["safety_notes"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(g["safety_notes"].as_array().unwrap().len(), plan_notes + 1);
}

#[test]
fn plan_has_the_reference_keys() {
    let out = run(json!({"objective": "small docs update", "output": "select"}));
    let plan = &out["plan"];
    assert_eq!(
        keys(plan),
        [
            "lanes",
            "module_swarm_scale",
            "profile_mapping",
            "proof_expectations",
            "request",
            "role_rules",
            "runtime_mapping",
            "safety_notes",
            "selection"
        ]
    );
    assert_eq!(
        keys(&plan["request"]),
        [
            "dependencies",
            "durable",
            "max_parallel_lanes",
            "notes",
            "objective",
            "persistent_workers",
            "recovery",
            "review_required",
            "risk_level",
            "scopes",
            "tests_required",
            "variants_requested"
        ]
    );
    assert_eq!(
        keys(&plan["selection"]),
        [
            "dimensions",
            "invalid_override_reason",
            "matched_signals",
            "overlays",
            "override",
            "override_reason",
            "override_requested_by",
            "reason",
            "score_adjustments",
            "scores",
            "selected_pattern",
            "selection_source",
            "selector_version"
        ]
    );
    assert_eq!(
        plan["selection"]["selector_version"],
        "2026-05-03-policy-port"
    );
    assert_eq!(
        keys(&plan["runtime_mapping"]),
        [
            "fallback_mechanisms",
            "invocation_hint",
            "primary_mechanism",
            "prompt_contract"
        ]
    );
    assert_eq!(plan["role_rules"].as_object().unwrap().len(), 6);
    assert_eq!(
        plan["profile_mapping"]["review-worker"],
        "worker-review-premium"
    );
    assert_eq!(
        plan["role_rules"]["code-worker"]["model_policy"]["disable_reasoning"],
        true
    );
    assert_eq!(
        keys(&plan["lanes"][0]),
        [
            "count",
            "fallback_profiles",
            "model_policy",
            "purpose",
            "role",
            "runtime_hint",
            "scope",
            "selected_profile",
            "toolsets"
        ]
    );
}

#[test]
fn execution_plan_fills_only_the_list_of_its_mechanism() {
    let seq = run(json!({"objective": "small docs update"}));
    let ep = &seq["execution_plan"];
    assert_eq!(ep["mechanism"], "direct");
    for list in [
        "commands",
        "ephemeral_worker_tasks",
        "worker_specs",
        "task_graph_tasks",
        "delegate_tasks",
        "kanban_tasks",
    ] {
        assert_eq!(ep[list], json!([]), "{list}");
    }
    assert_eq!(ep["safety_notes"].as_array().unwrap().len(), 3);
    assert!(ep["lanes"][0].get("model_policy").is_none());

    let swarm =
        run(json!({"objective": "Refactor auth and billing", "scopes": ["auth", "billing"]}));
    let ep = &swarm["execution_plan"];
    assert_eq!(ep["ephemeral_worker_tasks"].as_array().unwrap().len(), 4);
    assert_eq!(ep["delegate_tasks"], ep["ephemeral_worker_tasks"]);
    assert_eq!(ep["safety_notes"].as_array().unwrap().len(), 1 + 2 + 2);

    let per_wave = run(json!({"objective": "Refactor", "scopes": ["a", "b", "c", "d", "e", "f"]}));
    assert_eq!(
        per_wave["plan"]["module_swarm_scale"]["integrator_per_wave"],
        true
    );
    assert_eq!(
        per_wave["execution_plan"]["safety_notes"]
            .as_array()
            .unwrap()
            .len(),
        1 + 2 + 3
    );

    let durable =
        run(json!({"objective": "Refactor", "durable": true, "persistent_workers": true}));
    let ep = &durable["execution_plan"];
    assert_eq!(ep["mechanism"], "task_graph");
    assert_eq!(ep["kanban_tasks"], ep["task_graph_tasks"]);
    assert_eq!(ep["worker_specs"], json!([]));

    let persistent = run(json!({"objective": "Fix", "persistent_workers": true}));
    assert_eq!(
        persistent["execution_plan"]["worker_specs"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn task_graph_dependencies() {
    let bf = run(
        json!({"objective": "Compare layouts", "variants_requested": 2, "output": "task_graph"}),
    );
    let deps: Vec<(String, Value)> = bf["task_graph"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["id"].as_str().unwrap().to_owned(),
                t["depends_on"].clone(),
            )
        })
        .collect();
    assert_eq!(
        deps,
        vec![
            ("lane-1-variant-designer".to_owned(), json!([])),
            ("lane-2-variant-designer".to_owned(), json!([])),
            // The curator does not wait for the designers (reference behaviour).
            ("lane-3-curator".to_owned(), json!([])),
            (
                "lane-4-reviewer".to_owned(),
                json!([
                    "lane-1-variant-designer",
                    "lane-2-variant-designer",
                    "lane-3-curator"
                ])
            ),
        ]
    );
}

#[test]
fn deprecated_mechanisms_parse_but_are_never_emitted() {
    for (old, new) in [
        ("goal", "continuation"),
        ("delegate_task", "ephemeral_workers"),
        ("swarm_profiles", "persistent_workers"),
        ("kanban", "task_graph"),
    ] {
        assert_eq!(Mechanism::parse(old).map(Mechanism::as_str), Some(new));
    }
    for req in [
        json!({"objective": "Fix", "persistent_workers": true, "output": "delegate"}),
        json!({"objective": "Refactor", "scopes": ["a", "b"], "output": "swarm"}),
        json!({"objective": "Migrate", "dependencies": ["a", "b", "c"], "output": "kanban"}),
        json!({"objective": "Migrate", "dependencies": ["a", "b", "c"]}),
        json!({"objective": "Migrate", "dependencies": ["a", "b"], "review_required": false}),
    ] {
        let out = run(req);
        let mut stack = vec![(String::new(), &out)];
        while let Some((key, v)) = stack.pop() {
            match v {
                Value::Object(m) => stack.extend(m.iter().map(|(k, v)| (k.clone(), v))),
                Value::Array(a) => stack.extend(a.iter().map(|v| (key.clone(), v))),
                Value::String(s) if key.contains("mechanism") => {
                    assert!(MECHANISMS.contains(&s.as_str()), "{key}: {s}")
                }
                _ => {}
            }
        }
    }
}

#[test]
fn text_forms() {
    let ctx = SelectContext::isolated();
    let req = json!({"objective": "Refactor auth and billing", "scopes": ["auth", "billing"]});
    let summary = render_text(&req, TextForm::Summary, &ctx).unwrap();
    assert!(summary.ends_with('\n') && !summary.ends_with("\n\n"));
    let lines: Vec<&str> = summary.lines().collect();
    assert_eq!(lines[0], "selected_pattern: module-swarm");
    assert_eq!(lines[1], "overlays: twin-inspection");
    assert!(lines[2].starts_with("reason: "));
    assert_eq!(lines[3], "runtime_primary: ephemeral_workers");
    assert!(lines[4].starts_with("runtime_hint: "));
    assert_eq!(lines[5], "lanes:");
    assert!(
        lines[6].starts_with("  - builder: ") && lines[6].ends_with("[auth] -> worker-code-fast")
    );
    assert!(lines[8].starts_with("  - integrator: ") && lines[8].contains("[auth, billing]"));
    assert_eq!(lines[10], "proof_expectations:");
    assert_eq!(lines.len(), 11 + 6);

    let contract = render_text(&req, TextForm::PromptContract, &ctx).unwrap();
    assert!(!contract.ends_with('\n'));
    assert!(contract.contains("Worker pattern: module-swarm"));
    assert_eq!(contract.matches("Allowed edits:").count(), 4);

    let none = render_text(&json!({"objective": "x"}), TextForm::Summary, &ctx).unwrap();
    assert!(none.contains("[n/a] -> worker-code-fast"));
    assert_eq!(
        render_text(&json!({"objective": ""}), TextForm::Summary, &ctx)
            .unwrap_err()
            .field,
        "objective"
    );
}

#[test]
fn prompt_contract_has_five_lines_per_lane() {
    let out = run(json!({"objective": "Refactor auth and billing", "scopes": ["auth", "billing"]}));
    let contract = out["plan"]["runtime_mapping"]["prompt_contract"]
        .as_str()
        .unwrap();
    let lanes = out["plan"]["lanes"].as_array().unwrap().len();
    let lines: Vec<&str> = contract.lines().collect();
    let header = lines.iter().position(|l| *l == "Lanes:").unwrap();
    assert_eq!(lines.len(), header + 1 + 5 * lanes + 1);
}
