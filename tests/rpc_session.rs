//! End-to-end: the real binary driven over its stdio in every framing and profile.

mod common;

use std::time::Duration;

use common::{Server, Wire, workspace};
use serde_json::{Value, json};

fn code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error: {v}"))
}

#[test]
fn ndjson_scripted_session_without_handshake() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &[]);
    let st = s.call("gaffer/status", json!({}));
    assert_eq!(st["profile"], "raw");
    assert_eq!(st["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        st["store"]["exists"], false,
        "reading never creates .gaffer"
    );
    let canon = ws.path().canonicalize().expect("canonical");
    assert_eq!(st["workspace"], canon.display().to_string());
    assert!(!ws.path().join(".gaffer").exists());
    // String ids are echoed as strings.
    s.send(&json!({"jsonrpc": "2.0", "id": "abc", "method": "gaffer/status"}));
    let r = s
        .wait_for(Duration::from_secs(10), |v| v["id"] == "abc")
        .expect("reply");
    assert!(r["result"]["pid"].is_u64());
    assert_eq!(s.finish(), 0);
}

#[test]
fn lsp_session_initialize_shutdown_exit() {
    let ws = workspace();
    let other = workspace();
    // No --workspace: the LSP rootUri chooses it (the process itself runs in another dir).
    let mut cmd_ws = Server::start_in(ws.path(), Wire::Lsp);
    let uri = format!(
        "file://{}",
        other.path().canonicalize().expect("canon").display()
    );
    let early = cmd_ws.request("gaffer/status", json!({}));
    assert_eq!(
        code(&early),
        -32002,
        "requests before initialize are refused"
    );
    let init = cmd_ws.call(
        "initialize",
        json!({"processId": null, "rootUri": uri, "capabilities": {}, "clientInfo": {"name": "test-editor"}}),
    );
    assert_eq!(init["serverInfo"]["name"], "gaffer");
    let methods = init["capabilities"]["experimental"]["gaffer"]["methods"]
        .as_array()
        .expect("method list");
    assert!(methods.contains(&json!("gaffer/status")));
    cmd_ws.notify("initialized", json!({}));
    let st = cmd_ws.call("gaffer/status", json!({}));
    assert_eq!(st["profile"], "lsp");
    // A name the client gives itself is no identity: without a credential it is anonymous.
    assert_eq!(st["client"], "anonymous");
    assert_eq!(
        st["workspace"],
        other
            .path()
            .canonicalize()
            .expect("canon")
            .display()
            .to_string()
    );
    assert_eq!(cmd_ws.call("shutdown", Value::Null), Value::Null);
    let after = cmd_ws.request("gaffer/status", json!({}));
    assert_eq!(code(&after), -32600, "requests after shutdown are refused");
    cmd_ws.notify("exit", Value::Null);
    assert_eq!(
        common::wait_exit(&mut cmd_ws.child, Duration::from_secs(10)),
        0
    );

    // exit without shutdown: exit code 1.
    let mut s = Server::start(ws.path(), Wire::Lsp, &[]);
    s.call(
        "initialize",
        json!({"processId": null, "rootUri": null, "capabilities": {}}),
    );
    s.notify("exit", Value::Null);
    assert_eq!(common::wait_exit(&mut s.child, Duration::from_secs(10)), 1);
}

#[test]
fn mcp_handshake_tools_and_version_echo() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &[]);
    let init = s.call(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "agent", "version": "1"}}),
    );
    assert_eq!(init["protocolVersion"], "2025-06-18");
    assert_eq!(init["capabilities"]["tools"]["listChanged"], false);
    s.notify("notifications/initialized", json!({}));
    assert_eq!(s.call("ping", json!({})), json!({}));
    let tools = s.call("tools/list", json!({}));
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    assert!(names.contains(&"gaffer_status"), "{names:?}");
    for t in tools["tools"].as_array().expect("tools") {
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
    }
    let r = s.call(
        "tools/call",
        json!({"name": "gaffer_status", "arguments": {}}),
    );
    assert_eq!(r["isError"], false);
    assert_eq!(r["structuredContent"]["profile"], "mcp");
    let text: Value =
        serde_json::from_str(r["content"][0]["text"].as_str().expect("text")).expect("json text");
    assert_eq!(text["profile"], "mcp");
    // Domain errors are tool errors the agent can read; unknown tools are protocol errors.
    let bad = s.call(
        "tools/call",
        json!({"name": "gaffer_status", "arguments": {"after_seq": "x"}}),
    );
    assert_eq!(bad["isError"], true);
    assert_eq!(
        bad["structuredContent"]["error"]["data"]["field"],
        "after_seq"
    );
    let unknown = s.request("tools/call", json!({"name": "nope", "arguments": {}}));
    assert_eq!(code(&unknown), -32602);
    // Gaffer's own methods are not reachable on the agent surface except through tools.
    let direct = s.request("gaffer/status", json!({}));
    assert_eq!(code(&direct), -32601);
}

#[test]
fn mcp_unknown_version_gets_latest_and_forced_profile() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &["--mcp"]);
    let init = s.call(
        "initialize",
        json!({"protocolVersion": "1999-01-01", "capabilities": {}}),
    );
    assert_eq!(init["protocolVersion"], "2025-11-25");
    // Operator connections never exist on MCP.
    let mut s2 = Server::start(ws.path(), Wire::Ndjson, &["--mcp"]);
    let r = s2.request(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "role": "operator", "operatorKey": "x"}),
    );
    assert_eq!(r["error"]["data"]["code"], "operator_not_on_mcp");
}

#[test]
fn mcp_stateless_revision_discover_and_meta() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &[]);
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}});
    let d = s.call("server/discover", json!({"_meta": meta}));
    assert_eq!(d["resultType"], "complete");
    assert!(
        d["supportedVersions"]
            .as_array()
            .expect("versions")
            .contains(&json!("2026-07-28"))
    );
    let tools = s.call("tools/list", json!({"_meta": meta}));
    assert_eq!(tools["resultType"], "complete");
    let r = s.call(
        "tools/call",
        json!({"_meta": meta, "name": "gaffer_status", "arguments": {}}),
    );
    assert_eq!(r["structuredContent"]["profile"], "mcp");
    let bad = s.request(
        "tools/list",
        json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2099-01-01"}}),
    );
    assert_eq!(code(&bad), -32602);
    assert_eq!(bad["error"]["data"]["field"], "_meta");
}

#[test]
fn bad_input_never_stops_the_server() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &[]);
    s.send_raw(b"{not json\n");
    assert_eq!(code(&s.null_id_error()), -32700);
    s.send_raw(b"\xff\xfe\x00garbage\n");
    assert_eq!(code(&s.null_id_error()), -32700);
    s.send_raw(b"[]\n");
    assert_eq!(code(&s.null_id_error()), -32600);
    let r = s.request("gaffer/status", json!({"after_seq": "soon"}));
    assert_eq!(code(&r), -32602);
    assert_eq!(r["error"]["data"]["field"], "after_seq");
    let r = s.request("gaffer/status", json!({"bogus": 1}));
    assert_eq!(r["error"]["data"]["field"], "bogus");
    let r = s.request("no/such", json!({}));
    assert_eq!(code(&r), -32601);
    s.send(&json!({"jsonrpc": "2.0", "id": 99, "method": "gaffer/status", "params": [1, 2]}));
    assert_eq!(code(&s.response(99)), -32602);
    // An oversized line is refused without buffering it whole; the next line is served.
    let big = vec![b'x'; 17 * 1024 * 1024];
    s.send_raw(&big);
    s.send_raw(b"\n");
    assert_eq!(code(&s.null_id_error()), -32600);
    // Batches work and answer as one array.
    s.send(&json!([
        {"jsonrpc": "2.0", "id": 501, "method": "gaffer/status"},
        {"jsonrpc": "2.0", "method": "initialized"},
        {"jsonrpc": "2.0", "id": 502, "method": "no/such"}
    ]));
    let batch = s
        .wait_for(Duration::from_secs(10), |v| v.is_array())
        .expect("batch reply");
    let arr = batch.as_array().expect("array");
    assert_eq!(arr.len(), 2);
    assert!(
        arr.iter()
            .any(|r| r["id"] == 501 && r["result"].is_object())
    );
    assert!(
        arr.iter()
            .any(|r| r["id"] == 502 && r["error"]["code"] == -32601)
    );
    let st = s.call("gaffer/status", json!({}));
    assert_eq!(
        st["store"]["exists"], false,
        "bad input never reaches the store"
    );
    // EOF in the middle of a message: clean exit.
    s.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"meth");
    assert_eq!(s.finish(), 0);
}

#[test]
fn bad_lsp_frames_are_reported_and_skipped() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Lsp, &[]);
    s.call("initialize", json!({"processId": null, "capabilities": {}}));
    // A bad header and the garbage after it are one bad run: one error.
    s.send_raw(b"Content-Length: nope\r\n\r\n");
    s.send_raw(b"garbage between frames\r\n");
    assert_eq!(code(&s.null_id_error()), -32700);
    s.call("gaffer/status", json!({}));
    assert!(
        s.wait_for(Duration::from_millis(300), |v| v.get("id")
            == Some(&Value::Null))
            .is_none(),
        "one bad run, one error"
    );
    s.send_raw(b"Content-Length: 5\r\n\r\n\xff\xff\xff\xff\xff");
    assert_eq!(code(&s.null_id_error()), -32700);
    let huge = 17 * 1024 * 1024;
    s.send_raw(format!("Content-Length: {huge}\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n").as_bytes());
    let chunk = vec![b' '; 1 << 20];
    for _ in 0..17 {
        s.send_raw(&chunk);
    }
    assert_eq!(code(&s.null_id_error()), -32600);
    let st = s.call("gaffer/status", json!({}));
    assert_eq!(st["profile"], "lsp");
    s.send_raw(b"Content-Length: 40\r\n\r\n{\"jsonrpc\":");
    s.close_stdin();
    assert_eq!(
        common::wait_exit(&mut s.child, Duration::from_secs(10)),
        1,
        "EOF without shutdown"
    );
}

#[test]
fn cancellation_answers_minus_32800_and_server_goes_on() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Lsp, &[]);
    s.call("initialize", json!({"processId": null, "capabilities": {}}));
    let id = s.send_request(
        "gaffer/status",
        json!({"after_seq": 1000000, "timeout_ms": 30000}),
    );
    std::thread::sleep(Duration::from_millis(100));
    s.notify("$/cancelRequest", json!({"id": id}));
    let r = s.response(id);
    assert_eq!(code(&r), -32800);
    assert!(s.call("gaffer/status", json!({}))["pid"].is_u64());
    assert!(
        common::journal_bytes(ws.path()).is_empty(),
        "a cancelled read wrote nothing"
    );
}

#[test]
fn progress_is_reported_for_work_done_tokens() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Lsp, &[]);
    s.call("initialize", json!({"processId": null, "capabilities": {}}));
    s.call(
        "gaffer/status",
        json!({"after_seq": 5, "timeout_ms": 50, "workDoneToken": "tok-1"}),
    );
    let begin = s
        .notification("$/progress", Duration::from_secs(5))
        .expect("begin");
    assert_eq!(begin["params"]["token"], "tok-1");
    assert_eq!(begin["params"]["value"]["kind"], "begin");
    let end = s
        .notification("$/progress", Duration::from_secs(5))
        .expect("end");
    assert_eq!(end["params"]["value"]["kind"], "end");
}

#[test]
fn mcp_progress_and_cancellation() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &["--mcp"]);
    s.call(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}}),
    );
    let id = s.send_request(
        "tools/call",
        json!({"name": "gaffer_status", "arguments": {"after_seq": 99999, "timeout_ms": 30000}, "_meta": {"progressToken": 7}}),
    );
    let p = s
        .notification("notifications/progress", Duration::from_secs(5))
        .expect("progress");
    assert_eq!(p["params"]["progressToken"], 7);
    s.notify(
        "notifications/cancelled",
        json!({"requestId": id, "reason": "user"}),
    );
    // MCP: the receiver of a cancellation does not answer the cancelled request.
    let late = s.wait_for(Duration::from_secs(2), |v| v.get("id") == Some(&json!(id)));
    assert!(
        late.is_none(),
        "a cancelled MCP request was answered: {late:?}"
    );
    let next = s.call(
        "tools/call",
        json!({"name": "gaffer_status", "arguments": {}}),
    );
    assert_eq!(next["isError"], false);
}

#[test]
fn debug_logging_keeps_stdout_protocol_only() {
    let ws = workspace();
    // The reader thread panics on any stdout line that is not JSON-RPC.
    let mut s = Server::start(ws.path(), Wire::Ndjson, &["--log-level", "trace"]);
    for _ in 0..5 {
        s.call("gaffer/status", json!({}));
    }
    s.send_raw(b"{oops\n");
    assert_eq!(code(&s.null_id_error()), -32700);
    assert_eq!(s.finish(), 0);
}

#[test]
fn cancelled_writes_never_leave_half_a_record() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &[]);
    let mut ids = Vec::new();
    for i in 0..40 {
        let bundle = json!({
            "metadata": {"id": format!("b-{i}"), "revision": "r1", "created_at": "2026-01-01T00:00:00Z",
                         "provenance": {"source": "test"}},
            "profiles": [{"selector": {"kind": "builtin", "value": "builtin:coder"},
                          "command": ["sh", "-c", "cat"], "label": "x".repeat(2000)}]
        });
        let id = s.send_request("bundles/sync", json!({"bundle": bundle}));
        // Cancel every other request straight away, while it waits or runs.
        if i % 2 == 0 {
            s.notify("$/cancelRequest", json!({"id": id}));
        }
        ids.push((i, id));
    }
    let mut answered_ok = Vec::new();
    for (i, id) in &ids {
        let r = s.response(*id);
        match r.get("result") {
            Some(_) => answered_ok.push(*i),
            None => assert_eq!(code(&r), -32800, "only cancellation may fail here: {r}"),
        }
    }
    assert!(answered_ok.len() >= 20, "uncancelled writes all succeed");
    let listed = s.call("bundles/list", json!({}));
    let listed: Vec<String> = listed["bundles"]
        .as_array()
        .expect("bundles")
        .iter()
        .map(|b| b["id"].as_str().expect("id").to_string())
        .collect();
    for i in &answered_ok {
        assert!(
            listed.contains(&format!("b-{i}")),
            "acknowledged write b-{i} is in the store"
        );
    }
    drop(s);
    let (rc, out, err) = common::run_cli(ws.path(), &["store", "verify"]);
    assert_eq!(
        rc, 0,
        "store verifies clean after cancellations: {out} {err}"
    );
    let report: Value = serde_json::from_str(&out).expect("verify report");
    assert_eq!(report["ok"], true);
}

#[test]
fn end_of_input_still_answers_every_request_already_sent() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &[]);
    let mut script = Vec::new();
    for id in 1..=20 {
        script.extend_from_slice(
            format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"gaffer/status\"}}\n")
                .as_bytes(),
        );
    }
    s.send_raw(&script);
    s.close_stdin();
    for id in 1..=20 {
        assert!(
            s.response(id)["result"]["pid"].is_u64(),
            "request {id} answered after EOF"
        );
    }
    assert_eq!(common::wait_exit(&mut s.child, Duration::from_secs(20)), 0);
}

#[test]
fn a_process_that_created_the_store_is_seen_as_a_peer() {
    let ws = workspace();
    // A starts before `.gaffer/` exists, then creates it with its first write.
    let mut a = Server::start(ws.path(), Wire::Ndjson, &[]);
    let a_pid = a.call("gaffer/status", json!({}))["pid"].clone();
    let bundle = json!({
        "metadata": {"id": "peer-b", "revision": "r1", "created_at": "2026-01-01T00:00:00Z",
                     "provenance": {"source": "test"}},
        "profiles": [{"selector": {"kind": "builtin", "value": "builtin:coder"},
                      "command": ["sh", "-c", "cat"]}]
    });
    a.call("bundles/sync", json!({"bundle": bundle}));
    let mut b = Server::start(ws.path(), Wire::Ndjson, &[]);
    let st = b.call("gaffer/status", json!({}));
    let peers: Vec<Value> = st["peers"]
        .as_array()
        .expect("peers")
        .iter()
        .map(|p| p["pid"].clone())
        .collect();
    assert!(peers.contains(&a_pid), "B sees A ({a_pid}) among {peers:?}");
    // And A sees B once B has registered (B opened an existing store).
    let st = a.call("gaffer/status", json!({}));
    let peers: Vec<Value> = st["peers"]
        .as_array()
        .expect("peers")
        .iter()
        .map(|p| p["pid"].clone())
        .collect();
    assert!(peers.contains(&st_pid(&mut b)), "A sees B among {peers:?}");
}

fn st_pid(s: &mut Server) -> Value {
    s.call("gaffer/status", json!({}))["pid"].clone()
}

/// `initialize` from an anonymous client is answered before the workspace opens (the open
/// follows the reply); a failed open is then reported by every request that needs the store,
/// each retrying with the workspace `initialize` chose. A client that presents a credential
/// needs the store to be identified, so its `initialize` itself reports the failure; a root
/// that is no directory is refused by `initialize` naming the field.
#[test]
fn initialize_is_answered_before_the_workspace_opens_and_a_failed_open_is_reported_on_use() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &[]);
    for id in ["open-a", "open-b"] {
        let bundle = json!({
            "metadata": {"id": id, "revision": "r1", "created_at": "2026-01-01T00:00:00Z",
                         "provenance": {"source": "test"}},
            "profiles": [{"selector": {"kind": "builtin", "value": "builtin:coder"},
                          "command": ["sh", "-c", "cat"]}]
        });
        s.call("bundles/sync", json!({"bundle": bundle}));
    }
    assert_eq!(s.finish(), 0);
    // Damage the first record: an earlier record's corruption makes the store refuse to open.
    let dir = ws.path().join(".gaffer").join("journal");
    let mut segments: Vec<_> = std::fs::read_dir(&dir)
        .expect("journal")
        .flatten()
        .map(|e| e.path())
        .collect();
    segments.sort();
    let mut bytes = std::fs::read(&segments[0]).expect("segment");
    let (at, len) = common::frames(&bytes)[0];
    bytes[at + len - 2] ^= 0x5a;
    std::fs::write(&segments[0], &bytes).expect("write");

    let uri = format!(
        "file://{}",
        ws.path().canonicalize().expect("canon").display()
    );
    let elsewhere = workspace();
    let mut lsp = Server::start_in(elsewhere.path(), Wire::Lsp);
    let init = lsp.call(
        "initialize",
        json!({"processId": null, "rootUri": uri, "capabilities": {}}),
    );
    assert_eq!(init["client"], "anonymous", "{init}");
    for _ in 0..2 {
        let r = lsp.request("gaffer/status", json!({}));
        assert_eq!(r["error"]["data"]["code"], "store_unavailable", "{r}");
    }
    // The damage repaired, the next request opens the workspace initialize chose (not the
    // process's own directory).
    bytes[at + len - 2] ^= 0x5a;
    std::fs::write(&segments[0], &bytes).expect("write");
    let st = lsp.call("gaffer/status", json!({}));
    assert_eq!(
        st["workspace"],
        ws.path()
            .canonicalize()
            .expect("canon")
            .display()
            .to_string()
    );
    assert_eq!(
        lsp.call("bundles/list", json!({}))["bundles"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    lsp.call("shutdown", Value::Null);
    lsp.notify("exit", Value::Null);
    assert_eq!(
        common::wait_exit(&mut lsp.child, Duration::from_secs(10)),
        0
    );

    // Damaged again: a client whose workspace failed to open may initialize with another root.
    bytes[at + len - 2] ^= 0x5a;
    std::fs::write(&segments[0], &bytes).expect("write");
    let mut lsp = Server::start_in(elsewhere.path(), Wire::Lsp);
    lsp.call(
        "initialize",
        json!({"processId": null, "rootUri": uri, "capabilities": {}}),
    );
    let r = lsp.request("gaffer/status", json!({}));
    assert_eq!(r["error"]["data"]["code"], "store_unavailable", "{r}");
    let other = workspace();
    let other_path = other.path().canonicalize().expect("canon");
    lsp.call(
        "initialize",
        json!({"processId": null, "rootUri": format!("file://{}", other_path.display()),
               "capabilities": {}}),
    );
    let st = lsp.call("gaffer/status", json!({}));
    assert_eq!(st["workspace"], other_path.display().to_string());
    let again = lsp.request(
        "initialize",
        json!({"processId": null, "rootUri": uri, "capabilities": {}}),
    );
    assert_eq!(
        code(&again),
        -32600,
        "once open, initialize is refused: {again}"
    );
    drop(lsp);

    // A credential needs the store: initialize reports the failure itself.
    let mut lsp = Server::start_in(elsewhere.path(), Wire::Lsp);
    let r = lsp.request(
        "initialize",
        json!({"processId": null, "rootUri": uri, "capabilities": {},
               "initializationOptions": {"clientToken": "not-a-token"}}),
    );
    assert_eq!(r["error"]["data"]["code"], "store_unavailable", "{r}");
    drop(lsp);

    // A root that is no directory is refused at initialize, naming the field.
    let file = ws.path().join("plain-file");
    std::fs::write(&file, "x").expect("write");
    let mut lsp = Server::start_in(elsewhere.path(), Wire::Lsp);
    let r = lsp.request(
        "initialize",
        json!({"processId": null, "rootUri": format!("file://{}", file.display()), "capabilities": {}}),
    );
    assert_eq!(r["error"]["data"]["field"], "rootUri", "{r}");
}
