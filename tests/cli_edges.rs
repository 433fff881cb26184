//! Command-line edges: a missing workspace is a startup error; a reader that goes away is not
//! a crash; the quick start shows the worker's echo and leaves no presence file behind.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};

use common::BIN;
use common::schema_check::{Sent, schemas};
use serde_json::Value;

#[test]
fn a_missing_workspace_is_a_startup_error() {
    let ws = common::workspace();
    let missing = ws.path().join("no-such-dir");
    let out = Command::new(BIN)
        .arg("--workspace")
        .arg(&missing)
        .arg("serve")
        .stdin(Stdio::null())
        .output()
        .expect("run gaffer");
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "nothing on the protocol stream");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no-such-dir") && err.contains("not a directory"),
        "{err}"
    );
}

#[test]
fn a_closed_stdout_is_not_a_panic() {
    let ws = common::workspace();
    let mut child = Command::new(BIN)
        .arg("--workspace")
        .arg(ws.path())
        .args(["call", "gaffer/status", "{}"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gaffer");
    drop(child.stdout.take()); // as `| head -c0` would
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(101), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read demo").flatten() {
        if e.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        }
    }
}

/// The quick start's output split at its `== N. label` lines: (label, lines under it).
fn steps(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if let Some(label) = line.strip_prefix("== ") {
            out.push((label.to_string(), Vec::new()));
        } else if let Some((_, lines)) = out.last_mut()
            && !line.is_empty()
        {
            lines.push(line.to_string());
        }
    }
    out
}

/// Every protocol line of a session step matches schema/ (replies by the method sent).
fn check_session(lines: &[String], script: &str) {
    let mut sent = HashMap::new();
    for line in script.lines() {
        let req: Value = serde_json::from_str(line).expect("script line is JSON");
        let method = req["method"].as_str().unwrap_or("").to_string();
        sent.insert(req["id"].clone(), Sent::Method(method));
    }
    for line in lines {
        let msg: Value = serde_json::from_str(line).expect("a session step prints protocol only");
        schemas().check_message(&msg, msg.get("id").and_then(|id| sent.get(id)));
    }
}

#[test]
fn the_quick_start_shows_the_worker_echo_and_cleans_up_presence() {
    let tmp = common::workspace();
    let demo = tmp.path().join("demo");
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("demo"), &demo);
    // Exactly the README's command (on a copy of demo/), with the binary already built.
    let out = Command::new("sh")
        .arg(demo.join("run.sh"))
        .env("GAFFER_BIN", BIN)
        .env_remove("GAFFER_OPERATOR_KEY_FILE")
        .env_remove("GAFFER_OPERATOR_PUBLIC_KEY_FILE")
        .output()
        .expect("run the quick start");
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}\n{err}");
    let steps = steps(&text);
    let step = |n: &str| -> &[String] {
        let found = steps.iter().find(|(label, _)| label.starts_with(n));
        &found
            .unwrap_or_else(|| panic!("step {n} is missing:\n{text}"))
            .1
    };
    let script = std::fs::read_to_string(demo.join("session.jsonl")).expect("session script");
    let session = step("3.");
    check_session(session, &script);
    let session = session.join("\n");
    assert!(
        session.contains("worker heard: hello from the demo"),
        "the worker's echo is missing:\n{session}"
    );
    assert!(session.contains(r#""state":"pending""#), "{session}");
    assert!(session.contains(r#""field":"cwd""#), "{session}");
    assert!(session.contains("method_not_found"), "{session}");
    let executed = step("5.");
    check_session(
        executed,
        r#"{"jsonrpc":"2.0","id":1,"method":"operations/wait"}"#,
    );
    let reply: Value = executed
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|m| m["id"] == 1)
        .expect("the wait's reply");
    assert_eq!(reply["result"]["state"], "succeeded", "{reply}");
    assert_eq!(
        std::fs::read_to_string(demo.join("notes/hello.txt")).expect("the approved write"),
        "written by gaffer\n"
    );
    // The plan ran its lane, which read its prompt, spoke as itself and proved its work.
    let planned = step("7.").join("\n");
    assert!(planned.contains(r#""status":"completed""#), "{planned}");
    assert!(planned.contains("lane read its prompt"), "{planned}");
    assert!(planned.contains("/lane-1-builder"), "{planned}");
    assert!(planned.contains("checks: succeeded"), "{planned}");
    let verified = step("8.").join("\n");
    assert!(verified.contains(r#""ok": true"#), "{verified}");
    // The operator key was a throwaway one, outside the workspace, and is gone.
    let key: Value = serde_json::from_str(&step("1.").join("\n")).expect("operator init JSON");
    let private = Path::new(key["private_key"].as_str().expect("private_key"));
    assert!(!private.starts_with(&demo), "{}", private.display());
    assert!(!private.exists(), "the demo key outlived the demo");
    let peers = demo.join(".gaffer").join("peers");
    let left = |peers: &Path| -> Vec<_> {
        std::fs::read_dir(peers)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default()
    };
    assert!(
        left(&peers).is_empty(),
        "presence files left after a clean exit: {:?}",
        left(&peers)
    );
    // One-shot commands on the existing store leave none either.
    let (code, _, _) = common::run_cli(&demo, &["worker", "list"]);
    assert_eq!(code, 0);
    assert!(
        left(&peers).is_empty(),
        "a CLI command left presence: {:?}",
        left(&peers)
    );
}
