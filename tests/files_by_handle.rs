//! Finding 2: special and huge targets get clear errors and never stall the server.

mod common;

use std::time::{Duration, Instant};

use common::gate::{Env, submit};
use serde_json::json;

#[test]
fn fifo_and_sparse_targets_get_clear_errors_while_other_requests_are_answered() {
    let env = Env::untrusted(Some(
        "rules:\n  - id: w\n    effect: allow\n    operations: [\"file.*\"]\n",
    ));
    std::fs::remove_file(env.root().join(".gaffer/providers.yaml")).unwrap();
    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "{out} {err}");
    let fifo = std::ffi::CString::new(env.root().join("pipe").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let big = std::fs::File::create(env.root().join("big.bin")).unwrap();
    big.set_len(1 << 30).unwrap();
    let mut s = env.agent("agent");
    let t = Instant::now();
    let r = submit(
        &mut s,
        "file.write",
        json!({"path": "pipe"}),
        json!({"content": "x"}),
        "fifo",
    );
    assert_eq!(r["error"]["data"]["field"], "target.path", "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("FIFO"),
        "{r}"
    );
    let r = submit(
        &mut s,
        "file.delete",
        json!({"path": "big.bin"}),
        json!({}),
        "sparse",
    );
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("more than the"), "{r}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    // The server keeps answering, and an ordinary write still works.
    assert!(s.call("gaffer/status", json!({})).is_object());
    let r = submit(
        &mut s,
        "file.write",
        json!({"path": "docs/ok.md"}),
        json!({"content": "ok\n"}),
        "ok",
    );
    assert!(r.get("result").is_some(), "{r}");
}
