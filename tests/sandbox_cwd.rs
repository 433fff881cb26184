//! A sandboxed process whose working directory turns out to be the store: an agent (or a lane
//! worker, from inside its own sandbox) swaps a directory it named as `cwd` for a symlink to
//! `.gaffer/` between gaffer's check of the path and the spawn's `chdir`. The sandbox enters
//! the working directory again by path once `.gaffer/` is covered, so the program finds the
//! empty read-only cover there, never the store. Needs the sandbox (Landlock, user namespaces).

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::gate::*;
use serde_json::json;

/// A workspace whose store holds one record.
fn workspace_with_a_store() -> (tempfile::TempDir, std::path::PathBuf) {
    let ws = tempfile::tempdir().unwrap();
    let store = ws.path().join(".gaffer");
    std::fs::create_dir_all(store.join("journal")).unwrap();
    std::fs::write(store.join("journal/000001.log"), "a record\n").unwrap();
    (ws, store)
}

/// Runs, sandboxed for `ws` and started in `cwd`, a program that writes, lists and reads its
/// working directory; `swap`, if given, exchanges two paths in the child after the spawn's
/// `chdir` and before the sandbox. Its stdout, or the spawn's error.
fn probe_from(ws: &Path, cwd: &Path, swap: Option<(CString, CString)>) -> std::io::Result<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args([
            "-c",
            "touch pwned 2>/dev/null && echo wrote; ls -A; cat journal/000001.log 2>/dev/null",
        ])
        .current_dir(cwd)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
        if let Some((a, b)) = swap {
            // SAFETY: renameat2 on two NUL-terminated paths prepared before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    );
                    Ok(())
                });
            }
        }
        let spec = gaffer::sandbox::Spec::new(ws).with_timeout_ms(Some(10_000));
        gaffer::sandbox::confine(&mut cmd, &spec, gaffer::sandbox::Setting::Required)
            .expect("this machine can sandbox");
        let out = cmd.output().await?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    })
}

fn assert_store_untouched(store: &Path, shown: &str) {
    assert!(
        !store.join("pwned").exists(),
        "the program wrote into the store: {shown}"
    );
    assert!(!shown.contains("wrote"), "{shown}");
    assert!(
        !shown.contains("journal") && !shown.contains("a record"),
        "the program read the store: {shown}"
    );
}

/// What the race leaves the spawn with, made certain: the directory entered before the
/// sandbox's namespaces is `.gaffer/` itself.
#[test]
fn a_program_started_in_the_store_directory_finds_only_the_cover() {
    let (ws, store) = workspace_with_a_store();
    let shown = probe_from(ws.path(), &store, None).unwrap();
    assert_store_untouched(&store, &shown);
}

/// A third turn of the same race: when the sandbox enters the directory again, `d` has become
/// a symlink to `/proc/self/cwd`, a magic link to wherever the spawn's `chdir` went, the store.
/// Made certain with a hook that runs in the child after that `chdir` and before the sandbox.
#[test]
fn a_working_directory_leading_back_through_proc_self_cwd_never_reaches_the_store() {
    let (ws, store) = workspace_with_a_store();
    std::os::unix::fs::symlink(".gaffer", ws.path().join("d")).unwrap();
    std::os::unix::fs::symlink("/proc/self/cwd", ws.path().join("m")).unwrap();
    let swap = (cpath(&ws.path().join("d")), cpath(&ws.path().join("m")));
    let out = probe_from(ws.path(), &ws.path().join("d"), Some(swap));
    assert_eq!(
        std::fs::read_link(ws.path().join("d")).unwrap(),
        Path::new("/proc/self/cwd"),
        "the hook swapped the links"
    );
    // Refusing to start is the expected outcome; a program that did start must not have
    // reached the store.
    assert_store_untouched(&store, &out.unwrap_or_default());
}

/// The race itself, as the agent plays it, through `command.run` on the real binary: a
/// thread swaps `d` and a symlink `l -> .gaffer` (renameat2 RENAME_EXCHANGE) while the agent
/// submits runs with `cwd: d`. Before the fix a few runs in 30 wrote into the store; this
/// cannot prove the race never lands, the test above does, but it plays the attack whole.
#[test]
fn a_cwd_swapped_for_a_symlink_to_the_store_never_lets_a_run_write_there() {
    let env = Env::new(Some(
        r#"
rules:
  - id: touch
    effect: allow
    clients: ["anonymous"]
    operations: ["command.run"]
    targets: [{kind: command, argv: ["touch", "pwned-by-command"]}]
"#,
    ));
    let root = env.root().to_path_buf();
    std::fs::create_dir(root.join("d")).unwrap();
    std::os::unix::fs::symlink(".gaffer", root.join("l")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = Arc::clone(&stop);
        let (d, l) = (cpath(&root.join("d")), cpath(&root.join("l")));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: renameat2 on two NUL-terminated paths.
                unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        d.as_ptr(),
                        libc::AT_FDCWD,
                        l.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
            }
        })
    };
    let mut s = env.start(&[]);
    s.call("initialize", json!({}));
    let until = Instant::now() + Duration::from_secs(40);
    let mut ran = 0;
    for i in 0..60 {
        if Instant::now() > until {
            break;
        }
        let r = s.request(
            "operations/submit",
            json!({"operation": "command.run", "target": {"argv": ["touch", "pwned-by-command"]},
                   "arguments": {"cwd": "d"}, "reason": "r", "idempotency_key": format!("k{i}")}),
        );
        // A look that found the symlink is refused at once; the others run.
        let Some(op) = r.get("result") else { continue };
        wait_state(
            &mut s,
            op["id"].as_str().unwrap(),
            &["succeeded", "failed", "denied"],
        );
        ran += 1;
        assert!(
            !root.join(".gaffer/pwned-by-command").exists(),
            "run {i} wrote into the store"
        );
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert!(ran > 0, "no run was submitted");
    assert!(!root.join(".gaffer/pwned-by-command").exists());
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}
