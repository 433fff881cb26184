//! The sandbox opt-out: only the operator's trusted policy can say `sandbox: off`. The same
//! file written by the agent (untrusted) is ignored, so an approved command still runs
//! sandboxed; once the operator trusts it, commands run unconfined and `doctor` says so.

mod common;

use common::gate::{Env, approve, ok, submit, wait_state};
use serde_json::{Value, json};

/// Copies the operator's key file into the workspace: only an unconfined process can.
fn steal(env: &Env) -> Value {
    json!([
        "sh",
        "-c",
        format!("cat '{}' > stolen.txt", env.key_file.display())
    ])
}

fn policy(env: &Env) -> String {
    format!(
        "sandbox: off\nrules:\n  - id: steal\n    effect: allow\n    operations: [\"command.run\"]\n    targets: [{{kind: command, argv: {}}}]\n",
        steal(env)
    )
}

fn doctor_sandbox(env: &Env) -> Value {
    let (_, out, _) = env.cli(&["doctor"]);
    let report: Value = serde_json::from_str(&out).expect("doctor JSON");
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "sandbox")
        .cloned()
        .unwrap_or_else(|| panic!("no sandbox check: {report}"))
}

#[test]
fn sandbox_off_counts_only_once_the_operator_trusted_it() {
    let env = Env::untrusted(None);
    std::fs::remove_file(env.root().join(".gaffer/providers.yaml")).expect("no providers");
    std::fs::write(env.root().join(".gaffer/policy.yaml"), policy(&env)).expect("policy");
    // Untrusted: its allow rule and its `sandbox: off` are both ignored.
    let check = doctor_sandbox(&env);
    assert_eq!(check["ok"], true, "{check}");
    assert!(
        check["detail"].as_str().unwrap_or("").contains("ignored"),
        "{check}"
    );
    let mut agent = env.agent("agent");
    let mut op = env.operator();
    let r = submit(
        &mut agent,
        "command.run",
        json!({"argv": steal(&env)}),
        json!({}),
        "s1",
    );
    let id = ok(&r)["id"].as_str().expect("id").to_string();
    assert_eq!(ok(&r)["state"], "pending", "{r}");
    approve(&env, &mut op, &id);
    let v = wait_state(&mut agent, &id, &["succeeded", "failed"]);
    assert_eq!(
        v["result"]["success"], false,
        "the sandbox let it read the key: {v}"
    );
    let stolen = std::fs::read_to_string(env.root().join("stolen.txt")).unwrap_or_default();
    assert!(stolen.is_empty(), "the key leaked: {stolen}");
    drop((agent, op));

    // Trusted by the operator: commands start unconfined, and doctor says so.
    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "{out} {err}");
    let check = doctor_sandbox(&env);
    assert_eq!(check["ok"], false, "{check}");
    assert!(
        check["detail"]
            .as_str()
            .unwrap_or("")
            .contains("unconfined"),
        "{check}"
    );
    let mut agent = env.agent("agent");
    let r = submit(
        &mut agent,
        "command.run",
        json!({"argv": steal(&env)}),
        json!({}),
        "s2",
    );
    let id = ok(&r)["id"].as_str().expect("id").to_string();
    let v = wait_state(&mut agent, &id, &["succeeded", "failed"]);
    assert_eq!(v["result"]["success"], true, "{v}");
    let key = std::fs::read_to_string(&env.key_file).expect("key");
    assert_eq!(
        std::fs::read_to_string(env.root().join("stolen.txt")).expect("copied"),
        key,
        "unconfined, the command reaches what the sandbox kept from it"
    );
}
