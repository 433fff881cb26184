//! Finding 3: a directory swapped for a symlink between resolve and execute. An attacker
//! thread exchanges a workspace directory with a symlink to an outside directory
//! (`renameat2(RENAME_EXCHANGE)`) in a tight loop for at least ten seconds, while allowed
//! `file.write` and `file.delete` operations on a path under that directory are submitted and
//! executed one after another. Nothing outside the workspace is ever written or deleted.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::gate::{Env, submit, wait_state};
use serde_json::json;

const RUN_FOR: Duration = Duration::from_secs(10);
const SENTINEL: &str = "outside, never to be touched\n";

fn c_path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

/// Swaps `a` and `b` until `stop`, counting the exchanges.
fn exchange_loop(a: &Path, b: &Path, stop: Arc<AtomicBool>, swaps: Arc<AtomicU64>) {
    let (a, b) = (c_path(a), c_path(b));
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: renameat2 on two NUL-terminated paths; no memory is shared with the kernel
        // beyond the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        assert_eq!(r, 0, "renameat2: {}", std::io::Error::last_os_error());
        swaps.fetch_add(1, Ordering::Relaxed);
    }
}

/// The outside directory holds exactly the sentinel, unchanged.
fn assert_outside_untouched(outside: &Path) {
    let names: Vec<String> = std::fs::read_dir(outside)
        .expect("read the outside dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        vec!["f.txt".to_string()],
        "written outside: {names:?}"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("f.txt")).expect("the sentinel"),
        SENTINEL,
        "the outside file was overwritten"
    );
}

#[test]
fn finding_3_a_symlink_exchange_race_writes_and_deletes_nothing_outside() {
    let env = Env::new(Some(
        "rules:\n  - id: race\n    effect: allow\n    operations: [\"file.write\", \"file.delete\"]\n    targets: [{kind: file, fields: {path: [\"dir/**\"]}}]\n",
    ));
    let outside = tempfile::tempdir().expect("outside dir");
    std::fs::write(outside.path().join("f.txt"), SENTINEL).expect("sentinel");
    let (dir, link) = (env.root().join("dir"), env.root().join("link"));
    std::fs::create_dir(&dir).expect("mkdir dir");
    std::os::unix::fs::symlink(outside.path(), &link).expect("symlink");

    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let attacker = {
        let (stop, swaps) = (stop.clone(), swaps.clone());
        std::thread::spawn(move || exchange_loop(&dir, &link, stop, swaps))
    };
    let mut agent = env.agent("racer");
    // Executed writes and deletes, refusals at submit, rounds.
    let (mut wrote, mut deleted, mut refused, mut n) = (0u32, 0u32, 0u32, 0u32);
    let started = Instant::now();
    while started.elapsed() < RUN_FOR || wrote == 0 || deleted == 0 {
        n += 1;
        let (op, args) = if n % 2 == 1 {
            ("file.write", json!({"content": format!("round {n}\n")}))
        } else {
            ("file.delete", json!({}))
        };
        let r = submit(
            &mut agent,
            op,
            json!({"path": "dir/f.txt"}),
            args,
            &format!("race-{n}"),
        );
        let Some(id) = r["result"]["id"].as_str() else {
            refused += 1; // refused at resolve: the symlink was in place
            continue;
        };
        let v = wait_state(&mut agent, id, &["succeeded", "failed"]);
        match (v["state"].as_str(), op) {
            (Some("succeeded"), "file.write") => wrote += 1,
            (Some("succeeded"), _) => deleted += 1,
            _ => {}
        }
        assert_outside_untouched(outside.path());
        assert!(
            n < 100_000,
            "{wrote} writes and {deleted} deletes executed in {n} rounds"
        );
    }
    stop.store(true, Ordering::Relaxed);
    attacker.join().expect("the attacker thread");
    assert_outside_untouched(outside.path());
    assert!(
        swaps.load(Ordering::Relaxed) > 0,
        "the attacker never swapped"
    );
    eprintln!(
        "{n} rounds: {wrote} writes and {deleted} deletes executed, {refused} refused at submit, {} swaps",
        swaps.load(Ordering::Relaxed)
    );
    assert!(agent.call("gaffer/status", json!({})).is_object());
}
