//! The `command` provider: run one program with explicit argv, a workspace-relative working
//! directory, a fixed minimal environment plus the variables its plan names, and a timeout. A run that completes is proven by its
//! exit status; a run that was interrupted (timeout, crash) cannot be proven afterwards.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use super::super::adapter::{
    Adapter, AdapterCtx, AdapterError, BoxFuture, Catalog, Decoded, Descriptor, ExecError,
    FailureKind, Outcome, Presentation, Resolved, Risk,
};
use super::super::lifecycle::codes;
use super::super::policy::Classification;
use super::common::{decode_closed, ready, schema_of, to_value};
use super::paths::{inside_workspace, normalize_relative};

pub const PROVIDER: &str = "command";
/// The environment every run starts with; nothing comes from gaffer's own environment, and
/// any other variable only from the plan's `env`, which an allow rule must name. `HOME` is a
/// directory that does not exist: the workspace is agent-writable, so a `HOME` there would let
/// a planted `.gitconfig` or `.npmrc` run code inside an allowed program.
pub const FIXED_ENV: &[(&str, &str)] = &[
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ("LANG", "C.UTF-8"),
    ("HOME", "/nonexistent"),
];
/// Names an operation may never set: they change how every program loads.
const FORBIDDEN_ENV_PREFIXES: &[&str] = &["LD_", "DYLD_", "GAFFER_"];
const FORBIDDEN_ENV: &[&str] = &[
    "BASH_ENV",
    "ENV",
    "IFS",
    "PATH",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "NODE_OPTIONS",
    "PERL5OPT",
];
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;
const MAX_TIMEOUT_MS: u64 = 600_000;
const MAX_ARGS: usize = 256;
const MAX_ENV: usize = 32;

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// The program and its arguments; `argv[0]` is a bare name looked up in PATH or a path.
pub struct CommandTarget {
    pub argv: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// How to run it.
pub struct CommandArgs {
    /// Working directory relative to the workspace root (default: the root).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables (names in upper snake case; loader variables refused).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Milliseconds before the run is killed (default 60000, at most 600000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

pub fn catalog() -> Catalog {
    Catalog {
        provider: PROVIDER.into(),
        descriptors: vec![descriptor()],
    }
}

fn descriptor() -> Descriptor {
    Descriptor {
        name: "command.run".into(),
        provider: PROVIDER.into(),
        operation_revision: 1,
        summary: "Run a program in the workspace and record its exit status and output digests"
            .into(),
        risk: Risk::High,
        target_kind: "command".into(),
        target_schema: schema_of::<CommandTarget>(),
        arguments_schema: schema_of::<CommandArgs>(),
        request_ttl_seconds: 1800,
        approval_ttl_seconds: 600,
        requires_approval: false,
        implemented: true,
    }
}

pub struct CommandAdapter {
    desc: Descriptor,
}

pub fn adapters() -> Vec<std::sync::Arc<dyn Adapter>> {
    vec![std::sync::Arc::new(CommandAdapter { desc: descriptor() })]
}

/// A variable name a plan (or a provider declaration) may set: upper snake case, no loader
/// variables.
pub(super) fn env_name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_uppercase() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == b'_')
        && !FORBIDDEN_ENV.contains(&name)
        && !FORBIDDEN_ENV_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// A command's variables as its summary shows them: their count and names (before the argv),
/// and each value, cut to 64 characters, after it.
fn shown_env(env: &BTreeMap<String, String>) -> (String, String) {
    if env.is_empty() {
        return (String::new(), String::new());
    }
    let names: Vec<&str> = env.keys().map(String::as_str).collect();
    let values: Vec<String> = env
        .iter()
        .map(|(k, v)| format!("{k}={:?}", super::common::shown_field(v)))
        .collect();
    (
        format!("env {} [{}]; ", env.len(), names.join(", ")),
        format!("; values {}", values.join(", ")),
    )
}

fn decode_input(
    target: &Value,
    arguments: &Value,
) -> Result<(CommandTarget, CommandArgs), AdapterError> {
    let t: CommandTarget = decode_closed("target", target)?;
    if t.argv.is_empty() || t.argv[0].is_empty() {
        return Err(AdapterError::input(
            Some("target.argv"),
            "argv needs a program",
        ));
    }
    if t.argv.len() > MAX_ARGS || t.argv.iter().any(|a| a.contains('\0')) {
        return Err(AdapterError::input(
            Some("target.argv"),
            format!("argv must have at most {MAX_ARGS} entries without NUL"),
        ));
    }
    let mut a: CommandArgs = decode_closed("arguments", arguments)?;
    a.cwd = Some(match a.cwd.as_deref() {
        None | Some("") | Some(".") => String::new(),
        Some(c) => normalize_relative("arguments.cwd", c)?,
    });
    if a.env.len() > MAX_ENV {
        return Err(AdapterError::input(
            Some("arguments.env"),
            "too many variables",
        ));
    }
    if let Some(bad) = a.env.keys().find(|k| !env_name_ok(k)) {
        return Err(AdapterError::input(
            Some(&format!("arguments.env.{bad}")),
            "variable name is not allowed",
        ));
    }
    if a.env.values().any(|v| v.contains('\0')) {
        return Err(AdapterError::input(
            Some("arguments.env"),
            "values must not contain NUL",
        ));
    }
    let timeout = a.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
    if timeout == 0 || timeout > MAX_TIMEOUT_MS {
        return Err(AdapterError::input(
            Some("arguments.timeout_ms"),
            format!("timeout must be between 1 and {MAX_TIMEOUT_MS} ms"),
        ));
    }
    a.timeout_ms = Some(timeout);
    Ok((t, a))
}

/// Reads a pipe to the end, hashing everything and counting bytes.
async fn digest_stream<R: tokio::io::AsyncRead + Unpin>(mut r: R) -> (String, u64) {
    let mut h = Sha256::new();
    let mut n = 0u64;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(k) => {
                h.update(&buf[..k]);
                n += k as u64;
            }
        }
    }
    (crate::util::hex(&h.finalize()), n)
}

impl Adapter for CommandAdapter {
    fn descriptor(&self) -> &Descriptor {
        &self.desc
    }

    fn decode<'a>(
        &'a self,
        target: &'a Value,
        arguments: &'a Value,
    ) -> BoxFuture<'a, Result<Decoded, AdapterError>> {
        ready(decode_input(target, arguments).map(|(t, a)| Decoded {
            target: to_value(&t),
            arguments: to_value(&a),
        }))
    }

    fn resolve<'a>(
        &'a self,
        ctx: &'a AdapterCtx,
        input: Decoded,
    ) -> BoxFuture<'a, Result<Resolved, AdapterError>> {
        ready((|| {
            let (t, a) = decode_input(&input.target, &input.arguments)?;
            let cwd = a.cwd.clone().unwrap_or_default();
            let dir = inside_workspace(&ctx.workspace_root, "arguments.cwd", &cwd, false)?;
            if !dir.is_dir() {
                return Err(AdapterError::input(
                    Some("arguments.cwd"),
                    "not a directory",
                ));
            }
            let program = &t.argv[0];
            if program.contains('/') && !program.starts_with('/') {
                let rel = normalize_relative("target.argv", program)?;
                inside_workspace(&ctx.workspace_root, "target.argv", &rel, false)?;
            }
            Ok(Resolved {
                target: input.target,
                arguments: input.arguments,
                preconditions: Value::Object(Default::default()),
            })
        })())
    }

    fn authorize<'a>(
        &'a self,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Classification, AdapterError>> {
        ready(decode_input(&plan.target, &plan.arguments).map(|(t, a)| {
            let mut fields = BTreeMap::new();
            fields.insert("program".to_string(), BTreeSet::from([t.argv[0].clone()]));
            let mut attrs = BTreeMap::new();
            attrs.insert(
                "cwd".to_string(),
                BTreeSet::from([a.cwd.unwrap_or_default()]),
            );
            // A variable reaches the program only under a rule that names it (or an approval).
            let mut must_name = BTreeSet::new();
            if !a.env.is_empty() {
                attrs.insert("env".to_string(), a.env.keys().cloned().collect());
                must_name.insert("env".to_string());
            }
            Classification {
                target_kind: "command".into(),
                fields,
                attrs,
                must_name,
                argv: Some(t.argv),
            }
        }))
    }

    fn present<'a>(
        &'a self,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Presentation, AdapterError>> {
        ready(
            decode_input(&plan.target, &plan.arguments).and_then(|(t, a)| {
                // The variables' names come first (`GIT_CONFIG_*` alone can make `git status`
                // run a hook), then the argv with its arguments' bounds and escapes shown, then
                // each value cut short: a cut at the summary's bound, or one padded value, loses
                // a tail, never which variables are set.
                let (names, values) = shown_env(&a.env);
                Presentation {
                    title: format!("Run {}", t.argv[0]),
                    summary: format!(
                        "{names}argv {:?} (in ./{}, timeout {} ms){values}",
                        t.argv,
                        a.cwd.unwrap_or_default(),
                        a.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)
                    ),
                }
                .bounded()
            }),
        )
    }

    fn execute<'a>(
        &'a self,
        ctx: &'a AdapterCtx,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Outcome, ExecError>> {
        Box::pin(async move {
            let not_started = |m: &str| {
                ExecError::new(
                    FailureKind::NotStarted,
                    "command_spawn_failed",
                    m.to_string(),
                )
            };
            let (t, a) = decode_input(&plan.target, &plan.arguments).map_err(|_| {
                ExecError::new(
                    FailureKind::NotStarted,
                    codes::INVALID_STORED,
                    "plan is malformed",
                )
            })?;
            let cwd = inside_workspace(
                &ctx.workspace_root,
                "arguments.cwd",
                a.cwd.as_deref().unwrap_or_default(),
                false,
            )
            .map_err(|_| not_started("the working directory is no longer usable"))?;
            let mut cmd = tokio::process::Command::new(&t.argv[0]);
            cmd.args(&t.argv[1..])
                .current_dir(&cwd)
                .env_clear()
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true);
            let spec = crate::sandbox::Spec::new(&ctx.workspace_root).with_timeout_ms(a.timeout_ms);
            crate::sandbox::confine(&mut cmd, &spec, ctx.sandbox)
                .map_err(|e| not_started(&e.to_string()))?;
            cmd.envs(FIXED_ENV.iter().copied());
            cmd.envs(&a.env);
            cmd.env("GAFFER_OPERATION_ID", &ctx.operation_id);
            let mut child = cmd
                .spawn()
                .map_err(|_| not_started("the program could not be started"))?;
            let out = child.stdout.take().map(|s| tokio::spawn(digest_stream(s)));
            let err = child.stderr.take().map(|s| tokio::spawn(digest_stream(s)));
            let timeout = Duration::from_millis(a.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS));
            let status = match tokio::time::timeout(timeout, child.wait()).await {
                Ok(Ok(s)) => s,
                Ok(Err(_)) | Err(_) => {
                    // The whole group: whatever the program started ends with it.
                    if let Some(pid) = child.id() {
                        crate::workers::procinfo::kill_group(pid, libc::SIGKILL);
                    }
                    let _ = child.kill().await;
                    if let Some(h) = out {
                        h.abort();
                    }
                    if let Some(h) = err {
                        h.abort();
                    }
                    return Err(ExecError::new(
                        FailureKind::PossiblyPartial,
                        codes::UPSTREAM_UNKNOWN,
                        "the command did not finish in time and was killed",
                    ));
                }
            };
            // Grandchildren may keep the pipes open; do not wait for them forever.
            let collect = |h: Option<tokio::task::JoinHandle<(String, u64)>>| async move {
                match h {
                    Some(h) => tokio::time::timeout(Duration::from_secs(2), h)
                        .await
                        .ok()
                        .and_then(Result::ok),
                    None => None,
                }
            };
            let (so, se) = (collect(out).await, collect(err).await);
            let mut result = serde_json::json!({
                "exit_code": status.code(),
                "success": status.success(),
            });
            if let Some((d, n)) = so {
                result["stdout_sha256"] = d.into();
                result["stdout_bytes"] = n.into();
            }
            if let Some((d, n)) = se {
                result["stderr_sha256"] = d.into();
                result["stderr_bytes"] = n.into();
            }
            #[cfg(unix)]
            if let Some(sig) = std::os::unix::process::ExitStatusExt::signal(&status) {
                result["signal"] = sig.into();
            }
            Ok(Outcome {
                proven: true,
                result: Some(result),
                upstream_status: None,
            })
        })
    }

    fn reconcile<'a>(
        &'a self,
        _ctx: &'a AdapterCtx,
        _plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Outcome, ExecError>> {
        // A program's effects cannot be read back in general: an interrupted run stays unknown.
        ready(Ok(Outcome::default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(root: &std::path::Path) -> AdapterCtx {
        AdapterCtx {
            workspace_root: root.to_path_buf(),
            operation_id: "op_cmd".into(),
            client_id: "agent".into(),
            sandbox: Default::default(),
        }
    }

    async fn plan(ws: &std::path::Path, t: Value, a: Value) -> Result<Resolved, AdapterError> {
        let ad = CommandAdapter { desc: descriptor() };
        let d = ad.decode(&t, &a).await?;
        ad.resolve(&ctx(ws), d).await
    }

    #[tokio::test]
    async fn runs_with_argv_cwd_and_allowlisted_env_and_reports_digests() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir(ws.path().join("sub")).unwrap();
        let ad = CommandAdapter { desc: descriptor() };
        let p = plan(
            ws.path(),
            serde_json::json!({"argv": ["sh", "-c", "printf '%s:%s:%s:%s' \"$FOO\" \"$CARGO_MANIFEST_DIR\" \"$(basename $PWD)\" \"$HOME\"; exit 3"]}),
            serde_json::json!({"cwd": "sub", "env": {"FOO": "bar"}}),
        )
        .await
        .unwrap();
        // cargo sets CARGO_MANIFEST_DIR for test runs; it is not allowlisted, so it must not leak.
        assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
        let out = ad.execute(&ctx(ws.path()), &p).await.unwrap();
        assert!(out.proven);
        let r = out.result.unwrap();
        assert_eq!(r["exit_code"], 3);
        assert_eq!(r["success"], false);
        assert_eq!(
            r["stdout_sha256"],
            crate::util::sha256_hex(b"bar::sub:/nonexistent")
        );
        assert_eq!(r["stdout_bytes"], 21);
        let class = ad.authorize(&p).await.unwrap();
        assert_eq!(class.fields["program"], BTreeSet::from(["sh".to_string()]));
        assert_eq!(class.attrs["env"], BTreeSet::from(["FOO".to_string()]));
        assert!(class.must_name.contains("env"), "a rule must name FOO");
        assert_eq!(class.argv.as_deref().map(<[String]>::len), Some(3));
    }

    #[tokio::test]
    async fn bad_inputs_are_refused_with_the_field() {
        let ws = tempfile::tempdir().unwrap();
        for (t, a, field) in [
            (
                serde_json::json!({"argv": []}),
                serde_json::json!({}),
                "target.argv",
            ),
            (
                serde_json::json!({"argv": ["x"]}),
                serde_json::json!({"cwd": "../.."}),
                "arguments.cwd",
            ),
            (
                serde_json::json!({"argv": ["x"]}),
                serde_json::json!({"env": {"LD_PRELOAD": "x"}}),
                "arguments.env.LD_PRELOAD",
            ),
            (
                serde_json::json!({"argv": ["x"]}),
                serde_json::json!({"timeout_ms": 0}),
                "arguments.timeout_ms",
            ),
            (
                serde_json::json!({"argv": ["x"]}),
                serde_json::json!({"shell": true}),
                "arguments",
            ),
            (
                serde_json::json!({"argv": ["x"]}),
                serde_json::json!({"cwd": "missing"}),
                "arguments.cwd",
            ),
        ] {
            let e = plan(ws.path(), t, a).await.unwrap_err();
            assert!(
                e.field.as_deref().unwrap_or("").starts_with(field),
                "{field}: {e:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_timed_out_run_is_possibly_partial_and_cannot_be_proven() {
        let ws = tempfile::tempdir().unwrap();
        let ad = CommandAdapter { desc: descriptor() };
        let p = plan(
            ws.path(),
            serde_json::json!({"argv": ["sleep", "5"]}),
            serde_json::json!({"timeout_ms": 100}),
        )
        .await
        .unwrap();
        let e = ad.execute(&ctx(ws.path()), &p).await.unwrap_err();
        assert!(e.is_possibly_partial());
        assert!(!ad.reconcile(&ctx(ws.path()), &p).await.unwrap().proven);
    }

    #[tokio::test]
    async fn a_missing_program_never_started() {
        let ws = tempfile::tempdir().unwrap();
        let ad = CommandAdapter { desc: descriptor() };
        let p = plan(
            ws.path(),
            serde_json::json!({"argv": ["definitely-not-a-program-gaffer"]}),
            serde_json::json!({}),
        )
        .await
        .unwrap();
        let e = ad.execute(&ctx(ws.path()), &p).await.unwrap_err();
        assert_eq!(e.kind, FailureKind::NotStarted);
    }
}
