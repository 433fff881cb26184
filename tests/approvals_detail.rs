//! End-to-end: what `approvals/get` shows an operator before deciding, rendered from the plan
//! text: a unified diff for file changes (against the file as it is now, with the pinned
//! digest compared), a command's argv / env names / limits, the canonical plan, the allowed
//! narrowings and the time left.

mod common;

use common::gate::*;

use serde_json::{Value, json};

fn pending(env: &Env, op: &str, target: Value, args: Value, key: &str) -> (String, Value) {
    let mut a = env.agent("agent-1");
    let p = ok(&submit(&mut a, op, target, args, key)).clone();
    assert_eq!(p["state"], "pending", "{p}");
    let id = p["id"].as_str().unwrap().to_string();
    let mut o = env.operator();
    let got = o.call("approvals/get", json!({ "id": id }));
    (id, got)
}

#[test]
fn a_file_write_shows_a_unified_diff_against_the_file_as_it_is_now() {
    let env = Env::new(None);
    std::fs::create_dir_all(env.root().join("src")).unwrap();
    let before: String = (1..=12).map(|i| format!("line {i}\n")).collect();
    std::fs::write(env.root().join("src/a.txt"), &before).unwrap();
    let after = before
        .replace("line 2\n", "line two\n")
        .replace("line 12\n", "line 12\nline 13\n");
    let (id, got) = pending(
        &env,
        "file.write",
        json!({"path": "src/a.txt"}),
        json!({ "content": after }),
        "w1",
    );
    let fc = &got["detail"]["file_change"];
    assert_eq!(fc["change"], "modify", "{got}");
    assert_eq!(fc["current_matches_plan"], true);
    assert_eq!(
        fc["diff"],
        "--- a/src/a.txt\n+++ b/src/a.txt\n@@ -1,5 +1,5 @@\n line 1\n-line 2\n+line two\n line 3\n line 4\n line 5\n\
         @@ -10,3 +10,4 @@\n line 10\n line 11\n line 12\n+line 13\n"
    );
    assert_eq!(
        (fc["lines_added"].as_u64(), fc["lines_removed"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(fc["current"]["bytes"], before.len());
    assert_eq!(fc["proposed"]["bytes"], after.len());
    assert_eq!(fc["summary"], "modify src/a.txt: +2 -1 lines");
    // The canonical plan is the text the digest is over.
    let plan = got["detail"]["plan"].as_str().unwrap();
    assert_eq!(
        gaffer::util::sha256_hex(plan.as_bytes()),
        got["plan_digest"].as_str().unwrap(),
        "{got}"
    );
    assert_eq!(got["detail"]["plan_truncated"], false);
    // Narrowings: the requested bounds, execution mode (one use, not narrowable).
    let n = &got["detail"]["narrowing"];
    assert_eq!(n["mode"], "execution");
    assert_eq!(n["max_duration_seconds"], got["requested_duration_seconds"]);
    assert_eq!(n["max_uses"], 1);
    assert_eq!(n["uses_narrowable"], false);
    assert_eq!(n["duration_narrowable"], true);
    let left = got["detail"]["expires_in_seconds"].as_u64().unwrap();
    assert!(left > 60 && left <= 30 * 60, "{left}");
    // The list stays light: no detail there.
    let mut o = env.operator();
    let list = o.call("approvals/list", json!({}));
    assert!(list["approvals"][0].get("detail").is_none());

    // The file changes under the plan: the diff is against what is there now, and says the
    // execution would be refused.
    std::fs::write(env.root().join("src/a.txt"), "changed\n").unwrap();
    let got = o.call("approvals/get", json!({ "id": id }));
    let fc = &got["detail"]["file_change"];
    assert_eq!(fc["current_matches_plan"], false, "{got}");
    assert!(
        fc["diff"]
            .as_str()
            .unwrap()
            .starts_with("--- a/src/a.txt\n+++ b/src/a.txt\n@@ -1,1 +1,13 @@\n-changed\n")
    );
    assert!(
        fc["summary"]
            .as_str()
            .unwrap()
            .contains("changed since the plan was made")
    );
}

#[test]
fn creating_deleting_and_binary_files_are_shown_as_such() {
    let env = Env::new(None);
    let (_, got) = pending(
        &env,
        "file.write",
        json!({"path": "new/b.txt"}),
        json!({"content": "hello\nworld"}),
        "c1",
    );
    let fc = &got["detail"]["file_change"];
    assert_eq!(fc["change"], "create", "{got}");
    assert!(fc.get("current").is_none());
    assert_eq!(fc["current_matches_plan"], true);
    assert_eq!(
        fc["diff"],
        "--- /dev/null\n+++ b/new/b.txt\n@@ -0,0 +1,2 @@\n+hello\n+world\n\\ No newline at end of file\n"
    );

    std::fs::write(env.root().join("gone.txt"), "a\nb\n").unwrap();
    let (_, got) = pending(
        &env,
        "file.delete",
        json!({"path": "gone.txt"}),
        json!({}),
        "d1",
    );
    let fc = &got["detail"]["file_change"];
    assert_eq!(fc["change"], "delete", "{got}");
    assert!(fc.get("proposed").is_none());
    assert_eq!(
        fc["diff"],
        "--- a/gone.txt\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n"
    );

    std::fs::write(env.root().join("img.bin"), [0u8, 159, 146, 150, 0, 1]).unwrap();
    let (_, got) = pending(
        &env,
        "file.write",
        json!({"path": "img.bin"}),
        json!({"content": "text now\n"}),
        "b1",
    );
    let fc = &got["detail"]["file_change"];
    assert!(fc.get("diff").is_none(), "{got}");
    assert_eq!(fc["current"]["binary"], true);
    assert_eq!(fc["current"]["bytes"], 6);
    assert_eq!(
        fc["summary"],
        "replace img.bin: binary file (6 bytes) -> 9 bytes"
    );
}

#[test]
fn a_large_rewrite_is_bounded() {
    let env = Env::new(None);
    let before: String = (0..30_000).map(|i| format!("old {i}\n")).collect();
    std::fs::write(env.root().join("big.txt"), &before).unwrap();
    let after: String = (0..30_000).map(|i| format!("new {i}\n")).collect();
    let (_, got) = pending(
        &env,
        "file.write",
        json!({"path": "big.txt"}),
        json!({ "content": after }),
        "big",
    );
    let fc = &got["detail"]["file_change"];
    assert_eq!(fc["lines_added"], 30_000, "{}", fc["summary"]);
    assert_eq!(fc["lines_removed"], 30_000);
    assert_eq!(fc["diff_truncated"], true);
    assert!(fc["diff"].as_str().unwrap().len() <= 64 * 1024);
    assert_eq!(got["detail"]["plan_truncated"], true);
    assert!(got["detail"]["plan"].as_str().unwrap().len() <= 64 * 1024);
}

#[test]
fn a_command_shows_argv_env_names_and_limits_and_other_operations_their_plan() {
    let env = Env::new(None);
    let (_, got) = pending(
        &env,
        "command.run",
        json!({"argv": ["cargo", "test", "--locked"]}),
        json!({"env": {"RUST_LOG": "debug", "CI": "1"}, "timeout_ms": 120000}),
        "cmd",
    );
    let c = &got["detail"]["command"];
    assert_eq!(c["argv"], json!(["cargo", "test", "--locked"]), "{got}");
    assert_eq!(c["env_names"], json!(["CI", "RUST_LOG"]));
    assert_eq!(c["timeout_ms"], 120000);
    assert_eq!(c["cwd"], "");
    assert!(
        c["inherited_env"]
            .as_array()
            .unwrap()
            .contains(&json!("PATH"))
    );
    assert!(got["detail"].get("file_change").is_none());

    let (_, got) = pending(
        &env,
        "kv.set",
        json!({"key": "colour"}),
        json!({"value": "blue"}),
        "kv",
    );
    let d = &got["detail"];
    assert!(
        d.get("command").is_none() && d.get("file_change").is_none(),
        "{got}"
    );
    let plan: Value = serde_json::from_str(d["plan"].as_str().unwrap()).unwrap();
    assert_eq!(plan["operation"], "kv.set");
    assert_eq!(plan["target"], json!({"key": "colour"}));
    assert_eq!(plan["arguments"]["value"], "blue");
}

#[test]
fn an_editor_connection_can_decide_first_in_a_workspace_nobody_trusted() {
    // No `gaffer trust`, no client credential, no CLI decision before: an anonymous agent
    // submits and the operator connection is the first to sign anything.
    let env = Env::untrusted(None);
    let mut a = env.start(&[]);
    let p = ok(&submit(
        &mut a,
        "file.write",
        json!({"path": "n.txt"}),
        json!({"content": "x\n"}),
        "w",
    ))
    .clone();
    let id = p["id"].as_str().unwrap();
    let mut o = env.operator();
    approve(&env, &mut o, id);
    let done = wait_state(&mut a, id, &["succeeded", "failed"]);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(
        std::fs::read_to_string(env.root().join("n.txt")).unwrap(),
        "x\n"
    );
}
