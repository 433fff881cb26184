//! Operator login from outside the serving process: the server holds only the public key (its
//! private-key path does not exist), and every signature comes from `gaffer operator sign`, run
//! as a separate process with the real private key, as an editor that cannot sign would do.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{BIN, Server, Wire, workspace};
use serde_json::{Value, json};

/// A workspace, an operator key pair made by `gaffer operator init`, and a config dir that
/// stands in for HOME so nothing on this machine is read or written.
struct Keys {
    ws: tempfile::TempDir,
    cfg: tempfile::TempDir,
    private: PathBuf,
    public: PathBuf,
}

impl Keys {
    fn new() -> Keys {
        let ws = workspace();
        let cfg = tempfile::tempdir().unwrap();
        let private = cfg.path().join("operator.key");
        let public = cfg.path().join("operator.pub");
        let k = Keys {
            ws,
            cfg,
            private,
            public,
        };
        let out = k.cli(&k.private, &["operator", "init"], None);
        assert_eq!(out.0, 0, "gaffer operator init: {} {}", out.1, out.2);
        assert!(k.private.exists() && k.public.exists());
        std::fs::create_dir_all(k.ws.path().join(".gaffer")).unwrap();
        k
    }

    fn root(&self) -> &Path {
        self.ws.path()
    }

    /// Runs `gaffer --workspace WS <args>` with `key` as the private key file and `stdin`.
    fn cli(&self, key: &Path, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
        let mut child = Command::new(BIN)
            .arg("--workspace")
            .arg(self.root())
            .args(args)
            .env_remove("GAFFER_LOG")
            .env_remove("GAFFER_OPERATOR_PUBLIC_KEY_FILE")
            .env_remove("GAFFER_CLIENT_TOKEN")
            .env("HOME", self.cfg.path())
            .env("XDG_CONFIG_HOME", self.cfg.path())
            .env("GAFFER_OPERATOR_KEY_FILE", key)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        {
            let mut w = child.stdin.take().unwrap();
            if let Some(s) = stdin {
                w.write_all(s.as_bytes()).unwrap();
            }
        }
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `gaffer operator sign` with the real private key; `text` goes in with a trailing newline,
    /// as `echo` or an editor's pipe would send it.
    fn sign(&self, text: &str) -> String {
        let (code, out, err) = self.cli(
            &self.private,
            &["operator", "sign"],
            Some(&format!("{text}\n")),
        );
        assert_eq!(code, 0, "gaffer operator sign: {out} {err}");
        let sig = out.trim().to_string();
        assert_eq!(
            sig.len(),
            86,
            "64 bytes in base64url without padding: {sig:?}"
        );
        sig
    }

    /// A serving process that can only verify: its private-key path does not exist.
    fn serve(&self, wire: Wire, args: &[&str]) -> Server {
        let missing = self.cfg.path().join("no-such-dir").join("operator.key");
        let missing = missing.display().to_string();
        let public = self.public.display().to_string();
        let home = self.cfg.path().display().to_string();
        Server::start_env(
            self.root(),
            wire,
            args,
            &[
                ("GAFFER_OPERATOR_KEY_FILE", missing.as_str()),
                ("GAFFER_OPERATOR_PUBLIC_KEY_FILE", public.as_str()),
                ("HOME", home.as_str()),
                ("XDG_CONFIG_HOME", home.as_str()),
            ],
        )
    }

    /// Initializes with role operator; returns the server and its challenge text.
    fn operator_init(&self, wire: Wire) -> (Server, String) {
        let args: &[&str] = if wire == Wire::Lsp { &["--lsp"] } else { &[] };
        let mut s = self.serve(wire, args);
        let init = s.call(
            "initialize",
            json!({"clientInfo": {"name": "human"}, "initializationOptions": {"role": "operator"}}),
        );
        let c = init["operatorChallenge"]
            .as_str()
            .unwrap_or_else(|| panic!("no operatorChallenge: {init}"))
            .to_string();
        (s, c)
    }

    /// A logged-in operator connection, its challenge signed by `gaffer operator sign`.
    fn operator(&self, wire: Wire) -> Server {
        let (mut s, challenge) = self.operator_init(wire);
        let sig = self.sign(&challenge);
        let r = s.call("operator/login", json!({ "signature": sig }));
        assert_eq!(r, json!({"role": "operator"}));
        s.notify("initialized", json!({}));
        s
    }
}

fn err_code(r: &Value) -> String {
    r["error"]["data"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("expected an error with data.code: {r}"))
        .to_string()
}

fn ok(r: &Value) -> &Value {
    r.get("result")
        .unwrap_or_else(|| panic!("expected success: {r}"))
}

#[test]
fn operator_sign_logs_in_to_a_server_that_holds_only_the_public_key() {
    let k = Keys::new();
    assert!(!k.cfg.path().join("no-such-dir").exists());
    for wire in [Wire::Ndjson, Wire::Lsp] {
        let mut op = k.operator(wire);
        let status = op.call("gaffer/status", json!({}));
        assert_eq!(status["role"], "operator", "{wire:?}: {status}");
        let list = op.call("approvals/list", json!({}));
        assert_eq!(list["approvals"], json!([]), "{wire:?}");
    }
    // `operator/challenge` hands out a fresh text, which `gaffer operator sign` also answers.
    let mut s = k.serve(Wire::Ndjson, &[]);
    s.call("initialize", json!({"clientInfo": {"name": "later"}}));
    let c = s.call("operator/challenge", json!({}))["challenge"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(c.contains("\"domain\":\"gaffer/login/v1\""), "{c}");
    let r = s.call("operator/login", json!({"signature": k.sign(&c)}));
    assert_eq!(r["role"], "operator");
}

#[test]
fn an_approval_signed_by_operator_sign_runs_the_write_once() {
    let k = Keys::new();
    let mut op = k.operator(Wire::Lsp);
    let (code, out, err) = k.cli(&k.private, &["client", "add", "agent-1"], None);
    assert_eq!(code, 0, "gaffer client add: {out} {err}");
    let token: Value = serde_json::from_str(&out).unwrap();
    let token = token["token"].as_str().unwrap().to_string();
    let mut a = k.serve(Wire::Ndjson, &[]);
    let init = a.call(
        "initialize",
        json!({"clientInfo": {"name": "agent-1"}, "initializationOptions": {"clientToken": token}}),
    );
    assert_eq!(init["role"], "agent");
    a.notify("initialized", json!({}));

    // No policy file: the write waits for the operator.
    let p = ok(&a.request(
        "operations/submit",
        json!({"operation": "file.write", "target": {"path": "out/a.txt"}, "arguments": {"content": "approved\n"}, "reason": "needed for the task", "idempotency_key": "w1"}),
    ))
    .clone();
    assert_eq!(p["state"], "pending", "{p}");
    let id = p["id"].as_str().unwrap().to_string();
    let target = k.root().join("out/a.txt");
    assert!(!target.exists());

    let n = op
        .notification("approvals/requested", Duration::from_secs(10))
        .expect("approvals/requested");
    assert_eq!(n["params"]["operation_id"], id.as_str());
    let list = op.call("approvals/list", json!({}));
    let ap = list["approvals"][0].clone();
    assert_eq!(ap["operation_id"], id.as_str(), "{list}");
    let prep = op.call(
        "approvals/prepare",
        json!({"id": ap["approval_id"], "decision": "approve", "expected_revision": ap["revision"],
               "expected_plan_digest": ap["plan_digest"]}),
    );
    let payload = prep["payload"].as_str().unwrap().to_string();
    let signed =
        json!({"payload": payload, "signature": k.sign(&payload), "idempotency_key": "d1"});
    let d = op.call("approvals/decide", signed.clone());
    assert_eq!(d["approval_id"], ap["approval_id"], "{d}");

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut rev = p["revision"].as_u64().unwrap();
    let done = loop {
        let v = a.call(
            "operations/wait",
            json!({"id": id, "after_revision": rev, "wait_seconds": 5}),
        );
        if ["succeeded", "failed", "denied", "cancelled"].contains(&v["state"].as_str().unwrap()) {
            break v;
        }
        rev = v["revision"].as_u64().unwrap();
        assert!(Instant::now() < deadline, "stuck: {v}");
    };
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "approved\n");
    let entries: Vec<_> = std::fs::read_dir(k.root().join("out"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(entries, vec![std::ffi::OsString::from("a.txt")]);

    // The same signed decision again is a replay: the approval is spent once, nothing re-runs.
    let again = op.call("approvals/decide", signed);
    assert_eq!(again["approval_id"], ap["approval_id"]);
    std::fs::remove_file(&target).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(!target.exists(), "the write ran a second time");
    let all = op.call("approvals/list", json!({"all": true}));
    assert_eq!(all["approvals"][0]["uses_spent"], 1, "{all}");
    let v = a.call("operations/get", json!({"id": id}));
    assert_eq!(v["revision"], done["revision"], "{v}");
}

#[test]
fn a_signed_challenge_logs_in_only_the_connection_it_was_issued_to() {
    let k = Keys::new();
    let (mut first, c1) = k.operator_init(Wire::Ndjson);
    let (mut second, c2) = k.operator_init(Wire::Ndjson);
    assert_ne!(c1, c2);
    let sig1 = k.sign(&c1);
    // Another connection (another process on the same workspace) refuses it.
    let r = second.request("operator/login", json!({ "signature": sig1 }));
    assert_eq!(err_code(&r), "operator_login_failed", "{r}");
    let r = second.request("approvals/list", json!({}));
    assert_eq!(err_code(&r), "operator_required", "{r}");
    // Its own challenge was spent by the failed attempt; a fresh one still works.
    let r = second.request("operator/login", json!({ "signature": k.sign(&c2) }));
    assert_eq!(err_code(&r), "operator_login_failed", "{r}");
    let c2b = second.call("operator/challenge", json!({}))["challenge"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        second.call("operator/login", json!({"signature": k.sign(&c2b)}))["role"],
        "operator"
    );
    // The connection it was issued to accepts it, once.
    assert_eq!(
        first.call("operator/login", json!({ "signature": sig1 }))["role"],
        "operator"
    );
    let r = first.request("operator/login", json!({ "signature": sig1 }));
    assert_eq!(
        err_code(&r),
        "operator_login_failed",
        "replayed on its own connection: {r}"
    );
    // A newer challenge on the same connection is not answered by the old signature either.
    let (mut third, c3) = k.operator_init(Wire::Lsp);
    let _ = third.call("operator/challenge", json!({}));
    let r = third.request("operator/login", json!({ "signature": k.sign(&c3) }));
    assert_eq!(
        err_code(&r),
        "operator_login_failed",
        "superseded challenge: {r}"
    );
    let r = third.request("approvals/list", json!({}));
    assert_eq!(err_code(&r), "operator_required", "{r}");
}

#[test]
fn mcp_sessions_never_log_in_as_operator() {
    let k = Keys::new();
    let mut s = k.serve(Wire::Ndjson, &["--mcp"]);
    let init = s.call(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "agent", "version": "1"}}),
    );
    assert_eq!(init["protocolVersion"], "2025-06-18");
    assert!(init.get("operatorChallenge").is_none(), "{init}");
    s.notify("notifications/initialized", json!({}));
    let r = s.request("operator/challenge", json!({}));
    assert_eq!(err_code(&r), "operator_not_on_mcp", "{r}");
    let r = s.request("operator/login", json!({"signature": "A".repeat(86)}));
    assert_eq!(err_code(&r), "operator_not_on_mcp", "{r}");
    // Asking for the role on initialize is refused the same way.
    let mut s2 = k.serve(Wire::Ndjson, &["--mcp"]);
    let r = s2.request(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "1"}, "initializationOptions": {"role": "operator"}}),
    );
    assert_eq!(err_code(&r), "operator_not_on_mcp", "{r}");
}
