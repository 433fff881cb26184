//! Helpers for end-to-end tests: spawn the real `gaffer` binary on a temporary workspace and
//! speak JSON-RPC to it over its stdio, as clients do.
#![allow(dead_code)]

pub mod schema_check;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use schema_check::{Sent, schemas};

pub const BIN: &str = env!("CARGO_BIN_EXE_gaffer");

/// A fresh workspace directory (deleted on drop).
pub fn workspace() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("gaffer-ws-")
        .tempdir()
        .expect("temp workspace")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    Ndjson,
    Lsp,
}

/// A running `gaffer serve` with a reader thread collecting every message it prints.
pub struct Server {
    pub child: Child,
    stdin: Option<ChildStdin>,
    wire: Wire,
    rx: Receiver<Value>,
    /// Messages read but not yet claimed by a caller.
    backlog: Vec<Value>,
    next_id: i64,
    pub workspace: PathBuf,
    /// Requests sent, by id, so each reply is checked against its method's schema.
    sent: std::collections::HashMap<Value, Sent>,
}

impl Server {
    /// Starts `gaffer serve --workspace WS <args>` speaking `wire`.
    pub fn start(ws: &Path, wire: Wire, args: &[&str]) -> Server {
        Self::start_env(ws, wire, args, &[])
    }

    /// Starts `gaffer serve` with no `--workspace`, running in `cwd`.
    pub fn start_in(cwd: &Path, wire: Wire) -> Server {
        let mut cmd = Command::new(BIN);
        cmd.current_dir(cwd).arg("serve");
        Self::spawn(cmd, cwd, wire, &[])
    }

    pub fn start_env(ws: &Path, wire: Wire, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(BIN);
        cmd.arg("--workspace").arg(ws).arg("serve").args(args);
        Self::spawn(cmd, ws, wire, env)
    }

    /// Starts `cmd`, a command that ends up running `gaffer serve` on `ws` (under a wrapper).
    pub fn start_cmd(cmd: Command, ws: &Path, wire: Wire) -> Server {
        Self::spawn(cmd, ws, wire, &[])
    }

    fn spawn(mut cmd: Command, ws: &Path, wire: Wire, env: &[(&str, &str)]) -> Server {
        cmd.env_remove("GAFFER_LOG");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn gaffer");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let msg = match wire {
                    Wire::Ndjson => read_line(&mut r),
                    Wire::Lsp => read_lsp(&mut r),
                };
                match msg {
                    Some(v) => {
                        if tx.send(v).is_err() {
                            break;
                        }
                    }
                    None => break,
                }
            }
        });
        Server {
            stdin: child.stdin.take(),
            child,
            wire,
            rx,
            backlog: Vec::new(),
            next_id: 1,
            workspace: ws.to_path_buf(),
            sent: Default::default(),
        }
    }

    /// Writes raw bytes to the server's stdin.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).expect("write");
        stdin.flush().expect("flush");
    }

    /// Notes what a request is, for checking its reply.
    fn remember(&mut self, v: &Value) {
        let items = match v {
            Value::Array(items) => items.iter().collect(),
            other => vec![other],
        };
        for item in items {
            let (Some(id), Some(method)) = (item.get("id"), item["method"].as_str()) else {
                continue;
            };
            let sent = match method {
                "initialize" => Sent::Initialize,
                "tools/call" => item["params"]["name"]
                    .as_str()
                    .and_then(|t| schemas().method_of_tool(t))
                    .map(Sent::Tool)
                    .unwrap_or(Sent::Other),
                m if m.contains('/') && !m.starts_with("tools/") && !m.starts_with("server/") => {
                    Sent::Method(m.to_string())
                }
                _ => Sent::Other,
            };
            self.sent.insert(id.clone(), sent);
        }
    }

    /// Checks a received message against `schema/`.
    fn check(&self, v: &Value) {
        let items = match v {
            Value::Array(items) => items.iter().collect(),
            other => vec![other],
        };
        for item in items {
            let sent = item.get("id").and_then(|id| self.sent.get(id));
            schemas().check_message(item, sent);
        }
    }

    /// Sends one JSON message in this server's framing.
    pub fn send(&mut self, v: &Value) {
        self.remember(v);
        let body = serde_json::to_vec(v).expect("json");
        match self.wire {
            Wire::Ndjson => {
                let mut b = body;
                b.push(b'\n');
                self.send_raw(&b);
            }
            Wire::Lsp => {
                let mut b = format!("Content-Length: {}\r\n\r\n", body.len()).into_bytes();
                b.extend_from_slice(&body);
                self.send_raw(&b);
            }
        }
    }

    pub fn next_id(&mut self) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Sends a request and returns its id.
    pub fn send_request(&mut self, method: &str, params: Value) -> i64 {
        let id = self.next_id();
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Waits for the next message matching `pred` (others are kept for later calls).
    pub fn wait_for(&mut self, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Option<Value> {
        if let Some(i) = self.backlog.iter().position(&pred) {
            return Some(self.backlog.remove(i));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let got = self.rx.recv_timeout(left);
            if let Ok(v) = &got {
                self.check(v);
            }
            match got {
                Ok(v) if pred(&v) => return Some(v),
                Ok(v) => self.backlog.push(v),
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    return None;
                }
            }
        }
    }

    /// The reply to request `id` (full message).
    pub fn response(&mut self, id: i64) -> Value {
        self.wait_for(Duration::from_secs(30), |v| {
            v.get("id") == Some(&json!(id)) && v.get("method").is_none()
        })
        .unwrap_or_else(|| panic!("no response to request {id}"))
    }

    /// Sends a request and waits for its reply (full message).
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send_request(method, params);
        self.response(id)
    }

    /// Sends a request and returns `result`, panicking on an error reply.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let r = self.request(method, params);
        match r.get("result") {
            Some(v) => v.clone(),
            None => panic!("{method} failed: {r}"),
        }
    }

    /// Next notification named `method`.
    pub fn notification(&mut self, method: &str, timeout: Duration) -> Option<Value> {
        self.wait_for(timeout, |v| {
            v.get("method").and_then(Value::as_str) == Some(method) && v.get("id").is_none()
        })
    }

    /// Next message that has `id: null` (errors about unreadable input).
    pub fn null_id_error(&mut self) -> Value {
        self.wait_for(Duration::from_secs(10), |v| {
            v.get("id") == Some(&Value::Null)
        })
        .expect("an error reply with id null")
    }

    /// The unconsumed messages, as text.
    pub fn backlog_text(&self) -> String {
        self.backlog.iter().map(|v| format!("{v}\n")).collect()
    }

    /// Closes stdin and waits for the exit code.
    pub fn finish(mut self) -> i32 {
        self.stdin.take();
        wait_exit(&mut self.child, Duration::from_secs(30))
    }

    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn wait_exit(child: &mut Child, timeout: Duration) -> i32 {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status.code().unwrap_or(-1);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("gaffer did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn read_line(r: &mut impl BufRead) -> Option<Value> {
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line.trim().is_empty() {
            continue;
        }
        return Some(
            serde_json::from_str(line.trim_end())
                .unwrap_or_else(|e| panic!("stdout is not protocol: {line:?}: {e}")),
        );
    }
}

fn read_lsp(r: &mut impl BufRead) -> Option<Value> {
    let mut len = None;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let l = line.trim_end_matches(['\r', '\n']);
        if l.is_empty() {
            break;
        }
        let (name, value) = l
            .split_once(':')
            .unwrap_or_else(|| panic!("bad header line {l:?}"));
        if name.eq_ignore_ascii_case("content-length") {
            len = Some(value.trim().parse::<usize>().expect("length"));
        }
    }
    let mut body = vec![0u8; len.expect("Content-Length header")];
    r.read_exact(&mut body).ok()?;
    Some(serde_json::from_slice(&body).expect("LSP body is JSON"))
}

/// Runs `gaffer <args>` to completion; returns (exit code, stdout, stderr).
pub fn run_cli(ws: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .output()
        .expect("run gaffer");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Bytes of every journal segment (to check that nothing was written).
pub fn journal_bytes(ws: &Path) -> Vec<u8> {
    let dir = ws.join(".gaffer").join("journal");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    names.sort();
    let mut out = Vec::new();
    for n in names {
        out.extend(std::fs::read(n).unwrap_or_default());
    }
    out
}

/// (offset, frame length) of every record in a segment.
pub fn frames(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut at = 16;
    let mut out = Vec::new();
    while at + 4 <= bytes.len() {
        let word = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        if word == 0 {
            // Space the writer allocated ahead and has not written yet.
            break;
        }
        let len = 8 + (word & ((1 << 30) - 1)) as usize;
        out.push((at, len));
        at += len;
    }
    out
}

/// A whole frame, a batch of one, with the crc32 the store checks: what an attacker who
/// knows the format writes.
pub fn forge_frame(body: &[u8]) -> Vec<u8> {
    forge::frame(body, true, true)
}

pub mod forge;
pub mod gate;
pub mod plans;
