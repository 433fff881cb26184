//! The hash-chained journal on the real binary: `gaffer/status` reports the workspace id and
//! the chain, `gaffer store log` shows the links, and a record forged with valid framing and
//! checksum in the middle of the journal is reported by `gaffer store verify` (non-zero exit,
//! naming the seq) and by a server that keeps serving every record.

mod common;

use std::fs;
use std::path::Path;

use common::{Server, Wire, forge_frame, frames, run_cli, workspace};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

fn bundle(i: usize) -> Value {
    json!({
        "metadata": {"id": format!("chain-{i}"), "revision": "r1",
                     "created_at": "2026-01-01T00:00:00Z", "provenance": {"source": "test"}},
        "profiles": [{"selector": {"kind": "builtin", "value": "builtin:coder"},
                      "command": ["sh", "-c", "cat"]}]
    })
}

fn log_lines(ws: &Path) -> Vec<Value> {
    let (code, out, err) = run_cli(ws, &["store", "log"]);
    assert_eq!(code, 0, "store log: {err}");
    out.lines()
        .map(|l| serde_json::from_str(l).expect("log line is JSON"))
        .collect()
}

#[test]
fn status_log_and_verify_report_the_chain_and_a_forged_middle_record() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &[]);
    let st = s.call("gaffer/status", json!({}));
    assert_eq!(st["workspace_id"], Value::Null, "no store yet: {st}");
    assert_eq!(
        st["store"]["chain"]["head"],
        json!({"seq": 0, "hash": "0".repeat(64)})
    );
    for i in 0..4 {
        s.call("bundles/sync", json!({"bundle": bundle(i)}));
    }
    let st = s.call("gaffer/status", json!({}));
    let id = st["workspace_id"]
        .as_str()
        .expect("workspace id")
        .to_string();
    assert!(id.starts_with("ws_"), "{id}");
    let chain = &st["store"]["chain"];
    assert_eq!(chain["broken_at"], Value::Null, "{st}");
    assert_eq!(chain["head"]["seq"], st["store"]["seq"]);
    assert_eq!(s.finish(), 0);

    // The log shows every link: record 1 declares the id and chains from genesis.
    let lines = log_lines(ws.path());
    assert_eq!(lines.len(), 5, "store.created + four syncs: {lines:?}");
    assert_eq!(lines[0]["kind"], "store.created");
    assert_eq!(lines[0]["payload"]["workspace_id"], json!(id));
    assert_eq!(lines[0]["prev"], json!("0".repeat(64)));
    for pair in lines.windows(2) {
        assert_eq!(pair[1]["prev"], pair[0]["hash"], "{pair:?}");
    }
    assert_eq!(lines[4]["hash"], chain["head"]["hash"]);
    let (code, out, err) = run_cli(ws.path(), &["store", "verify"]);
    assert_eq!(code, 0, "{out}{err}");
    let report: Value = serde_json::from_str(&out).expect("verify JSON");
    assert_eq!(report["chain"]["verified_to"], 5);
    assert_eq!(report["chain"]["workspace_id"], json!(id));

    // Replace record 3 (a batch of one) with a forged record linked to record 2, framed and
    // checksummed correctly. Record 4 no longer chains: the break is at seq 4.
    let seg = ws.path().join(".gaffer/journal/000001.log");
    let bytes = fs::read(&seg).unwrap();
    let at = frames(&bytes);
    let (off3, len3) = at[2];
    let prev = lines[1]["hash"].as_str().unwrap();
    let body = format!(
        r#"{{"seq":3,"prev":"{prev}","time_ms":1,"kind":"gaffer.note","payload":{{"forged":true}}}}"#
    );
    let mut tampered = bytes[..off3].to_vec();
    tampered.extend(forge_frame(body.as_bytes()));
    tampered.extend_from_slice(&bytes[off3 + len3..]);
    fs::write(&seg, &tampered).unwrap();
    let forged_hash = hex(&Sha256::digest(body.as_bytes()));
    assert_eq!(log_lines(ws.path())[2]["hash"], json!(forged_hash));

    let (code, out, err) = run_cli(ws.path(), &["store", "verify"]);
    assert_ne!(code, 0, "a broken chain fails verify: {out}");
    let report: Value = serde_json::from_str(&out).expect("verify JSON");
    let broken = &report["chain"]["broken_at"];
    assert_eq!(broken["seq"], 4, "{report}");
    assert_eq!(broken["offset"], json!(off3 + body.len() + 8), "{report}");
    assert_eq!(report["chain"]["verified_to"], 3);
    assert!(err.contains("hash chain broken at seq 4"), "{err}");

    // The server still opens, keeps every record and reports the break.
    let mut s = Server::start(ws.path(), Wire::Ndjson, &[]);
    let st = s.call("gaffer/status", json!({}));
    assert_eq!(st["store"]["seq"], 5, "{st}");
    assert_eq!(st["store"]["chain"]["broken_at"]["seq"], 4, "{st}");
    assert_eq!(st["workspace_id"], json!(id));
    s.call("bundles/sync", json!({"bundle": bundle(9)}));
    assert_eq!(s.call("gaffer/status", json!({}))["store"]["seq"], 6);
    assert_eq!(s.finish(), 0);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
