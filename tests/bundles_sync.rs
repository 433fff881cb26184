//! End-to-end tests of config bundles on the real binary: the digest test vector, idempotent
//! write-once sync, check, list, persistence across restarts, refusals, CLI and MCP tools.

mod common;

use std::time::Duration;

use common::{Server, Wire, journal_bytes, run_cli};
use serde_json::{Value, json};

const VECTOR_DIGEST: &str =
    "sha256:875b0088bffaed17b244cc52a75c22798dabce6f9302984c17d2d588fc91a826";

fn vector() -> Value {
    json!({
        "metadata": {"id": "bundle-1", "revision": "r1", "created_at": "2026-01-01T00:00:00Z",
                     "provenance": {"source": "test"}},
        "profiles": [{"selector": {"kind": "builtin", "value": "builtin:coder"},
                      "command": ["sh", "tests/scripts/echo.sh"]}],
        "declarations": [{"kind": "secret_ref", "name": "token", "reference": "env:DEMO_TOKEN"}]
    })
}

const VECTOR_YAML: &str = "\
metadata:
  id: bundle-1
  revision: r1
  created_at: '2026-01-01T00:00:00Z'
  provenance:
    source: test
declarations:
  - kind: secret_ref
    name: token
    reference: env:DEMO_TOKEN
profiles:
  - selector: {kind: builtin, value: 'builtin:coder'}
    command: [sh, tests/scripts/echo.sh]
    input_mode: stdin_text
";

fn start(ws: &std::path::Path) -> Server {
    Server::start(ws, Wire::Ndjson, &["--jsonl"])
}

#[test]
fn sync_computes_the_documented_digest_and_is_idempotent() {
    let ws = common::workspace();
    let mut s = start(ws.path());
    let r = s.call("bundles/sync", json!({"bundle": vector()}));
    assert_eq!(
        r["reference"],
        json!({"id": "bundle-1", "digest": VECTOR_DIGEST})
    );
    assert_eq!(r["created"], true);
    assert_eq!(r["summary"]["digest_algorithm"], "sha256");
    assert_eq!(r["summary"]["profile_count"], 1);
    assert_eq!(r["summary"]["declaration_count"], 1);

    // The same bundle as YAML text, with a client-stated digest: same identity, nothing written.
    let before = journal_bytes(ws.path());
    let yaml = VECTOR_YAML.replace(
        "  revision: r1",
        &format!("  revision: r1\n  digest: '{VECTOR_DIGEST}'"),
    );
    let again = s.call("bundles/sync", json!({"text": yaml}));
    assert_eq!(again["reference"], r["reference"]);
    assert_eq!(again["created"], false);
    assert_eq!(journal_bytes(ws.path()), before);

    // Same id, other content: refused, naming both digests.
    let mut other = vector();
    other["metadata"]["revision"] = json!("r2");
    let e = s.request("bundles/sync", json!({"bundle": other}));
    assert_eq!(e["error"]["data"]["code"], "bundle_digest_mismatch", "{e}");
    assert_eq!(e["error"]["data"]["expected_digest"], VECTOR_DIGEST);
    assert_eq!(journal_bytes(ws.path()), before);

    // A stated digest that does not match the content is refused too.
    let mut lying = vector();
    lying["metadata"]["id"] = json!("bundle-2");
    lying["metadata"]["digest"] = json!(VECTOR_DIGEST);
    let e = s.request("bundles/sync", json!({"bundle": lying}));
    assert_eq!(e["error"]["data"]["code"], "bundle_digest_mismatch", "{e}");
    assert_eq!(journal_bytes(ws.path()), before);
}

#[test]
fn check_and_list_survive_a_restart() {
    let ws = common::workspace();
    {
        let mut s = start(ws.path());
        s.call("bundles/sync", json!({"bundle": vector()}));
    }
    let mut s = start(ws.path());
    let list = s.call("bundles/list", json!({}));
    assert_eq!(list["bundles"].as_array().unwrap().len(), 1);
    assert_eq!(list["bundles"][0]["digest"], VECTOR_DIGEST);
    let ok = s.call(
        "bundles/check",
        json!({"id": "bundle-1", "digest": VECTOR_DIGEST}),
    );
    assert_eq!(ok["reference"]["digest"], VECTOR_DIGEST);
    let missing = s.request(
        "bundles/check",
        json!({"id": "nope", "digest": VECTOR_DIGEST}),
    );
    assert_eq!(missing["error"]["data"]["code"], "bundle_missing");
    assert_eq!(missing["error"]["code"], -32001);
    let wrong = s.request(
        "bundles/check",
        json!({"id": "bundle-1", "digest": format!("sha256:{}", "a".repeat(64))}),
    );
    assert_eq!(wrong["error"]["data"]["code"], "bundle_digest_mismatch");
    let bad = s.request("bundles/check", json!({"id": "bundle-1", "digest": "ABC"}));
    assert_eq!(bad["error"]["data"]["field"], "digest");
    // The stored body is the canonical encoding, addressed by the digest.
    let blob = ws
        .path()
        .join(".gaffer/blobs/sha256")
        .join(&VECTOR_DIGEST[7..9])
        .join(&VECTOR_DIGEST[7..]);
    assert!(blob.is_file(), "blob at {}", blob.display());
}

#[test]
fn invalid_bundles_are_refused_by_field_and_nothing_is_written() {
    let ws = common::workspace();
    let mut s = start(ws.path());
    s.call("bundles/sync", json!({"bundle": vector()}));
    let before = journal_bytes(ws.path());
    type Edit = fn(&mut Value);
    let cases: Vec<(&str, Edit)> = vec![
        ("bundle.metadata.id", |v| {
            v["metadata"]["id"] = json!("../x")
        }),
        ("bundle.metadata.provenance.source", |v| {
            v["metadata"]["provenance"]["source"] = json!("/home/me")
        }),
        ("bundle.metadata.created_at", |v| {
            v["metadata"]["created_at"] = json!("a\u{1b}b")
        }),
        ("bundle.profiles[0].command[0]", |v| {
            v["profiles"][0]["command"] = json!(["/bin/sh"])
        }),
        ("bundle.profiles[0].command[1]", |v| {
            v["profiles"][0]["command"] = json!(["sh", "~/.ssh/id"])
        }),
        ("bundle.profiles[0].label", |v| {
            v["profiles"][0]["label"] = json!("x.sock")
        }),
        ("bundle.profiles[0].selector.kind", |v| {
            v["profiles"][0]["selector"]["kind"] = json!("runtime_default")
        }),
        ("bundle.declarations[0].reference", |v| {
            v["declarations"][0]["reference"] = json!("ghp_plaintextsecret")
        }),
        ("bundle.declarations[0].kind", |v| {
            v["declarations"][0]["kind"] = json!("unsupported")
        }),
        ("bundle.metadata.session_path", |v| {
            v["metadata"]["session_path"] = json!("x")
        }),
    ];
    for (field, edit) in cases {
        let mut b = vector();
        edit(&mut b);
        let r = s.request("bundles/sync", json!({"bundle": b}));
        assert_eq!(r["error"]["code"], -32602, "{r}");
        assert_eq!(r["error"]["data"]["field"], field, "{r}");
        assert!(
            !r.to_string().contains("ghp_plaintextsecret"),
            "a refused secret is never echoed"
        );
    }
    let r = s.request("bundles/sync", json!({"text": "metadata: [unclosed"}));
    assert_eq!(r["error"]["data"]["field"], "text");
    let r = s.request("bundles/sync", json!({"bundle": vector(), "path": "/x"}));
    assert_eq!(r["error"]["data"]["field"], "path");
    assert_eq!(journal_bytes(ws.path()), before);
}

#[test]
fn cli_syncs_checks_and_lists() {
    let ws = common::workspace();
    let file = ws.path().join("bundle.yaml");
    std::fs::write(&file, VECTOR_YAML).unwrap();
    let (code, out, _) = run_cli(ws.path(), &["bundle", "sync", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["reference"]["digest"], VECTOR_DIGEST);
    let (code, out, _) = run_cli(ws.path(), &["bundle", "check", "bundle-1", VECTOR_DIGEST]);
    assert_eq!(code, 0, "{out}");
    let (code, out, _) = run_cli(ws.path(), &["bundle", "check", "bundle-9", VECTOR_DIGEST]);
    assert_eq!(code, 1);
    assert!(out.contains("bundle_missing"), "{out}");
    let (code, out, _) = run_cli(ws.path(), &["bundle", "list"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["bundles"][0]["id"], "bundle-1");
}

#[test]
fn mcp_offers_the_bundle_and_worker_tools() {
    let ws = common::workspace();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &["--mcp"]);
    s.call(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    );
    s.notify("notifications/initialized", json!({}));
    let tools = s.call("tools/list", json!({}));
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for t in [
        "sync_bundle",
        "create_worker",
        "send_worker_input",
        "get_worker",
        "list_workers",
    ] {
        assert!(names.contains(&t), "{t} missing from {names:?}");
    }
    let r = s.call(
        "tools/call",
        json!({"name": "sync_bundle", "arguments": {"bundle": vector()}}),
    );
    assert_ne!(r["isError"], true, "{r}");
    let text = r["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        text.contains(VECTOR_DIGEST) || r.to_string().contains(VECTOR_DIGEST),
        "{r}"
    );
    let r = s.call(
        "tools/call",
        json!({"name": "list_workers", "arguments": {}}),
    );
    assert_ne!(r["isError"], true, "{r}");
    let _ = s.notification("notifications/message", Duration::from_millis(10));
}
