//! `gaffer doctor` on the real binary: read-only, and it flags what weakens the gates.

mod common;

use std::process::Command;

use serde_json::Value;

fn doctor(ws: &std::path::Path, key_file: &std::path::Path) -> (i32, Value) {
    let out = Command::new(common::BIN)
        .arg("--workspace")
        .arg(ws)
        .arg("doctor")
        .env("GAFFER_OPERATOR_KEY_FILE", key_file)
        .output()
        .expect("run doctor");
    let report: Value = serde_json::from_slice(&out.stdout).expect("doctor prints JSON");
    (out.status.code().unwrap_or(-1), report)
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} check in {report}"))
}

#[test]
fn doctor_is_read_only_and_flags_untrusted_policy_and_a_key_inside_the_workspace() {
    let ws = common::workspace();
    let cfg = common::workspace();
    let key = cfg.path().join("operator.key");
    let (rc, report) = doctor(ws.path(), &key);
    assert_eq!(rc, 0, "{report}");
    assert_eq!(report["ok"], true);
    assert!(!ws.path().join(".gaffer").exists(), "doctor writes nothing");

    std::fs::create_dir_all(ws.path().join(".gaffer")).expect("mkdir");
    std::fs::write(
        ws.path().join(".gaffer/policy.yaml"),
        "rules:\n  - id: all\n    effect: allow\n    operations: [\"file.write\"]\n",
    )
    .expect("policy");
    let (rc, report) = doctor(ws.path(), &key);
    assert_eq!(rc, 1);
    assert_eq!(check(&report, "policy_trust")["ok"], false, "{report}");

    // A key kept inside the workspace is readable by the agent: flagged.
    let inside = ws.path().join("operator.key");
    gaffer::operator::OperatorSigner::init(&inside, &inside.with_extension("pub"), None)
        .expect("key");
    let (_, report) = doctor(ws.path(), &inside);
    assert_eq!(check(&report, "operator_key")["ok"], false, "{report}");
}
