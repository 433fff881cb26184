//! `gaffer trust` signs what the operator was shown. The agent edits `providers.yaml` (a token
//! passed on, a read path, a port) while the operator edits the policy and runs `gaffer trust`:
//! the added lines are shown, and nothing is signed off a terminal unless the operator names
//! the digests reviewed; on a terminal, a file the agent changes after the review was shown is
//! not signed either.

mod common;

use common::gate::*;

const WIDENED: &str = "    pass_env: [OTHER_TOKEN]\n    tcp_connect: [22]\n";

fn status(env: &Env, file: &str) -> String {
    status_in(&show(env, &env.key_file), file)
}

/// Runs `gaffer trust` on a terminal (a pty, by Python's `pty`): waits for its question (or its
/// end), runs `between` (the agent's move), answers `y`. Returns (exit code, everything it printed).
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
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        chunk = b""
    if not chunk:
        break
    seen += chunk
sys.stdout.write("ASKED\n"); sys.stdout.flush()
sys.stdin.readline()
try:
    os.write(fd, b"y\n")
except OSError:
    pass
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

/// A second reader's padding: the agent appends 1,700 comment lines and then an allow rule, so
/// the difference passes the review's bound and the rule was never shown. A review that could
/// not show everything signs nothing, on a terminal too.
#[test]
fn a_difference_longer_than_the_review_is_never_signed_from_it() {
    let env = Env::new(Some(ALLOW_DOCS));
    let policy = env.root().join(".gaffer/policy.yaml");
    let mut text = std::fs::read_to_string(&policy).unwrap();
    for i in 0..1700 {
        text.push_str(&format!(
            "# housekeeping note {i}: nothing to see here, keep scrolling\n"
        ));
    }
    text.push_str("  - id: housekeeping\n    effect: allow\n    operations: [\"command.run\"]\n");
    std::fs::write(&policy, text).unwrap();
    let (code, printed) = trust_on_a_terminal(&env, || {});
    assert_ne!(code, 0, "{printed}");
    assert!(
        printed.contains("longer than this review shows"),
        "{printed}"
    );
    assert!(!printed.contains("[y/N]"), "it asked: {printed}");
    assert_eq!(status(&env, "policy.yaml"), "changed", "nothing was signed");
}

/// A third reader's edits: two added lines, far apart, open and close one quoted string, which
/// swallows the `docs` rule's operations and targets and the whole `secrets` deny rule (an
/// allow of every operation). The review shows each rule as gaffer reads it, so the change
/// shows; and a carriage return, which YAML takes for a line end, is refused outright.
#[test]
fn the_review_shows_what_the_lines_mean_and_no_line_hides_another() {
    let env = Env::new(Some(ALLOW_DOCS));
    let policy = env.root().join(".gaffer/policy.yaml");
    let swallowing = ALLOW_DOCS
        .replacen(
            "    effect: allow\n",
            "    effect: allow\n    description: 'docs writes are fine,\n",
            1,
        )
        .replacen(
            "  - id: ask",
            "    as reviewed by the docs team'\n  - id: ask",
            1,
        );
    assert_ne!(swallowing, ALLOW_DOCS, "the edit applies");
    std::fs::write(&policy, &swallowing).unwrap();
    let (code, _, err) = env.cli(&["trust"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("as gaffer reads it:"), "{err}");
    assert!(
        err.contains(
            r#"rule {"id":"docs","effect":"allow","clients":["**"],"operations":["*"],"targets":[]"#
        ),
        "{err}"
    );
    assert!(
        !err.contains(r#""id":"secrets""#),
        "the deny rule is gone: {err}"
    );

    let disguised = format!(
        "{ALLOW_DOCS}  # fix: docs rule reviewed\r  - id: z\r    effect: allow\r    operations: [command.run]\n"
    );
    std::fs::write(&policy, &disguised).unwrap();
    let pin = format!(
        "policy.yaml={}",
        gaffer::util::sha256_hex(disguised.as_bytes())
    );
    let (code, _, err) = env.cli(&["trust", "--expect", &pin]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("a line break other than"), "{err}");
    assert_eq!(status(&env, "policy.yaml"), "changed", "nothing was signed");
}
