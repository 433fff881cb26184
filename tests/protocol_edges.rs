//! What real clients and hostile input hit at the protocol's edges: Neovim's `[]` params,
//! profiles chosen only by the handshake, ids of unreadable requests, garbage that must not be
//! amplified, lengths that must resynchronise, replies a client does not read (bounded memory),
//! and capabilities that match the connection's role.

mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{BIN, Server, Wire, workspace};
use serde_json::{Value, json};

fn code(r: &Value) -> i64 {
    r["error"]["code"].as_i64().unwrap_or(0)
}

#[test]
fn empty_array_params_mean_no_params() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Lsp, &[]);
    s.call("initialize", json!({"processId": null, "capabilities": {}}));
    // Neovim's Lua encodes `{}` as `[]`.
    let st = s.call("gaffer/status", json!([]));
    assert_eq!(st["profile"], "lsp");
    let ops = s.call("operations/list", json!([]));
    assert_eq!(ops["operations"], json!([]));
    // Positional params that carry something are still refused, naming `params`.
    let r = s.request("gaffer/status", json!([1]));
    assert_eq!(code(&r), -32602, "{r}");
    assert_eq!(r["error"]["data"]["field"], "params");
}

#[test]
fn ping_first_does_not_make_a_raw_session_mcp() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &[]);
    assert_eq!(s.call("ping", json!({})), json!({}));
    let st = s.call("gaffer/status", json!({}));
    assert_eq!(st["profile"], "raw");
}

#[test]
fn an_over_deep_request_is_answered_with_its_id() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Ndjson, &[]);
    let deep = format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"gaffer/status\",\"params\":{{\"x\":{}{}}},\"id\":41}}\n",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    s.send_raw(deep.as_bytes());
    let r = s.response(41);
    assert_eq!(code(&r), -32700, "{r}");
    assert_eq!(s.call("gaffer/status", json!({}))["profile"], "raw");
}

/// `gaffer serve FLAG` on `ws` with piped stdin and stdout, read and written raw.
fn spawn_serve(ws: &std::path::Path, flag: &str) -> std::process::Child {
    Command::new(BIN)
        .arg("--workspace")
        .arg(ws)
        .args(["serve", flag])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn gaffer")
}

/// Raw LSP session on the real binary: what comes back for `input`, read until EOF.
fn lsp_replies(input: &[u8]) -> Vec<u8> {
    let ws = workspace();
    let mut child = spawn_serve(ws.path(), "--lsp");
    let mut stdin = child.stdin.take().expect("stdin");
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_end(&mut out)
        .expect("read stdout");
    writer.join().expect("writer");
    let _ = child.wait();
    out
}

fn frame(body: &Value) -> Vec<u8> {
    let b = serde_json::to_vec(body).expect("json");
    let mut f = format!("Content-Length: {}\r\n\r\n", b.len()).into_bytes();
    f.extend_from_slice(&b);
    f
}

fn init_and_status() -> (Vec<u8>, Vec<u8>) {
    let init = frame(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}}),
    );
    let status =
        frame(&json!({"jsonrpc": "2.0", "id": 2, "method": "gaffer/status", "params": {}}));
    (init, status)
}

#[test]
fn garbage_is_answered_once_per_run_not_once_per_byte() {
    let (mut input, status) = init_and_status();
    input.extend(std::iter::repeat_n(b'C', 300_000));
    input.extend_from_slice(&status);
    let out = lsp_replies(&input);
    let text = String::from_utf8_lossy(&out);
    assert!(
        out.len() < 4_000,
        "{} bytes out for 300 kB of garbage",
        out.len()
    );
    assert_eq!(text.matches("\"id\":null").count(), 1, "{text}");
    assert!(
        text.contains("\"id\":2,\"result\""),
        "the next request is answered: {text}"
    );
}

#[test]
fn bad_lengths_resynchronise_at_the_next_header() {
    for bad in [
        b"Content-Length: 1180591620717411303424\r\n\r\n{\"jsonrpc\":\"2.0\"}".to_vec(),
        b"Content-Length: 4\r\n\r\n{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"gaffer/status\"}"
            .to_vec(),
    ] {
        let (mut input, status) = init_and_status();
        input.extend_from_slice(&bad);
        input.extend_from_slice(&status);
        let out = lsp_replies(&input);
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.contains("\"id\":2,\"result\""),
            "the request after a bad length is answered: {text}"
        );
    }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_client_that_stops_reading_stops_gaffer_reading_and_memory_stays_bounded() {
    let ws = workspace();
    let mut child = spawn_serve(ws.path(), "--jsonl");
    let pid = child.id();
    let mut stdin = child.stdin.take().expect("stdin");
    let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = std::sync::Arc::clone(&written);
    // 1M pings; nobody reads stdout.
    std::thread::spawn(move || {
        let mut batch = String::new();
        for i in 0..1_000_000u32 {
            batch.push_str(&format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"ping\"}}\n"
            ));
            if batch.len() > 64 * 1024 {
                if stdin.write_all(batch.as_bytes()).is_err() {
                    return;
                }
                batch.clear();
                count.store(i as usize, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let _ = stdin.write_all(batch.as_bytes());
        count.store(1_000_000, std::sync::atomic::Ordering::SeqCst);
    });
    // Wait until the writer makes no progress (gaffer stopped reading) or is done.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = usize::MAX;
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = written.load(std::sync::atomic::Ordering::SeqCst);
        if now == last || now >= 1_000_000 || Instant::now() > deadline {
            break;
        }
        last = now;
    }
    let rss = rss_kib(pid);
    let sent = written.load(std::sync::atomic::Ordering::SeqCst);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        sent < 1_000_000,
        "gaffer read every request although no reply was read"
    );
    assert!(
        rss > 0 && rss < 64 * 1024,
        "RSS {rss} KiB with replies unread"
    );
}

#[test]
fn an_agents_lsp_initialize_lists_only_what_it_may_call() {
    let ws = workspace();
    let mut s = Server::start(ws.path(), Wire::Lsp, &[]);
    let init = s.call("initialize", json!({"processId": null, "capabilities": {}}));
    assert_eq!(init["role"], "agent");
    let methods: Vec<&str> = init["capabilities"]["experimental"]["gaffer"]["methods"]
        .as_array()
        .expect("methods")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(methods.contains(&"operations/submit"), "{methods:?}");
    assert!(
        !methods.iter().any(|m| m.starts_with("approvals/")),
        "operator methods advertised to an agent: {methods:?}"
    );
}
