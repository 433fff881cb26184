use super::*;
use crate::bundles::ProfileSelector;
use std::path::Path;

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts");
    std::fs::create_dir(dir.path().join("scripts")).unwrap();
    for entry in std::fs::read_dir(scripts).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(
            entry.path(),
            dir.path().join("scripts").join(entry.file_name()),
        )
        .unwrap();
    }
    std::fs::write(dir.path().join("gaffer-test-marker"), "x").unwrap();
    dir
}

fn profile(script: &str, mode: InputMode, timeout_ms: Option<u64>) -> Profile {
    Profile {
        selector: ProfileSelector::Named("p".into()),
        label: None,
        command: vec!["sh".into(), format!("scripts/{script}")],
        input_mode: mode,
        timeout_ms,
        toolsets: vec![],
        model: None,
    }
}

/// Collects events until the worker ends; returns (stdout, stderr, status, reason).
async fn run_to_end(
    rx: &mut mpsc::UnboundedReceiver<ExecEvent>,
) -> (String, String, WorkerStatus, String) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("worker ended in time");
        match ev.expect("event channel open") {
            ExecEvent::Output {
                stream: Stream::Stderr,
                bytes,
                ..
            } => err.extend(bytes),
            ExecEvent::Output { bytes, .. } => out.extend(bytes),
            ExecEvent::Ended { status, reason, .. } => {
                return (
                    String::from_utf8(out).unwrap(),
                    String::from_utf8(err).unwrap(),
                    status,
                    reason,
                );
            }
        }
    }
}

fn spawn(
    backend: &ProcessBackend,
    ws: &Path,
    id: &str,
    p: &Profile,
    decls: &[Declaration],
    initial: Option<&[Segment]>,
) -> (Result<Spawned, String>, mpsc::UnboundedReceiver<ExecEvent>) {
    let (tx, rx) = mpsc::unbounded_channel();
    // The runtime reads secret values before spawning; do the same here.
    let secrets = match crate::secrets::resolve(decls) {
        Ok(s) => s,
        Err(e) => return (Err(e.to_string()), rx),
    };
    let req = SpawnRequest {
        worker_id: id,
        profile: p,
        declarations: decls,
        initial_input: initial,
        workspace_root: ws,
        secrets: &secrets,
        channel: None,
        env: &[],
        sandbox: Default::default(),
    };
    (backend.spawn(req, tx), rx)
}

fn text(s: &str) -> Vec<Segment> {
    vec![Segment::Text { content: s.into() }]
}

#[tokio::test]
async fn stdin_lines_reach_the_process_and_output_streams_back() {
    let ws = workspace();
    let b = ProcessBackend::new();
    let p = profile("echo_lines.sh", InputMode::StdinText, None);
    let (spawned, mut rx) = spawn(&b, ws.path(), "w1", &p, &[], None);
    let spawned = spawned.unwrap();
    assert_eq!(spawned.run_state, RunState::Idle);
    assert!(spawned.input_capable);
    assert_eq!(b.input("w1", &text("hello")).outcome, Outcome::Accepted);
    assert_eq!(b.input("w1", &text("quit")).outcome, Outcome::Accepted);
    let (out, _, status, reason) = run_to_end(&mut rx).await;
    assert_eq!(out, "ready\necho: hello\necho: quit\n");
    assert_eq!(status, WorkerStatus::Stopped);
    assert_eq!(reason, "exited with status 0");
    assert_eq!(b.input("w1", &text("late")).outcome, Outcome::Rejected);
}

#[tokio::test]
async fn jsonl_mode_writes_one_json_object_per_input() {
    let ws = workspace();
    let b = ProcessBackend::new();
    let p = profile("jsonl_echo.sh", InputMode::StdinJsonl, None);
    let (spawned, mut rx) = spawn(&b, ws.path(), "w1", &p, &[], None);
    spawned.unwrap();
    let segs = vec![
        Segment::Text {
            content: "a \"q\"".into(),
        },
        Segment::FileRef {
            path: "src/x.rs".into(),
        },
    ];
    assert_eq!(b.input("w1", &segs).outcome, Outcome::Accepted);
    // Stop only once the echo came back, so the process has consumed the input.
    let mut out = Vec::new();
    while !out.ends_with(b"\n") {
        match tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .unwrap()
            .unwrap()
        {
            ExecEvent::Output { bytes, .. } => out.extend(bytes),
            other => panic!("ended early: {other:?}"),
        }
    }
    assert_eq!(b.stop("w1", "done").outcome, Outcome::Accepted);
    let (rest, _, status, reason) = run_to_end(&mut rx).await;
    assert!(rest.is_empty());
    let out = String::from_utf8(out).unwrap();
    let line = out.lines().next().unwrap().strip_prefix("json: ").unwrap();
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["segments"][1]["kind"], "file_ref");
    assert_eq!(v["text"], "a \"q\"\n@src/x.rs");
    assert_eq!(status, WorkerStatus::Stopped);
    assert_eq!(reason, "stopped on request: done");
}

#[tokio::test]
async fn argument_mode_passes_the_initial_input_as_one_argument() {
    let ws = workspace();
    let b = ProcessBackend::new();
    let p = profile("args.sh", InputMode::Argument, None);
    let (spawned, mut rx) = spawn(&b, ws.path(), "w1", &p, &[], Some(&text("two words")));
    let spawned = spawned.unwrap();
    assert!(!spawned.input_capable);
    let (out, _, status, _) = run_to_end(&mut rx).await;
    assert_eq!(out, "arg: two words\n");
    assert_eq!(status, WorkerStatus::Stopped);
}

#[tokio::test]
async fn environment_is_cleared_except_basics_and_declared_secrets() {
    let ws = workspace();
    // SAFETY: tests in this module do not read these variables concurrently.
    unsafe {
        std::env::set_var("DEMO_TOKEN", "t0k3n");
        std::env::set_var("GAFFER_TEST_UNDECLARED", "leak");
    }
    let b = ProcessBackend::new();
    let p = profile("env_report.sh", InputMode::StdinText, None);
    let decl = Declaration {
        kind: DeclarationKind::SecretRef,
        name: "demo".into(),
        reference: "env:DEMO_TOKEN".into(),
    };
    let (spawned, mut rx) = spawn(&b, ws.path(), "w1", &p, std::slice::from_ref(&decl), None);
    spawned.unwrap();
    let (out, _, _, _) = run_to_end(&mut rx).await;
    assert!(out.contains("DEMO_TOKEN=t0k3n"), "{out}");
    assert!(!out.contains("GAFFER_TEST_UNDECLARED"), "{out}");
    assert!(out.contains("GAFFER_WORKER_ID"), "{out}");
    assert!(out.contains("HOME=unset"), "{out}");
    assert!(
        out.contains("pwd-has-marker=yes"),
        "runs in the workspace root: {out}"
    );

    // Without a declaration the variable is not passed.
    let (spawned, mut rx) = spawn(&b, ws.path(), "w2", &p, &[], None);
    spawned.unwrap();
    let (out, _, _, _) = run_to_end(&mut rx).await;
    assert!(out.contains("DEMO_TOKEN=unset"), "{out}");

    // A declared variable that is not set fails the spawn, naming the variable only.
    let missing = Declaration {
        kind: DeclarationKind::SecretRef,
        name: "m".into(),
        reference: "env:GAFFER_TEST_MISSING_VAR".into(),
    };
    let (spawned, _rx) = spawn(&b, ws.path(), "w3", &p, &[missing], None);
    assert!(spawned.unwrap_err().contains("GAFFER_TEST_MISSING_VAR"));
}

#[tokio::test]
async fn timeout_kills_the_process_group_and_fails_the_worker() {
    let ws = workspace();
    let b = ProcessBackend::new();
    let p = profile("sleeper.sh", InputMode::StdinText, Some(300));
    let (spawned, mut rx) = spawn(&b, ws.path(), "w1", &p, &[], None);
    let pid = spawned.unwrap().child_pid.unwrap();
    let (out, _, status, reason) = run_to_end(&mut rx).await;
    assert_eq!(out, "sleeping\n");
    assert_eq!(status, WorkerStatus::Failed);
    assert_eq!(reason, "timed out after 300 ms");
    assert!(!procinfo::is_alive(pid, None), "the process is gone");
}

#[tokio::test]
async fn nonzero_exit_fails_with_stderr_captured() {
    let ws = workspace();
    let b = ProcessBackend::new();
    let p = profile("stderr_fail.sh", InputMode::StdinText, None);
    let (spawned, mut rx) = spawn(&b, ws.path(), "w1", &p, &[], None);
    spawned.unwrap();
    let (_, err, status, reason) = run_to_end(&mut rx).await;
    assert_eq!(err, "something went wrong\n");
    assert_eq!(status, WorkerStatus::Failed);
    assert_eq!(reason, "exited with status 3");
}

#[tokio::test]
async fn a_missing_program_is_a_spawn_error_without_paths() {
    let ws = workspace();
    let b = ProcessBackend::new();
    let mut p = profile("x", InputMode::StdinText, None);
    p.command = vec!["gaffer-no-such-program-xyz".into()];
    let (spawned, _rx) = spawn(&b, ws.path(), "w1", &p, &[], None);
    let err = spawned.unwrap_err();
    assert!(err.contains("program not found"), "{err}");
    assert!(!err.contains(ws.path().to_str().unwrap()));
}

#[test]
fn backend_refuses_what_it_cannot_honour() {
    let b = ProcessBackend::new();
    let mut p = profile("x", InputMode::StdinText, None);
    let env = Declaration {
        kind: DeclarationKind::SecretRef,
        name: "a".into(),
        reference: "env:A".into(),
    };
    assert!(b.can_run(&p, std::slice::from_ref(&env)).is_ok());
    let vault = Declaration {
        kind: DeclarationKind::SecretRef,
        name: "v".into(),
        reference: "vault:x".into(),
    };
    assert!(b.can_run(&p, &[vault]).is_err());
    // The sandbox enforces network policies; shell policies it cannot, so they are refused.
    let net = Declaration {
        kind: DeclarationKind::NetworkPolicy,
        name: "n".into(),
        reference: "network:none".into(),
    };
    assert!(b.can_run(&p, &[net]).is_ok());
    let shell = Declaration {
        kind: DeclarationKind::ShellPolicy,
        name: "s".into(),
        reference: "shell:strict".into(),
    };
    assert!(
        b.can_run(&p, &[shell])
            .unwrap_err()
            .contains("shell_policy")
    );
    p.command.clear();
    assert!(b.can_run(&p, &[]).is_err());
    assert_eq!(b.restore("w").outcome, Outcome::Unsupported);
    assert_eq!(b.input("nope", &text("x")).outcome, Outcome::Rejected);
    assert_eq!(b.stop("nope", "x").outcome, Outcome::Rejected);
}

#[test]
fn rendering_follows_the_input_mode() {
    let segs = text("hi");
    assert_eq!(render_input(InputMode::StdinText, &segs).unwrap(), b"hi\n");
    assert_eq!(
        render_input(InputMode::StdinText, &text("hi\n")).unwrap(),
        b"hi\n"
    );
    assert!(render_input(InputMode::Argument, &segs).is_none());
    let line = render_input(InputMode::StdinJsonl, &text("a\nb")).unwrap();
    assert_eq!(
        line.iter().filter(|b| **b == b'\n').count(),
        1,
        "one line per input"
    );
}

#[tokio::test]
async fn a_workspace_relative_program_runs_from_the_workspace_root() {
    let ws = workspace();
    let b = ProcessBackend::new();
    let mut p = profile("args.sh", InputMode::Argument, None);
    p.command = vec!["scripts/args.sh".into(), "fixed".into()];
    let (spawned, mut rx) = spawn(&b, ws.path(), "w1", &p, &[], Some(&text("given")));
    spawned.unwrap();
    let (out, _, status, _) = run_to_end(&mut rx).await;
    assert_eq!(out, "arg: fixed\narg: given\n");
    assert_eq!(status, WorkerStatus::Stopped);
}

#[test]
fn a_workers_path_keeps_only_absolute_entries() {
    let p = super::absolute_path_entries(std::ffi::OsStr::new(":/usr/bin:.:bin:/bin::./x"));
    assert_eq!(p, std::ffi::OsString::from("/usr/bin:/bin"));
    for nothing_absolute in ["", ":", ".:bin"] {
        assert_eq!(
            super::absolute_path_entries(std::ffi::OsStr::new(nothing_absolute)),
            std::ffi::OsString::from("/usr/local/bin:/usr/bin:/bin")
        );
    }
}
