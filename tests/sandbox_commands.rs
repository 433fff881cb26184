//! `command.run` runs sandboxed and never outlives its timeout or its gaffer (finding 4's
//! child-lifetime half), played as an agent submitting operations.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::gate::{Env, submit, wait_state};
use serde_json::json;

const POLICY: &str = r#"
rules:
  - id: run
    effect: allow
    operations: ["command.run"]
"#;

fn env() -> Env {
    let env = Env::untrusted(Some(POLICY));
    std::fs::remove_file(env.root().join(".gaffer/providers.yaml")).unwrap();
    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "{out} {err}");
    env
}

/// A sleeping grandchild, known by its argv (`sleep 30.<tag>`): it says it started, then
/// ignores the shell's end.
fn grandchild(tag: &str) -> String {
    format!("sh -c 'echo started > grandchild.started; exec sleep 30.{tag}' & wait")
}

fn alive(pid: u32) -> bool {
    // A zombie is as good as gone: nothing runs.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// The pid, as this test's namespace numbers it, of the process running exactly `argv`. Found
/// from outside: inside, the sandbox's own `/proc` numbers only its own processes.
fn host_pid(argv: &[&str]) -> u32 {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            (std::fs::read(e.path().join("cmdline")).ok()? == want).then_some(pid)
        });
        if let Some(pid) = found {
            return pid;
        }
        assert!(Instant::now() < deadline, "no process runs {argv:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never written",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn gone_soon(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn a_timed_out_command_takes_its_whole_process_group_with_it() {
    let env = env();
    let mut s = env.agent("agent");
    // The grandchild ignores the shell's end; only a group kill reaches it.
    let tag = std::process::id().to_string();
    let script = grandchild(&tag);
    let r = submit(
        &mut s,
        "command.run",
        json!({"argv": ["sh", "-c", script]}),
        json!({"timeout_ms": 500}),
        "timeout-1",
    );
    let id = r["result"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string();
    wait_file(&env.root().join("grandchild.started"));
    let pid = host_pid(&["sleep", &format!("30.{tag}")]);
    let done = wait_state(&mut s, &id, &["failed", "succeeded"]);
    assert_eq!(done["state"], "failed", "{done}");
    assert!(gone_soon(pid), "grandchild {pid} outlived the timeout");
}

#[test]
fn a_command_and_its_grandchild_die_with_a_sigkilled_gaffer() {
    let env = env();
    let mut s = env.agent("agent");
    // The grandchild is not the process gaffer started: only the sandbox's PID namespace,
    // which ends with that process, takes it along.
    let tag = format!("{}1", std::process::id());
    let script = grandchild(&tag);
    let r = submit(
        &mut s,
        "command.run",
        json!({"argv": ["sh", "-c", script]}),
        json!({"timeout_ms": 60000}),
        "lifetime-1",
    );
    assert!(r.get("result").is_some(), "{r}");
    wait_file(&env.root().join("grandchild.started"));
    let child = host_pid(&["sh", "-c", &script]);
    let grandchild = host_pid(&["sleep", &format!("30.{tag}")]);
    assert!(alive(child) && alive(grandchild));
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    assert!(
        gone_soon(child),
        "command {child} outlived its SIGKILLed gaffer"
    );
    assert!(
        gone_soon(grandchild),
        "grandchild {grandchild} outlived the SIGKILLed gaffer"
    );
}

#[test]
fn a_command_cannot_read_the_operator_key_or_write_the_store() {
    let env = env();
    let mut s = env.agent("agent");
    let key = env.key_file.display().to_string();
    // Another program's unix socket where such sockets live (X11's directory here, which any
    // user may create): Landlock before ABI 9 does not govern connect(), so it is covered.
    let x11 = Path::new("/tmp/.X11-unix");
    let _ = std::fs::create_dir(x11);
    let sock = x11.join(format!("gaffer-e2e-{}", std::process::id()));
    let _ = std::fs::remove_file(&sock);
    let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("a unix listener");
    let connect = format!(
        "python3 -c \"import socket; socket.socket(socket.AF_UNIX).connect('{}')\"",
        sock.display()
    );
    for (i, (script, what)) in [
        (format!("cat '{key}'"), "the operator key"),
        ("G=.gaf\"\"fer; echo x > $G/pwn".to_string(), "the store"),
        ("echo hi > /dev/tcp/127.0.0.1/9".to_string(), "the network"),
        // The sandbox's init and keeper are forks of gaffer holding its environment and memory.
        (
            "read -r _ _ _ parent _ < /proc/self/stat; cat /proc/$parent/environ".to_string(),
            "gaffer's environment through the sandbox's init",
        ),
        (
            "read -r _ _ _ parent _ < /proc/self/stat; read -r _ _ _ keeper _ < /proc/$parent/stat; cat /proc/$keeper/environ".to_string(),
            "gaffer's environment through the sandbox's keeper",
        ),
        ("exec 3</dev/tty".to_string(), "a controlling terminal"),
        ("cat /dev/pts/0 </dev/null".to_string(), "another terminal"),
        (connect, "another program's unix socket"),
    ]
    .into_iter()
    .enumerate()
    {
        let r = submit(
            &mut s,
            "command.run",
            json!({"argv": ["bash", "-c", script]}),
            json!({}),
            &format!("reach-{i}"),
        );
        let id = r["result"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"))
            .to_string();
        let done = wait_state(&mut s, &id, &["failed", "succeeded"]);
        let code = done["result"]["exit_code"].as_i64();
        assert!(code.is_some_and(|c| c != 0), "{what} was reachable: {done}");
    }
    assert!(!env.root().join(".gaffer/pwn").exists());
    // And a command that stays inside works.
    let r = submit(
        &mut s,
        "command.run",
        json!({"argv": ["sh", "-c", "echo ok > inside.txt"]}),
        json!({}),
        "inside",
    );
    let id = r["result"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string();
    let done = wait_state(&mut s, &id, &["failed", "succeeded"]);
    assert_eq!(done["result"]["exit_code"], 0, "{done}");
}
