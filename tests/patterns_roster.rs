//! Roster loading, mapping and validation against the fixture files.

#[path = "patterns_support.rs"]
mod support;

use gaffer::patterns::roster::{
    ENV_LEGACY_ROSTER_PATH, ENV_ROSTER_PATH, ENV_UNAVAILABLE, validate_roster,
};
use gaffer::patterns::{RosterEnv, SelectContext, select};
use serde_json::{Value, json};

fn ctx_with(env: &[(&str, &str)]) -> SelectContext {
    let mut ctx = SelectContext::isolated();
    ctx.env = RosterEnv::from_pairs(env.iter().copied());
    ctx.base_dir = Some(support::data_dir());
    ctx
}

fn fixture(name: &str) -> std::path::PathBuf {
    support::data_dir().join("fixtures").join(name)
}

#[test]
fn broken_roster_without_persistent_workers_still_selects_with_a_diagnostic() {
    for broken in [
        "fixtures/roster-bad-yaml.yaml",
        "fixtures",
        "fixtures/no-such-roster.yaml",
    ] {
        let ctx = ctx_with(&[(ENV_ROSTER_PATH, broken)]);
        let out = select(
            &json!({"objective": "Refactor auth and billing", "scopes": ["auth", "billing"]}),
            &ctx,
        )
        .unwrap_or_else(|e| panic!("{broken}: {e}"));
        assert_eq!(out["plan"]["selection"]["selected_pattern"], "module-swarm");
        let diags = out["diagnostics"]
            .as_array()
            .expect("a diagnostic is attached");
        assert_eq!(diags.len(), 1);
        assert!(diags[0].as_str().unwrap().contains(broken), "{diags:?}");
        // The plan itself is the same as without any roster.
        let clean = select(
            &json!({"objective": "Refactor auth and billing", "scopes": ["auth", "billing"]}),
            &ctx_with(&[]),
        )
        .unwrap();
        assert_eq!(out["plan"], clean["plan"]);
        assert!(clean.get("diagnostics").is_none());
    }
}

#[test]
fn broken_roster_with_persistent_workers_is_an_error_naming_roster() {
    for broken in ["fixtures/roster-bad-yaml.yaml", "fixtures"] {
        let ctx = ctx_with(&[(ENV_ROSTER_PATH, broken)]);
        let err = select(
            &json!({"objective": "Fix it", "persistent_workers": true}),
            &ctx,
        )
        .unwrap_err();
        assert_eq!(err.field, "roster", "{broken}");
        assert!(err.message.contains(broken), "{}", err.message);
    }
}

/// Spec §7.1: a roster path that does not exist means no roster, also with persistent workers:
/// no mapping and no roster notes (the plan equals the one made without any roster).
#[test]
fn missing_roster_with_persistent_workers_is_no_roster() {
    let req = json!({"objective": "Implement persistent profile lanes", "persistent_workers": true, "scopes": ["router"]});
    let out = select(
        &req,
        &ctx_with(&[(ENV_ROSTER_PATH, "fixtures/no-such-roster.yaml")]),
    )
    .expect("a missing roster is no roster");
    let clean = select(&req, &ctx_with(&[])).expect("no roster configured");
    assert_eq!(out["plan"], clean["plan"]);
    let notes = out["plan"]["safety_notes"].to_string();
    assert!(!notes.contains("roster"), "{notes}");
}

#[test]
fn roster_path_param_beats_the_environment_and_resolves_against_the_base_dir() {
    let ctx = ctx_with(&[(ENV_ROSTER_PATH, "fixtures/roster-list.yaml")]);
    let req = json!({"objective": "Implement persistent profile lanes", "persistent_workers": true,
        "scopes": ["router"], "roster_path": "fixtures/roster-basic.yaml"});
    let out = select(&req, &ctx).unwrap();
    assert_eq!(out["plan"]["lanes"][0]["selected_profile"], "builder-a");
    assert_eq!(out["plan"]["lanes"][1]["selected_profile"], "reviewer-a");
    let notes = out["plan"]["safety_notes"].as_array().unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().unwrap().contains("fixtures/roster-basic.yaml"))
    );
}

#[test]
fn workspace_default_roster_is_used_only_when_it_exists() {
    let dir = tempfile::tempdir().unwrap();
    let default = dir.path().join(".gaffer/roster.yaml");
    let mut ctx = SelectContext::isolated();
    ctx.workspace_roster = Some(default.clone());
    let req = json!({"objective": "Implement persistent profile lanes", "persistent_workers": true, "scopes": ["router"]});
    let out = select(&req, &ctx).unwrap();
    assert_eq!(
        out["plan"]["lanes"][0]["selected_profile"],
        "worker-code-fast"
    );
    std::fs::create_dir_all(default.parent().unwrap()).unwrap();
    std::fs::copy(fixture("roster-basic.yaml"), &default).unwrap();
    let out = select(&req, &ctx).unwrap();
    assert_eq!(out["plan"]["lanes"][0]["selected_profile"], "builder-a");
    // An env path still wins over the workspace default.
    ctx.env = RosterEnv::from_pairs([(
        ENV_LEGACY_ROSTER_PATH,
        fixture("roster-list.yaml").to_str().unwrap(),
    )]);
    let out = select(&req, &ctx).unwrap();
    assert_eq!(out["plan"]["lanes"][0]["selected_profile"], "solo-worker");
}

#[test]
fn empty_roster_maps_nothing_and_adds_no_notes() {
    let ctx = ctx_with(&[(ENV_ROSTER_PATH, "fixtures/roster-empty.yaml")]);
    let out = select(
        &json!({"objective": "Fix it", "persistent_workers": true}),
        &ctx,
    )
    .unwrap();
    assert_eq!(out["plan"]["safety_notes"].as_array().unwrap().len(), 1);
    assert_eq!(
        out["plan"]["runtime_mapping"]["primary_mechanism"],
        "persistent_workers"
    );
}

#[test]
fn scope_families_expand_into_task_types() {
    // ops -> lifecycle; spec -> docs family; smoke via the reviewer; merge-gate via the integrator.
    let ctx = ctx_with(&[(ENV_ROSTER_PATH, "fixtures/roster-ops.yaml")]);
    let out = select(
        &json!({"objective": "Rework in parallel", "persistent_workers": true, "scopes": ["ops", "spec"]}),
        &ctx,
    )
    .unwrap();
    let lanes = out["plan"]["lanes"].as_array().unwrap();
    let profiles: Vec<&str> = lanes
        .iter()
        .map(|l| l["selected_profile"].as_str().unwrap())
        .collect();
    let roles: Vec<&str> = lanes.iter().map(|l| l["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["builder", "builder", "integrator", "reviewer"]);
    assert_eq!(
        profiles,
        ["ops-worker", "spec-writer", "merge-gate", "smoke-tester"]
    );
}

#[test]
fn unavailable_note_lists_every_name_sorted() {
    let ctx = ctx_with(&[
        (ENV_ROSTER_PATH, "fixtures/roster-basic.yaml"),
        (ENV_UNAVAILABLE, "zed, builder-a"),
    ]);
    let out = select(
        &json!({"objective": "Fix it", "persistent_workers": true}),
        &ctx,
    )
    .unwrap();
    let notes: Vec<&str> = out["plan"]["safety_notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        notes.iter().any(|n| n.contains("builder-a, zed")),
        "{notes:?}"
    );
    assert_eq!(out["plan"]["lanes"][0]["selected_profile"], "builder-b");
}

fn report(name: &str) -> Value {
    serde_json::to_value(validate_roster(&fixture(name))).unwrap()
}

#[test]
fn validation_reports_every_rule() {
    let r = report("roster-invalid.yaml");
    assert_eq!(r["ok"], false);
    assert_eq!(r["worker_count"], 7);
    let errors: Vec<&str> = r["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(errors.len(), 5, "{errors:?}");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("duplicate") && e.contains("dup"))
    );
    assert!(errors.iter().any(|e| e.contains("worker 3 has no id")));
    assert!(
        errors
            .iter()
            .any(|e| e.contains("worker 3") && e.contains("role"))
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("bad-caps") && e.contains("capabilities"))
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("worker 7 must be a mapping"))
    );
    let warnings: Vec<&str> = r["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].contains("`url`") && warnings[1].contains("`api_key`"));
    assert!(
        !warnings.iter().any(|w| w.contains("not-a-real-key")),
        "values never leak into reports"
    );
}

#[test]
fn validation_of_the_other_fixtures() {
    for (name, ok, count, errors) in [
        ("roster-basic.yaml", true, 7, 0),
        ("roster-template.yaml", true, 3, 0),
        ("roster-empty.yaml", true, 0, 0),
        ("roster-ops.yaml", true, 4, 0),
        ("roster-list.yaml", false, 3, 2),
        ("roster-not-list.yaml", false, 0, 1),
        ("roster-bad-yaml.yaml", false, 0, 1),
        ("does-not-exist.yaml", false, 0, 1),
    ] {
        let r = report(name);
        assert_eq!(r["ok"], ok, "{name}: {r}");
        assert_eq!(r["worker_count"], count, "{name}: {r}");
        assert_eq!(r["errors"].as_array().unwrap().len(), errors, "{name}: {r}");
    }
    assert!(
        report("roster-bad-yaml.yaml")["errors"][0]
            .as_str()
            .unwrap()
            .contains("YAML")
    );
}
