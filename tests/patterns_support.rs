//! Shared helpers of the patterns test suites (included with `#[path]` by them; compiled on its
//! own it is an empty test crate).
#![allow(dead_code)]

use std::path::PathBuf;

use gaffer::patterns::{RosterEnv, SelectContext};
use serde_json::{Map, Value, json};

/// Folder holding `cases.jsonl` and `fixtures/` (copied from the shared conformance set).
pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/patterns")
}

/// All conformance cases, in file order.
pub fn cases() -> Vec<Value> {
    let text =
        std::fs::read_to_string(data_dir().join("cases.jsonl")).expect("cases.jsonl is readable");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("each case line is JSON"))
        .collect()
}

/// The selection context a case asks for: isolated, with the case's roster environment and
/// the fixtures folder as base.
pub fn context_for(case: &Value) -> SelectContext {
    let env: Vec<(String, String)> = case["env"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default();
    let mut ctx = SelectContext::isolated();
    ctx.env = RosterEnv::from_pairs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    ctx.base_dir = Some(data_dir());
    ctx
}

/// The structural decision of a rendered result, restricted to the keys `expect` lists.
pub fn decision(result: &Value, expect: &Map<String, Value>) -> Value {
    let plan = &result["plan"];
    let sel = &plan["selection"];
    let mut out = Map::new();
    for key in expect.keys() {
        let v = match key.as_str() {
            "selected_pattern" | "overlays" | "selection_source" | "override" | "dimensions" | "scores"
            | "score_adjustments" | "matched_signals" => sel[key].clone(),
            "lanes" => Value::Array(
                plan["lanes"]
                    .as_array()
                    .map(|lanes| {
                        lanes
                            .iter()
                            .map(|l| {
                                json!({
                                    "role": l["role"], "count": l["count"], "scope": l["scope"],
                                    "selected_profile": l["selected_profile"],
                                    "fallback_profiles": l["fallback_profiles"], "toolsets": l["toolsets"],
                                    "disable_reasoning": l["model_policy"]["disable_reasoning"],
                                })
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            ),
            "primary_mechanism" | "fallback_mechanisms" => plan["runtime_mapping"][key].clone(),
            "module_swarm_scale" => plan["module_swarm_scale"].clone(),
            "proof_expectation_count" => json!(plan["proof_expectations"].as_array().map_or(0, Vec::len)),
            "safety_note_count" => json!(plan["safety_notes"].as_array().map_or(0, Vec::len)),
            "task_graph" => Value::Array(
                result["execution_plan"]["task_graph_tasks"]
                    .as_array()
                    .map(|tasks| {
                        tasks
                            .iter()
                            .map(|t| json!({"id": t["id"], "role": t["role"], "depends_on": t["depends_on"]}))
                            .collect()
                    })
                    .unwrap_or_default(),
            ),
            other => panic!("unknown expect key {other}"),
        };
        out.insert(key.clone(), v);
    }
    Value::Object(out)
}

/// Human-readable differences between two decisions, key by key.
pub fn diff(expected: &Value, actual: &Value) -> Vec<String> {
    let (Some(e), Some(a)) = (expected.as_object(), actual.as_object()) else {
        return vec![format!("expected {expected}, got {actual}")];
    };
    e.iter()
        .filter(|(k, v)| a.get(*k) != Some(*v))
        .map(|(k, v)| {
            format!(
                "  {k}: expected {v}\n  {k}:   actual {}",
                a.get(k).unwrap_or(&Value::Null)
            )
        })
        .collect()
}
