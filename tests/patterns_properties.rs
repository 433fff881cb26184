//! Property tests of the selector: determinism, scale invariants, and no panic on any input.

#[path = "patterns_support.rs"]
mod support;

use gaffer::patterns::render::{write_output, write_output_serde};
use gaffer::patterns::{OutputKind, SelectContext, build_plan, parse_params, select};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Fields a failed request may name.
const FIELDS: [&str; 11] = [
    "params",
    "objective",
    "scopes",
    "scope",
    "dependencies",
    "dependency",
    "variants_requested",
    "variant_count",
    "max_parallel_lanes",
    "notes",
    "note",
];

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,24}".prop_map(Value::String),
        "-?[0-9]{1,30}".prop_map(Value::String),
        prop::sample::select(vec![
            "module",
            "pattern:module-swarm",
            "disjoint",
            "critical",
            "merge",
            "review",
            "2"
        ])
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

const KEYS: [&str; 21] = [
    "objective",
    "scopes",
    "scope",
    "dependencies",
    "dependency",
    "risk_level",
    "risk",
    "review_required",
    "no_review",
    "tests_required",
    "variants_requested",
    "variant_count",
    "durable",
    "persistent_workers",
    "recovery",
    "max_parallel_lanes",
    "notes",
    "note",
    "output",
    "roster_path",
    "unknown",
];

fn any_request() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(prop::sample::select(KEYS.to_vec()), any_json(), 0..10).prop_map(
        |m| {
            let mut map = Map::new();
            for (k, v) in m {
                // roster_path would touch the file system; keep it out of the fuzzed inputs.
                if k != "roster_path" {
                    map.insert(k.to_owned(), v);
                }
            }
            Value::Object(map)
        },
    )
}

/// Well-formed requests that exercise every pattern.
fn valid_request() -> impl Strategy<Value = Value> {
    let words = prop::sample::select(vec![
        "fix",
        "module",
        "compare",
        "phase",
        "recover",
        "canonical",
        "review",
        "small",
        "disjoint",
        "merge",
        "same file",
        "code",
        "test",
        "browser",
        "package",
        "secret",
        "own directory",
    ]);
    (
        prop::collection::vec(words.clone(), 1..6),
        prop::collection::vec("[a-z]{1,6}", 0..40),
        prop::collection::vec("[a-z]{1,6}", 0..5),
        prop::sample::select(vec!["low", "normal", "high", "critical", "HIGH", "medium"]),
        any::<bool>(),
        any::<bool>(),
        -3i64..12,
        any::<bool>(),
        any::<bool>(),
        1i64..40,
        prop::collection::vec(prop::sample::select(vec!["disjoint", "pattern:module-swarm", "note", "pattern:bogus"]), 0..3),
    )
        .prop_map(|(obj, scopes, deps, risk, review, tests, variants, durable, recovery, max, notes)| {
            json!({
                "objective": obj.join(" "), "scopes": scopes, "dependencies": deps, "risk_level": risk,
                "review_required": review, "tests_required": tests, "variants_requested": variants,
                "durable": durable, "recovery": recovery, "max_parallel_lanes": max, "notes": notes,
                "output": "select",
            })
        })
}

/// Every output form of `req`, as the reply encoder writes it and as the serde renderers do.
fn encoders_agree(req: &Value, ctx: &SelectContext) -> Result<(), TestCaseError> {
    for kind in OutputKind::ACCEPTED_SORTED {
        let mut r = req.clone();
        if let Value::Object(m) = &mut r {
            m.insert("output".into(), json!(kind));
        }
        let Ok(p) = parse_params(&r) else { continue };
        let Ok(outcome) = build_plan(&p.request, p.roster_path.as_deref(), ctx) else {
            continue;
        };
        let (mut fast, mut reference) = (Vec::new(), Vec::new());
        write_output(&outcome, p.output, &mut fast).unwrap();
        write_output_serde(&outcome, p.output, &mut reference).unwrap();
        prop_assert_eq!(
            String::from_utf8(fast).unwrap(),
            String::from_utf8(reference).unwrap(),
            "output {}",
            kind
        );
    }
    Ok(())
}

#[test]
fn the_reply_encoder_writes_the_serde_bytes_for_every_conformance_case() {
    for case in support::cases() {
        let ctx = support::context_for(&case);
        encoders_agree(&case["request"], &ctx).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn the_reply_encoder_writes_the_serde_bytes(
        req in valid_request(),
        text in "[ -~\\n\\t\"\\\\é日\\u{1}]{1,24}",
        persistent in any::<bool>(),
    ) {
        // Text that needs escaping, in every place request text reaches.
        let mut req = req;
        let objective = format!("{} {text}", req["objective"].as_str().unwrap());
        req["objective"] = json!(objective);
        req["scopes"].as_array_mut().unwrap().push(json!(text));
        req["dependencies"].as_array_mut().unwrap().push(json!(text));
        req["notes"].as_array_mut().unwrap().push(json!(text));
        req["persistent_workers"] = json!(persistent);
        encoders_agree(&req, &SelectContext::isolated())?;
    }

    #[test]
    fn any_request_gives_a_plan_or_an_error_naming_a_field(req in any_request()) {
        match select(&req, &SelectContext::isolated()) {
            Ok(out) => prop_assert_eq!(&out["dry_run"], &json!(true)),
            Err(e) => prop_assert!(FIELDS.contains(&e.field.as_str()) || e.field == "output", "field {:?}", e.field),
        }
    }

    #[test]
    fn selection_is_deterministic(req in valid_request()) {
        let a = serde_json::to_string(&select(&req, &SelectContext::isolated()).unwrap()).unwrap();
        let b = serde_json::to_string(&select(&req, &SelectContext::isolated()).unwrap()).unwrap();
        prop_assert_eq!(a, b);
    }

    #[test]
    fn lane_and_scale_invariants(req in valid_request()) {
        let out = select(&req, &SelectContext::isolated()).unwrap();
        let plan = &out["plan"];
        let max = req["max_parallel_lanes"].as_u64().unwrap();
        let lanes = plan["lanes"].as_array().unwrap();
        prop_assert!(!lanes.is_empty());
        let scale = &plan["module_swarm_scale"];
        if plan["selection"]["selected_pattern"] == "module-swarm" {
            let requested = scale["requested_lane_count"].as_u64().unwrap();
            let active = scale["max_active_lanes"].as_u64().unwrap();
            let waves = scale["waves_required"].as_u64().unwrap();
            let size = scale["wave_size"].as_u64().unwrap();
            prop_assert!(waves * size >= requested);
            prop_assert!((waves - 1) * size < requested, "no empty wave");
            prop_assert!(active >= 1 && active <= max);
            prop_assert_eq!(size, active);
            let builders = lanes.iter().filter(|l| l["role"] == "builder").count() as u64;
            prop_assert_eq!(builders, requested);
            let integrator = lanes.iter().find(|l| l["role"] == "integrator").unwrap();
            let expected_count = if scale["integrator_per_wave"] == true { waves } else { 1 };
            prop_assert_eq!(integrator["count"].as_u64().unwrap(), expected_count);
        } else {
            prop_assert!(scale.is_null());
        }
        if plan["selection"]["selected_pattern"] == "blueprint-fanout" {
            let designers = lanes.iter().filter(|l| l["role"] == "variant-designer").count() as u64;
            prop_assert!(designers >= 1 && designers <= max);
        }
        let review = plan["request"]["review_required"] == true;
        let has_reviewer = lanes.last().unwrap()["role"] == "reviewer";
        prop_assert_eq!(review && plan["selection"]["selected_pattern"] != "twin-inspection", has_reviewer);
        for lane in lanes {
            let selected = lane["selected_profile"].as_str().unwrap();
            let fallbacks: Vec<&str> = lane["fallback_profiles"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
            prop_assert!(!fallbacks.contains(&selected));
            let mut dedup = fallbacks.clone();
            dedup.sort_unstable();
            dedup.dedup();
            prop_assert_eq!(dedup.len(), fallbacks.len());
        }
    }
}

#[test]
fn ten_thousand_scopes_plan_in_bounded_waves() {
    let scopes: Vec<String> = (0..10_000).map(|i| format!("pkg-{i:05}")).collect();
    for output in [
        "execution_plan",
        "prompt_bundle",
        "task_graph",
        "ephemeral_workers",
        "persistent_workers",
    ] {
        let req = json!({"objective": "Bump headers", "scopes": scopes, "max_parallel_lanes": 16, "output": output});
        let out = select(&req, &SelectContext::isolated()).unwrap();
        assert!(out["kind"].as_str().unwrap().starts_with("worker_pattern_"));
        if output == "execution_plan" {
            let scale = &out["plan"]["module_swarm_scale"];
            assert_eq!(scale["requested_lane_count"], 10_000);
            assert_eq!(scale["max_active_lanes"], 4);
            assert_eq!(scale["waves_required"], 2_500);
            assert_eq!(out["plan"]["lanes"].as_array().unwrap().len(), 10_002);
            // Rendered size stays linear in the number of scopes.
            let bytes = serde_json::to_string(&out).unwrap().len();
            assert!(bytes < 40_000_000, "{bytes} bytes");
        }
    }
}

#[test]
fn huge_and_wrong_values_are_errors_naming_the_field() {
    let ctx = SelectContext::isolated();
    let field = |req: Value| select(&req, &ctx).unwrap_err().field;
    assert_eq!(
        field(json!({"objective": "x", "max_parallel_lanes": u64::MAX})),
        "max_parallel_lanes"
    );
    assert_eq!(
        field(json!({"objective": "x", "max_parallel_lanes": -5})),
        "max_parallel_lanes"
    );
    assert_eq!(
        field(json!({"objective": "x", "max_parallel_lanes": [1]})),
        "max_parallel_lanes"
    );
    assert_eq!(
        field(json!({"objective": "x", "variants_requested": i64::MAX})),
        "variants_requested"
    );
    assert_eq!(
        field(json!({"objective": "x", "variant_count": "9".repeat(40)})),
        "variant_count"
    );
    assert_eq!(
        field(json!({"objective": "x", "dependencies": 7})),
        "dependencies"
    );
    assert_eq!(field(json!({"objective": "x", "note": true})), "note");
    assert_eq!(field(json!({"objective": "x", "output": 3})), "output");
    assert_eq!(field(json!(42)), "params");
    // Huge but valid: a very wide parallel budget does not allocate anything extra.
    let out = select(&json!({"objective": "compare", "variants_requested": 1000, "max_parallel_lanes": i64::MAX}), &ctx).unwrap();
    assert_eq!(out["plan"]["lanes"].as_array().unwrap().len(), 1001 + 1);
}
