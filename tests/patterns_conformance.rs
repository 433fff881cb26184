//! Every conformance case, run in process: same structural decision as the reference.

#[path = "patterns_support.rs"]
mod support;

use gaffer::patterns::select;
use serde_json::Value;

#[test]
fn every_conformance_case_matches_the_reference_decision() {
    let cases = support::cases();
    assert_eq!(cases.len(), 84, "the conformance set has 84 cases");
    let mut failures = Vec::new();
    let (mut decisions, mut kinds, mut errors) = (0, 0, 0);
    for case in &cases {
        let id = case["id"].as_str().unwrap_or("?");
        let ctx = support::context_for(case);
        let result = select(&case["request"], &ctx);
        if let Some(err) = case.get("expect_error") {
            errors += 1;
            match result {
                Err(e) if Some(e.field.as_str()) == err["field"].as_str() => {}
                Err(e) => failures.push(format!(
                    "{id}: error names {:?}, expected {}",
                    e.field, err["field"]
                )),
                Ok(_) => failures.push(format!(
                    "{id}: accepted, expected an error on {}",
                    err["field"]
                )),
            }
            continue;
        }
        let out = match result {
            Ok(out) => out,
            Err(e) => {
                failures.push(format!("{id}: unexpected error {e}"));
                continue;
            }
        };
        if out["kind"] != case["expect_kind"] {
            failures.push(format!(
                "{id}: kind {} expected {}",
                out["kind"], case["expect_kind"]
            ));
        }
        assert_eq!(
            out["dry_run"],
            Value::Bool(true),
            "{id}: every wrapper is a dry run"
        );
        kinds += 1;
        if let Some(expect) = case.get("expect").and_then(Value::as_object) {
            decisions += 1;
            let actual = support::decision(&out, expect);
            let d = support::diff(&case["expect"], &actual);
            if !d.is_empty() {
                failures.push(format!("{id}:\n{}", d.join("\n")));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    assert_eq!((decisions, kinds, errors), (73, 80, 4));
}
