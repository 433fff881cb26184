//! `gaffer trust` signs what the operator was shown. The agent edits `providers.yaml` (a token
//! passed on, a read path, a port) while the operator edits the policy and runs `gaffer trust`:
//! the added lines are shown, and nothing is signed off a terminal unless the operator names
//! the digests reviewed; on a terminal, a file the agent changes after the review was shown is
//! not signed either.

mod common;

use common::gate::*;
use serde_json::Value;

const WIDENED: &str = "    pass_env: [OTHER_TOKEN]\n    tcp_connect: [22]\n";

fn status(env: &Env, file: &str) -> String {
    let (code, out, err) = env.cli(&["trust", "--show"]);
    assert_eq!(code, 0, "{out} {err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    v["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["file"] == file)
        .map(|f| f["status"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

/// Runs `gaffer trust` on a terminal (a pty, by Python's `pty`): waits for its question, runs
/// `between` (the agent's move), answers `y`. Returns (exit code, everything it printed).
fn trust_on_a_terminal(env: &Env, between: impl FnOnce()) -> (i32, String) {
    const DRIVER: &str = r#"
import os, pty, sys
bin, ws, key = sys.argv[1:4]
pid, fd = pty.fork()
if pid == 0:
    os.environ["GAFFER_OPERATOR_KEY_FILE"] = key
    os.execv(bin, [bin, "--workspace", ws, "trust"])
seen = b""
while b"[y/N]" not in seen:
    chunk = os.read(fd, 4096)
    if not chunk:
        break
    seen += chunk
sys.stdout.write("ASKED\n"); sys.stdout.flush()
sys.stdin.readline()
os.write(fd, b"y\n")
while True:
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        break
    if not chunk:
        break
    seen += chunk
_, st = os.waitpid(pid, 0)
sys.stdout.write(seen.decode("utf-8", "replace"))
sys.stdout.write("\nEXIT %d\n" % os.waitstatus_to_exitcode(st))
"#;
    use std::io::{BufRead, BufReader, Read, Write};
    let mut child = std::process::Command::new("python3")
        .args(["-c", DRIVER, common::BIN])
        .arg(env.root())
        .arg(&env.key_file)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ASKED");
    between();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    child.wait().unwrap();
    let code = rest
        .rsplit("EXIT ")
        .next()
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or(-1);
    (code, rest)
}

#[test]
fn off_a_terminal_the_agents_added_lines_are_shown_and_nothing_is_signed() {
    let env = Env::new(Some(ALLOW_DOCS));
    let providers = env.root().join(".gaffer/providers.yaml");
    let mut text = std::fs::read_to_string(&providers).unwrap();
    text.push_str(WIDENED);
    std::fs::write(&providers, &text).unwrap();
    let before = status(&env, "providers.yaml");
    assert_eq!(before, "changed");
    let (code, out, err) = env.cli(&["trust"]);
    assert_eq!(code, 2, "{out} {err}");
    assert!(err.contains("+    pass_env: [OTHER_TOKEN]"), "{err}");
    assert!(err.contains("+    tcp_connect: [22]"), "{err}");
    assert!(err.contains("policy.yaml sha256"), "{err}");
    assert!(err.contains("(already trusted: unchanged)"), "{err}");
    assert!(err.contains("nothing signed"), "{err}");
    assert_eq!(
        status(&env, "providers.yaml"),
        "changed",
        "nothing was signed"
    );
}

#[test]
fn on_a_terminal_a_file_changed_after_it_was_shown_is_not_signed() {
    let env = Env::untrusted(Some(ALLOW_DOCS));
    let providers = env.root().join(".gaffer/providers.yaml");
    let (code, printed) = trust_on_a_terminal(&env, || {
        let mut text = std::fs::read_to_string(&providers).unwrap();
        text.push_str(WIDENED);
        std::fs::write(&providers, text).unwrap();
    });
    assert_ne!(code, 0, "{printed}");
    assert!(printed.contains("not the expected"), "{printed}");
    assert_eq!(status(&env, "providers.yaml"), "never_trusted");
    assert_eq!(status(&env, "policy.yaml"), "never_trusted");
    // The control: confirmed as shown, both files are signed.
    let (code, printed) = trust_on_a_terminal(&env, || {});
    assert_eq!(code, 0, "{printed}");
    assert!(printed.contains("(nothing trusted)"), "{printed}");
    assert_eq!(status(&env, "providers.yaml"), "trusted");
    assert_eq!(status(&env, "policy.yaml"), "trusted");
}
