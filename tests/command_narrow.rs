//! Finding 4's environment and classification half: `command.run` starts from a fixed minimal
//! environment (nothing from gaffer's), a variable reaches it only under a rule that names
//! it, rules match arguments by position, and `doctor` flags program-only allow rules.

mod common;

use common::gate::{Env, ok, submit, wait_state};
use serde_json::{Value, json};

const POLICY: &str = r#"
rules:
  - id: dump-env
    effect: allow
    operations: ["command.run"]
    targets: [{kind: command, argv: ["sh", "-c", "env > env.txt"]}]
  - id: touch-with-ci
    effect: allow
    operations: ["command.run"]
    targets: [{kind: command, argv: ["touch", "*.txt"]}]
    attrs: {env: ["CI"]}
"#;

/// What gaffer's own environment holds and no command may see.
const LEAKY: &[(&str, &str)] = &[
    ("HOME", "/home/operator-leak"),
    ("GIT_DIR", "/leak/git-dir"),
    ("GIT_CONFIG_GLOBAL", "/leak/gitconfig"),
    ("PYTHONHOME", "/leak/python"),
    ("RUBYOPT", "-rleak"),
    ("JAVA_TOOL_OPTIONS", "-javaagent:/leak.jar"),
    ("PERL5LIB", "/leak/perl"),
];

fn env() -> Env {
    let env = Env::untrusted(Some(POLICY));
    std::fs::remove_file(env.root().join(".gaffer/providers.yaml")).expect("no providers");
    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "{out} {err}");
    env
}

fn run(s: &mut common::Server, argv: Value, args: Value, key: &str) -> Value {
    let r = submit(s, "command.run", json!({ "argv": argv }), args, key);
    let id = ok(&r)["id"].as_str().expect("operation id").to_string();
    wait_state(s, &id, &["succeeded", "failed", "denied"])
}

#[test]
fn a_command_sees_only_the_fixed_environment_not_gaffers() {
    let env = env();
    let mut s = env.agent_env("agent", LEAKY);
    let v = run(
        &mut s,
        json!(["sh", "-c", "env > env.txt"]),
        json!({}),
        "env",
    );
    assert_eq!(v["state"], "succeeded", "{v}");
    let seen = std::fs::read_to_string(env.root().join("env.txt")).expect("env.txt");
    for (name, value) in LEAKY {
        assert!(!seen.contains(value), "{name}'s value leaked:\n{seen}");
    }
    let mut names: Vec<&str> = seen
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    names.sort_unstable();
    // sh itself adds PWD (and some shells SHLVL, OLDPWD, _); nothing else gaffer did not set.
    names.retain(|n| !matches!(*n, "PWD" | "SHLVL" | "OLDPWD" | "_"));
    assert_eq!(
        names,
        ["GAFFER_OPERATION_ID", "HOME", "LANG", "PATH"],
        "{seen}"
    );
    assert!(seen.contains("HOME=/nonexistent\n"), "{seen}");
    assert!(
        seen.contains("PATH=/usr/local/bin:/usr/bin:/bin\n"),
        "{seen}"
    );
    assert!(seen.contains("LANG=C.UTF-8\n"), "{seen}");
}

#[test]
fn rules_match_argv_by_position_and_variables_only_when_named() {
    let env = env();
    let mut s = env.agent("agent");
    let v = run(
        &mut s,
        json!(["touch", "a.txt"]),
        json!({"env": {"CI": "1"}}),
        "a",
    );
    assert_eq!(v["state"], "succeeded", "{v}");
    assert!(env.root().join("a.txt").exists());
    // Another argument, an extra one, a `/` where `*` stands, or a variable no rule names:
    // no rule matches, so the trusted policy denies and nothing runs.
    for (i, (argv, args)) in [
        (json!(["touch", "b.md"]), json!({"env": {"CI": "1"}})),
        (
            json!(["touch", "b.txt", "c.txt"]),
            json!({"env": {"CI": "1"}}),
        ),
        (json!(["touch", "sub/b.txt"]), json!({"env": {"CI": "1"}})),
        (
            json!(["touch", "b.txt"]),
            json!({"env": {"CI": "1", "GIT_DIR": "x"}}),
        ),
        (
            json!(["sh", "-c", "env > env.txt"]),
            json!({"env": {"CI": "1"}}),
        ),
        (json!(["sh", "-c", "touch b.txt"]), json!({})),
    ]
    .into_iter()
    .enumerate()
    {
        let v = run(&mut s, argv.clone(), args, &format!("no-{i}"));
        assert_eq!(v["state"], "denied", "{argv}: {v}");
    }
    assert!(!env.root().join("b.txt").exists() && !env.root().join("b.md").exists());
    assert!(!env.root().join("env.txt").exists());
}

#[test]
fn doctor_flags_a_program_only_command_rule_as_broad() {
    let env = Env::untrusted(Some(
        "rules:\n  - id: any-git\n    effect: allow\n    operations: [\"command.run\"]\n    targets: [{kind: command, fields: {program: [git]}}]\n",
    ));
    std::fs::remove_file(env.root().join(".gaffer/providers.yaml")).expect("no providers");
    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "{out} {err}");
    let (code, out, _) = env.cli(&["doctor"]);
    assert_eq!(code, 1, "{out}");
    let report: Value = serde_json::from_str(&out).expect("doctor JSON");
    let check = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "command_rules")
        .unwrap_or_else(|| panic!("no command_rules check: {report}"));
    assert_eq!(check["ok"], false, "{check}");
    assert!(
        check["detail"].as_str().unwrap_or("").contains("any-git"),
        "{check}"
    );
    // Naming the arguments is not broad.
    std::fs::write(env.root().join(".gaffer/policy.yaml"), POLICY).expect("policy");
    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "{out} {err}");
    let (_, out, _) = env.cli(&["doctor"]);
    let report: Value = serde_json::from_str(&out).expect("doctor JSON");
    assert!(
        report["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .any(|c| c["name"] == "command_rules" && c["ok"] == true),
        "{report}"
    );
}

/// Deception pass: `git status` with three `GIT_CONFIG_*` variables runs the agent's hook.
/// What the operator reads before signing (the summary `gaffer approvals` lists, `gaffer
/// approve` prints and the editors show) names every variable and value first, and the argv with its bounds, so a
/// long argv never pushes them out.
#[test]
fn the_operator_reads_every_variable_a_command_sets_before_its_argv() {
    // Nothing trusted: everything waits for the operator.
    let env = Env::untrusted(None);
    let mut agent = env.agent("agent");
    let hook = "echo agent-was-here > PWNED; false";
    let padding = "x".repeat(600);
    let r = submit(
        &mut agent,
        "command.run",
        json!({"argv": ["git", "status", "--short", padding]}),
        json!({"env": {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.fsmonitor",
                       "GIT_CONFIG_VALUE_0": hook}}),
        "hooked",
    );
    let op = ok(&r).clone();
    assert_eq!(op["state"], "pending", "{op}");
    let (code, out, err) = env.cli(&["approvals"]);
    assert_eq!(code, 0, "{out} {err}");
    let listed: Value = serde_json::from_str(&out).expect("approvals json");
    let summary = listed["approvals"][0]["summary"]
        .as_str()
        .expect("a summary");
    let named = "env 3 [GIT_CONFIG_COUNT, GIT_CONFIG_KEY_0, GIT_CONFIG_VALUE_0]; argv [\"git\", \"status\", \"--short\", ";
    assert!(summary.starts_with(named), "{summary}");
    // The values follow the argv, each cut short (the whole plan holds them all).
    let mut env = std::collections::BTreeMap::new();
    env.insert("A_PADDED", "x".repeat(480));
    env.insert("GIT_CONFIG_VALUE_0", hook.to_string());
    let r = submit(
        &mut agent,
        "command.run",
        json!({"argv": ["git", "status"]}),
        json!({ "env": env }),
        "padded",
    );
    let summary = ok(&r)["presentation"]["summary"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        summary.starts_with("env 2 [A_PADDED, GIT_CONFIG_VALUE_0]; argv [\"git\", \"status\"]"),
        "{summary}"
    );
    assert!(
        summary.contains(&format!("GIT_CONFIG_VALUE_0={hook:?}")),
        "{summary}"
    );
}
