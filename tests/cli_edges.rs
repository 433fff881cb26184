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

#[test]
fn the_quick_start_shows_the_worker_echo_and_cleans_up_presence() {
    let tmp = common::workspace();
    let demo = tmp.path().join("demo");
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("demo"), &demo);
    let script = std::fs::read(demo.join("session.jsonl")).expect("session script");
    let out = Command::new(BIN)
        .arg("--workspace")
        .arg(&demo)
        .arg("serve")
        .stdin(std::fs::File::open(demo.join("session.jsonl")).expect("open script"))
        .output()
        .expect("run the quick start");
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("worker heard: hello from the demo"),
        "the worker's echo is missing:\n{text}"
    );
    // Every reply and notification of the quick start matches schema/.
    let mut sent = HashMap::new();
    for line in String::from_utf8_lossy(&script).lines() {
        let req: Value = serde_json::from_str(line).expect("script line is JSON");
        let method = req["method"].as_str().unwrap_or("").to_string();
        sent.insert(req["id"].clone(), Sent::Method(method));
    }
    for line in text.lines() {
        let msg: Value = serde_json::from_str(line).expect("stdout is protocol");
        schemas().check_message(&msg, msg.get("id").and_then(|id| sent.get(id)));
    }
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
