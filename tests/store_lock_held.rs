//! Something holds the store's lock (`.gaffer/lock`) and does not let go: every writer waits,
//! the operator's decisions included, and nothing can take the lock from it. gaffer says who:
//! a writer waiting longer than a moment logs the holder's pid and program, `gaffer doctor`
//! names it, and the write goes through once the lock is let go. Played by the test process
//! holding the lock as an agent outside gaffer's sandbox would.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::forge::{anchor_outside_the_workspace, writer_lock};
use common::gate::*;
use serde_json::Value;

/// `gaffer op submit` of an allowed write, as client `agent-1`.
fn write(env: &Env, token: &str, path: &str, content: &str) -> Command {
    let mut c = Command::new(common::BIN);
    c.arg("--workspace")
        .arg(env.root())
        .args([
            "op",
            "submit",
            "file.write",
            "--reason",
            "r",
            "--wait",
            "--target",
        ])
        .arg(format!(r#"{{"path": "{path}"}}"#))
        .arg("--arguments")
        .arg(format!(r#"{{"content": "{content}"}}"#))
        .env("GAFFER_OPERATOR_KEY_FILE", &env.key_file)
        .env("GAFFER_CLIENT_TOKEN", token);
    c
}

fn lock_check(env: &Env) -> Value {
    let (_, out, err) = env.cli(&["doctor"]);
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}{err}"));
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "store lock")
        .unwrap_or_else(|| panic!("no store lock check: {report}"))
        .clone()
}

#[test]
fn a_writer_waiting_for_a_held_lock_names_the_holder_and_doctor_does_too() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let token = env.token("agent-1");
    // A first write, so the store and its lock file exist.
    let first = write(&env, &token, "docs/a.txt", "a").output().unwrap();
    assert!(first.status.success(), "{first:?}");
    assert_eq!(lock_check(&env)["ok"], true);

    let held = writer_lock(env.root());
    let me = format!("pid {}", std::process::id());
    let lock = lock_check(&env);
    assert_eq!(lock["ok"], false, "{lock}");
    assert!(lock["detail"].as_str().unwrap().contains(&me), "{lock}");

    let mut child = write(&env, &token, "docs/b.txt", "b")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let said = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    // The writer waits (and says who it waits for); the write does not happen meanwhile.
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the write did not wait for the lock"
    );
    assert!(!env.root().join("docs/b.txt").exists());
    drop(held);
    let code = common::wait_exit(&mut child, Duration::from_secs(20));
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let err = said.join().unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.contains("waiting for the store's lock") && err.contains(&me),
        "the waiting writer did not name the holder: {err}"
    );
    assert_eq!(
        std::fs::read_to_string(env.root().join("docs/b.txt")).unwrap(),
        "b"
    );
    assert_eq!(lock_check(&env)["ok"], true);
}
