//! External providers: any executable declared in `.gaffer/providers.yaml` that speaks
//! JSON-RPC 2.0 (one JSON object per line) on stdin/stdout. gaffer asks it to `describe` its
//! catalog at start, then forwards `decode`, `resolve`, `authorize`, `present`, `execute` and
//! `reconcile` for each of its operations. Adding a provider needs no recompilation.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::super::adapter::{
    Adapter, AdapterCtx, AdapterError, BoxFuture, Catalog, Decoded, Descriptor, ExecError,
    FailureKind, Outcome, Presentation, Resolved,
};
use super::super::lifecycle::codes;
use super::super::policy::Classification;

pub const PROVIDERS_FILE: &str = "providers.yaml";
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const EXECUTE_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProvidersFile {
    #[serde(default)]
    providers: Vec<ProviderDecl>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderDecl {
    name: String,
    /// argv: an absolute program, or a bare name found in the fixed `PATH`. Nothing in it may
    /// name the workspace (see [`WorkspacePaths::reached_by`]).
    command: Vec<String>,
    /// When set, the sha256 of the RFC 8785 text of the described catalog must match
    /// (catalog drift is refused at start).
    #[serde(default)]
    catalog_sha256: Option<String>,
    /// Variables set to these values (besides the fixed `PATH`, `LANG`, `HOME`).
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    /// Variables copied from gaffer's environment, when set there, as the provider starts
    /// (tokens that should not sit in a workspace file).
    #[serde(default)]
    pass_env: Vec<String>,
    /// Absolute paths outside the workspace the provider may read and execute (its own code).
    #[serde(default)]
    read: Vec<PathBuf>,
    /// TCP ports it may connect to; without any it has no network at all.
    #[serde(default)]
    tcp_connect: Vec<u16>,
    /// How much of the workspace it may reach: `none` (the default: nothing the agent writes
    /// there can become its code), `read` or `write`.
    #[serde(default = "no_workspace")]
    workspace: crate::sandbox::WorkspaceAccess,
}

/// A provider's `workspace:` when its declaration says nothing.
fn no_workspace() -> crate::sandbox::WorkspaceAccess {
    crate::sandbox::WorkspaceAccess::None
}

/// How one provider process is started: argv, its whole environment, its sandbox.
struct Launch {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    spec: crate::sandbox::Spec,
    /// The trusted policy's word on the sandbox when this process loaded its providers.
    sandbox: crate::sandbox::Setting,
    /// The `pass_env` values (tokens): scrubbed from everything the provider says, which
    /// reaches the journal, the agent and gaffer's log.
    scrubber: crate::secrets::Scrubber,
    name: String,
}

/// Shorter `pass_env` values are not taken for tokens (a port or a flag would be scrubbed out
/// of every result).
const PASSED_TOKEN_MIN: usize = 8;

impl ProviderDecl {
    /// Checks the declaration and fixes what the process gets; nothing else of gaffer's
    /// environment or filesystem reaches it.
    fn launch(&self, root: &Path, sandbox: crate::sandbox::Setting) -> Result<Launch, String> {
        let name = &self.name;
        let argv = self.command.clone();
        match argv.first() {
            None => return Err(format!("provider {name} has an empty command")),
            Some(p) if p.contains('/') && !Path::new(p).is_absolute() => {
                return Err(format!(
                    "provider {name}: program {p:?} is a relative path; give the absolute path \
                     of a program installed outside the workspace"
                ));
            }
            Some(_) => {}
        }
        let workspace = WorkspacePaths::of(root);
        if let Some(arg) = argv.iter().find(|a| workspace.reached_by(a)) {
            return Err(format!(
                "provider {name}: command names the workspace ({arg:?}): the agent can write \
                 there, so a provider's code must be installed outside it (it finds the \
                 workspace in ${WORKSPACE_ENV})"
            ));
        }
        let mut passed = Vec::new();
        let mut env: Vec<(String, String)> = super::command::FIXED_ENV
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.push((WORKSPACE_ENV.into(), root.to_string_lossy().into_owned()));
        for (k, v) in &self.env {
            if !super::command::env_name_ok(k) || v.contains('\0') {
                return Err(format!("provider {name}: env.{k} is not allowed"));
            }
            if workspace.reached_by(v) {
                return Err(format!(
                    "provider {name}: env.{k} names the workspace, where the agent can write"
                ));
            }
            env.push((k.clone(), v.clone()));
        }
        for k in &self.pass_env {
            if !super::command::env_name_ok(k) {
                return Err(format!("provider {name}: pass_env {k} is not allowed"));
            }
            // Unset here (a one-shot operator command, say): the provider goes without it.
            match std::env::var(k) {
                Ok(v) => {
                    if v.len() >= PASSED_TOKEN_MIN {
                        passed.push(crate::secrets::Secret {
                            name: k.clone(),
                            env: k.clone(),
                            value: v.clone(),
                        });
                    }
                    env.push((k.clone(), v));
                }
                Err(_) => tracing::debug!(provider = %name, variable = %k, "pass_env not set"),
            }
        }
        let mut spec = crate::sandbox::Spec::new(root);
        for p in &self.read {
            if !p.is_absolute() {
                return Err(format!(
                    "provider {name}: read path {} is not absolute",
                    p.display()
                ));
            }
            // Resolved (through nothing in the workspace, holding none of it unless the
            // provider may reach it) each time it starts: `sandbox::resolve_grant`.
            spec.grants.push(crate::sandbox::Grant {
                path: p.clone(),
                write: false,
            });
        }
        spec.tcp_connect = self.tcp_connect.clone();
        spec.workspace_access = self.workspace;
        Ok(Launch {
            argv,
            env,
            spec,
            sandbox,
            scrubber: crate::secrets::Scrubber::new(&passed),
            name: name.clone(),
        })
    }
}

/// The variable that tells a provider where the workspace is: it starts in `/`, so that
/// nothing the agent writes there is taken for its code (`python -m`, `node_modules`, a
/// sourced script, a tool's configuration file found from the working directory).
pub const WORKSPACE_ENV: &str = "GAFFER_WORKSPACE";

/// Where a provider starts: outside the workspace (see [`WORKSPACE_ENV`]).
const PROVIDER_CWD: &str = "/";

/// The workspace root a provider's command could name, as given and as the kernel resolves
/// it, each also as text relative to `/` (the provider's working directory).
struct WorkspacePaths {
    roots: Vec<PathBuf>,
    spelled: Vec<String>,
}

impl WorkspacePaths {
    fn of(root: &Path) -> Self {
        let mut roots = vec![lexical(&Path::new(PROVIDER_CWD).join(root))];
        if let Ok(real) = std::fs::canonicalize(root) {
            roots.push(real);
        }
        roots.dedup();
        let mut spelled = Vec::new();
        for r in &roots {
            let text = r.to_string_lossy().trim_end_matches('/').to_string();
            spelled.push(text.trim_start_matches('/').to_string());
            spelled.push(text);
        }
        WorkspacePaths { roots, spelled }
    }

    /// True when `text` (a program, argument or variable value) names the workspace or a path
    /// in it, however spelled: any path in the text (`--require=…`, `a:b` lists, `sh -c '…'`,
    /// quoted in a script) taken relative to `/`, with `//`, `.`, `..` and `/proc/*/root`
    /// undone and symlinks resolved, or the root's own text anywhere in it (a root with spaces),
    /// or the variable that holds it. A check of what the file says, not of what a program
    /// computes: the provider's code is the operator's to choose.
    fn reached_by(&self, text: &str) -> bool {
        if text.contains(WORKSPACE_ENV) || self.roots.iter().any(|r| r == Path::new("/")) {
            return true;
        }
        let path_char = |c: char| c.is_alphanumeric() || "/._-~@%+#".contains(c);
        let inside = |p: &Path| self.roots.iter().any(|r| p.starts_with(r));
        let reaches = |token: &str| {
            let path = lexical(&Path::new(PROVIDER_CWD).join(token));
            inside(&path) || std::fs::canonicalize(&path).is_ok_and(|real| inside(&real))
        };
        // Each token as a path, and from its first `/` on (a flag glued to it: `-r/…`, `-I/…`).
        let named = text.split(|c: char| !path_char(c)).any(|token| {
            !token.is_empty()
                && (reaches(token) || token.find('/').is_some_and(|at| reaches(&token[at..])))
        });
        named || self.spelled_in(text)
    }

    /// The root's text appears in `text` as a whole name (not `/ws2`, nor `/a/ws` for `ws`).
    fn spelled_in(&self, text: &str) -> bool {
        let path_char = |c: char| c.is_alphanumeric() || "-_.".contains(c);
        self.spelled.iter().filter(|r| !r.is_empty()).any(|r| {
            text.match_indices(r.as_str()).any(|(at, _)| {
                let before = text[..at].chars().next_back();
                let after = text[at + r.len()..].chars().next();
                let starts =
                    before.is_none_or(|c| !path_char(c) && (r.starts_with('/') || c != '/'));
                starts && after.is_none_or(|c| !path_char(c))
            })
        })
    }
}

/// `path` (absolute) with `.`, `..` and repeated separators undone, and any `/proc/…/root` or
/// `/proc/…/cwd` (`/` to a provider, `/proc/self/task/N/root` included) taken for `/`, without
/// touching the disk.
fn lexical(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut parts: Vec<std::ffi::OsString> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => parts.push(n.to_os_string()),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
        let at_root = parts.len() >= 3
            && parts[0] == "proc"
            && parts.last().is_some_and(|p| p == "root" || p == "cwd");
        if at_root {
            parts.clear();
        }
    }
    let mut out = PathBuf::from("/");
    out.extend(parts);
    out
}

/// One provider process, started on demand and restarted after it dies. Calls to one
/// provider are serialised.
struct Conn {
    launch: Launch,
    io: tokio::sync::Mutex<Option<Proc>>,
}

struct Proc {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: BufReader<tokio::process::ChildStdout>,
    next_id: u64,
}

#[derive(Debug)]
enum CallError {
    /// The provider answered with a JSON-RPC error.
    Provider {
        code: String,
        message: String,
        kind: Option<FailureKind>,
    },
    /// The pipe broke or timed out: nothing is known.
    Transport(String),
}

impl Conn {
    async fn spawn(&self) -> Result<Proc, CallError> {
        let l = &self.launch;
        let mut cmd = tokio::process::Command::new(&l.argv[0]);
        cmd.args(&l.argv[1..])
            .current_dir(PROVIDER_CWD)
            .env_clear()
            .envs(l.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        crate::sandbox::confine(&mut cmd, &l.spec, l.sandbox)
            .map_err(|e| CallError::Transport(format!("cannot start provider: {e}")))?;
        let mut child = cmd
            .spawn()
            .map_err(|e| CallError::Transport(format!("cannot start provider: {e}")))?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| CallError::Transport("no stdin".into()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| CallError::Transport("no stdout".into()))?;
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(log_stderr(stderr, l.name.clone(), l.scrubber.clone()));
        }
        Ok(Proc {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            next_id: 1,
        })
    }

    async fn call(
        &self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, CallError> {
        let mut guard = self.io.lock().await;
        if guard.is_none() {
            *guard = Some(self.spawn().await?);
        }
        let Some(p) = guard.as_mut() else {
            return Err(CallError::Transport("provider not running".into()));
        };
        let id = p.next_id;
        p.next_id += 1;
        let mut line = serde_json::to_string(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .map_err(|e| CallError::Transport(e.to_string()))?;
        line.push('\n');
        let exchange = async {
            p.stdin.write_all(line.as_bytes()).await?;
            p.stdin.flush().await?;
            loop {
                let mut buf = String::new();
                if p.stdout.read_line(&mut buf).await? == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "provider closed its output",
                    ));
                }
                let Ok(mut v) = serde_json::from_str::<Value>(&buf) else {
                    continue;
                };
                scrub_strings(&self.launch.scrubber, &mut v);
                if v.get("id").and_then(Value::as_u64) == Some(id) {
                    return Ok(v);
                }
            }
        };
        let reply = match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                let _ = p.child.start_kill();
                *guard = None;
                return Err(CallError::Transport(e.to_string()));
            }
            Err(_) => {
                let _ = p.child.start_kill();
                *guard = None;
                return Err(CallError::Transport("provider timed out".into()));
            }
        };
        if let Some(err) = reply.get("error") {
            let data = err.get("data");
            let code = data
                .and_then(|d| d.get("code"))
                .and_then(Value::as_str)
                .unwrap_or("provider_error")
                .to_string();
            let kind = match data.and_then(|d| d.get("kind")).and_then(Value::as_str) {
                Some("not_started") => Some(FailureKind::NotStarted),
                Some("definitive") => Some(FailureKind::Definitive),
                Some("possibly_partial") => Some(FailureKind::PossiblyPartial),
                _ => None,
            };
            let message = err
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            return Err(CallError::Provider {
                code,
                message,
                kind,
            });
        }
        Ok(reply.get("result").cloned().unwrap_or(Value::Null))
    }
}

/// Longest stderr line logged as one entry; a longer one is logged in pieces.
const STDERR_LINE_MAX: usize = 4096;

/// The provider's diagnostics into gaffer's log, a line at a time, without its tokens: scrubbed
/// as a stream (a token split over writes or lines is held back until it is whole), read as
/// bytes (output that is not UTF-8 never stops the reading, which would leave the provider
/// writing into a closed pipe), and bounded per entry.
async fn log_stderr(
    mut stderr: tokio::process::ChildStderr,
    provider: String,
    scrubber: crate::secrets::Scrubber,
) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 8192];
    let mut stream = crate::secrets::ScrubStream::default();
    let mut pending = String::new();
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        pending.push_str(&stream.push(&scrubber, &String::from_utf8_lossy(&buf[..n])));
        log_lines(&provider, &mut pending, false);
    }
    pending.push_str(&stream.finish(&scrubber));
    log_lines(&provider, &mut pending, true);
}

/// Logs each whole line of `pending` (and a piece of any line grown past the bound); at the
/// end, the rest too.
fn log_lines(provider: &str, pending: &mut String, end: bool) {
    loop {
        let cut = match pending.find('\n') {
            Some(i) if i <= STDERR_LINE_MAX => i,
            _ if pending.len() > STDERR_LINE_MAX => (0..=STDERR_LINE_MAX)
                .rev()
                .find(|&i| pending.is_char_boundary(i))
                .unwrap_or(0),
            _ if end && !pending.is_empty() => pending.len(),
            _ => return,
        };
        let line: String = pending.drain(..cut).collect();
        if pending.starts_with('\n') {
            pending.remove(0);
        }
        tracing::warn!(provider = %provider, "{line}");
    }
}

/// Every string in `v` (keys included), scrubbed.
fn scrub_strings(scrubber: &crate::secrets::Scrubber, v: &mut Value) {
    if scrubber.is_empty() {
        return;
    }
    match v {
        Value::String(s) => *s = scrubber.scrub(s),
        Value::Array(items) => items.iter_mut().for_each(|i| scrub_strings(scrubber, i)),
        Value::Object(map) => {
            let scrubbed: serde_json::Map<String, Value> = std::mem::take(map)
                .into_iter()
                .map(|(k, mut item)| {
                    scrub_strings(scrubber, &mut item);
                    (scrubber.scrub(&k), item)
                })
                .collect();
            *map = scrubbed;
        }
        _ => {}
    }
}

pub struct ExternalAdapter {
    desc: Descriptor,
    conn: Arc<Conn>,
}

fn adapter_err(e: CallError) -> AdapterError {
    match e {
        CallError::Provider { code, message, .. } => {
            let code = if code == "provider_error" {
                codes::INPUT_INVALID.to_string()
            } else {
                code
            };
            AdapterError {
                code,
                message,
                field: None,
            }
        }
        CallError::Transport(m) => {
            tracing::error!(error = %m, "external provider failed");
            AdapterError::coded(codes::PROVIDER_UNAVAILABLE, "the provider is unavailable")
        }
    }
}

fn exec_err(e: CallError) -> ExecError {
    match e {
        CallError::Provider {
            code,
            message,
            kind,
        } => ExecError::new(kind.unwrap_or(FailureKind::Definitive), &code, message),
        // A broken pipe mid-call says nothing about what happened upstream.
        CallError::Transport(m) => {
            tracing::error!(error = %m, "external provider failed during execution");
            ExecError::new(
                FailureKind::PossiblyPartial,
                codes::UPSTREAM_UNKNOWN,
                "the provider stopped answering",
            )
        }
    }
}

fn parse<T: serde::de::DeserializeOwned>(v: Value, what: &str) -> Result<T, AdapterError> {
    serde_json::from_value(v).map_err(|e| {
        tracing::error!(error = %e, what, "external provider gave a malformed answer");
        AdapterError::coded(
            codes::PROVIDER_UNAVAILABLE,
            format!("the provider gave a malformed {what}"),
        )
    })
}

impl ExternalAdapter {
    fn op(&self) -> &str {
        &self.desc.name
    }

    /// A call made before anything executes: provider failures are adapter errors.
    async fn ask(&self, method: &str, params: Value) -> Result<Value, AdapterError> {
        self.conn
            .call(method, params, CALL_TIMEOUT)
            .await
            .map_err(adapter_err)
    }

    /// `execute` and `reconcile` share one shape: send the plan, read back an outcome. A
    /// malformed outcome proves nothing, so it counts as possibly partial.
    async fn outcome_call(
        &self,
        method: &str,
        ctx: &AdapterCtx,
        plan: &Resolved,
        timeout: std::time::Duration,
    ) -> Result<Outcome, ExecError> {
        let v = self
            .conn
            .call(
                method,
                json!({"operation": self.op(), "operation_id": ctx.operation_id, "plan": plan}),
                timeout,
            )
            .await
            .map_err(exec_err)?;
        serde_json::from_value(v).map_err(|_| {
            ExecError::new(
                FailureKind::PossiblyPartial,
                codes::UPSTREAM_UNKNOWN,
                "the provider gave a malformed outcome",
            )
        })
    }
}

impl Adapter for ExternalAdapter {
    fn descriptor(&self) -> &Descriptor {
        &self.desc
    }

    fn decode<'a>(
        &'a self,
        target: &'a Value,
        arguments: &'a Value,
    ) -> BoxFuture<'a, Result<Decoded, AdapterError>> {
        Box::pin(async move {
            let params = json!({"operation": self.op(), "target": target, "arguments": arguments});
            let v = self.ask("decode", params).await?;
            let d: Decoded = parse(v, "decode result")?;
            if !d.target.is_object() || !d.arguments.is_object() {
                return Err(AdapterError::coded(
                    codes::PROVIDER_UNAVAILABLE,
                    "the provider decoded to non-objects",
                ));
            }
            Ok(d)
        })
    }

    fn resolve<'a>(
        &'a self,
        ctx: &'a AdapterCtx,
        input: Decoded,
    ) -> BoxFuture<'a, Result<Resolved, AdapterError>> {
        Box::pin(async move {
            let params = json!({"operation": self.op(), "operation_id": ctx.operation_id, "client_id": ctx.client_id,
                                "target": input.target, "arguments": input.arguments});
            let v = self.ask("resolve", params).await?;
            let pre = v.get("preconditions").cloned().unwrap_or(Value::Null);
            Ok(Resolved {
                target: input.target,
                arguments: input.arguments,
                preconditions: pre,
            })
        })
    }

    fn authorize<'a>(
        &'a self,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Classification, AdapterError>> {
        Box::pin(async move {
            let v = self
                .ask("authorize", json!({"operation": self.op(), "plan": plan}))
                .await?;
            parse(v, "classification")
        })
    }

    fn present<'a>(
        &'a self,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Presentation, AdapterError>> {
        Box::pin(async move {
            let v = self
                .ask("present", json!({"operation": self.op(), "plan": plan}))
                .await?;
            parse::<Presentation>(v, "presentation")?.bounded()
        })
    }

    fn execute<'a>(
        &'a self,
        ctx: &'a AdapterCtx,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Outcome, ExecError>> {
        Box::pin(self.outcome_call("execute", ctx, plan, EXECUTE_TIMEOUT))
    }

    fn reconcile<'a>(
        &'a self,
        ctx: &'a AdapterCtx,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Outcome, ExecError>> {
        Box::pin(self.outcome_call("reconcile", ctx, plan, CALL_TIMEOUT))
    }
}

/// What starting the declared external providers gave: the catalogs and adapters of those
/// that run, and why each of the others does not.
#[derive(Default)]
pub struct Loaded {
    pub catalogs: Vec<Catalog>,
    pub adapters: Vec<Arc<dyn Adapter>>,
    pub failed: Vec<ProviderFailure>,
}

/// A declared provider that did not start (its operations are not offered), and why.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct ProviderFailure {
    /// The provider's name (`providers.yaml` when the file itself could not be read).
    pub provider: String,
    pub error: String,
}

/// Parses a providers file and checks every declaration as a start would (a command or
/// variable naming the workspace, a variable that is not allowed), without starting anything:
/// the error names the file and the provider.
pub fn check_declarations(text: &str, file: &Path, root: &Path) -> Result<(), String> {
    for p in parse_file(text, file)?.providers {
        p.launch(root, crate::sandbox::Setting::Required)
            .map_err(|e| format!("{}: {e}", file.display()))?;
    }
    Ok(())
}

/// Each declared provider as gaffer reads it (every default filled in), one line each, for the
/// operator's review before trusting the file.
pub fn declared(text: &str, file: &Path) -> Result<Vec<String>, String> {
    Ok(parse_file(text, file)?
        .providers
        .iter()
        .map(|p| {
            format!(
                "provider {:?}: command {:?}, env {:?}, pass_env {:?}, read {:?}, tcp_connect {:?}, workspace {:?}, catalog_sha256 {:?}",
                p.name, p.command, p.env, p.pass_env, p.read, p.tcp_connect, p.workspace, p.catalog_sha256
            )
        })
        .collect())
}

fn parse_file(text: &str, file: &Path) -> Result<ProvidersFile, String> {
    let de = serde_yaml::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let key = e.path().to_string();
        let inner = e.into_inner();
        let line = inner
            .location()
            .map(|l| l.line().to_string())
            .unwrap_or_else(|| "?".into());
        format!("{}:{line}: {key}: {inner}", file.display())
    })
}

/// Starts each provider declared in `bytes` (the content of `file`, which the caller has
/// checked is operator-trusted) and asks for its catalog. Blocking: called once at start. A
/// provider that cannot start, or whose catalog is refused, is left out on its own: the
/// built-in operations and the other providers go on, and the operator's commands with them.
/// `taken` holds the names of the operations already offered (a provider may not shadow one).
pub fn load(
    bytes: &[u8],
    file: &Path,
    root: &Path,
    sandbox: crate::sandbox::Setting,
    taken: &std::collections::HashSet<String>,
) -> Loaded {
    let mut loaded = Loaded::default();
    let text = std::str::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8", file.display()));
    let decl = match text.and_then(|text| parse_file(text, file)) {
        Ok(decl) => decl,
        Err(error) => {
            tracing::warn!(%error, "the trusted providers file cannot be read; no external provider is started");
            loaded.failed.push(ProviderFailure {
                provider: PROVIDERS_FILE.into(),
                error,
            });
            return loaded;
        }
    };
    let mut taken = taken.clone();
    for p in decl.providers {
        match start_one(&p, file, root, sandbox, &taken) {
            Ok((catalog, adapters)) => {
                taken.extend(catalog.descriptors.iter().map(|d| d.name.clone()));
                loaded.catalogs.push(catalog);
                loaded.adapters.extend(adapters);
            }
            Err(error) => {
                tracing::warn!(provider = %p.name, %error, "external provider not started; its operations are not offered");
                loaded.failed.push(ProviderFailure {
                    provider: p.name.clone(),
                    error,
                });
            }
        }
    }
    loaded
}

/// Starts one provider, asks for its catalog and checks it: its digest when the file pins
/// one, and no operation named twice or after one already offered.
fn start_one(
    p: &ProviderDecl,
    file: &Path,
    root: &Path,
    sandbox: crate::sandbox::Setting,
    taken: &std::collections::HashSet<String>,
) -> Result<(Catalog, Vec<Arc<dyn Adapter>>), String> {
    let launch = p
        .launch(root, sandbox)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    let conn = Arc::new(Conn {
        launch,
        io: tokio::sync::Mutex::new(None),
    });
    let described = describe_blocking(&conn).map_err(|e| format!("describe: {e:?}"))?;
    let ops = described.get("operations").cloned().unwrap_or(Value::Null);
    if let Some(want) = &p.catalog_sha256 {
        let got = crate::util::sha256_hex(super::super::canonical::jcs(&ops).as_bytes());
        if &got != want {
            return Err(format!("catalog drifted (sha256 {got}, expected {want})"));
        }
    }
    let descs: Vec<Descriptor> =
        serde_json::from_value(ops).map_err(|e| format!("bad catalog: {e}"))?;
    let mut names = std::collections::HashSet::new();
    if let Some(d) = descs
        .iter()
        .find(|d| taken.contains(&d.name) || !names.insert(d.name.as_str()))
    {
        return Err(format!("its catalog names {:?} a second time", d.name));
    }
    let adapters = descs
        .iter()
        .filter(|d| d.implemented)
        .map(|d| {
            Arc::new(ExternalAdapter {
                desc: d.clone(),
                conn: Arc::clone(&conn),
            }) as Arc<dyn Adapter>
        })
        .collect();
    let catalog = Catalog {
        provider: p.name.clone(),
        descriptors: descs,
    };
    Ok((catalog, adapters))
}

fn describe_blocking(conn: &Arc<Conn>) -> Result<Value, CallError> {
    // A private runtime on its own thread works whether or not the caller is inside one; the
    // provider process is dropped afterwards and restarted lazily on the server's runtime.
    let conn = Arc::clone(conn);
    std::thread::scope(|s| {
        s.spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| CallError::Transport(e.to_string()))?;
            rt.block_on(async move {
                let r = conn.call("describe", json!({}), CALL_TIMEOUT).await;
                *conn.io.lock().await = None;
                r
            })
        })
        .join()
        .unwrap_or_else(|_| Err(CallError::Transport("describe panicked".into())))
    })
}

#[cfg(test)]
mod tests {
    use super::WorkspacePaths;

    #[test]
    fn every_spelling_of_the_workspace_is_caught_and_its_neighbours_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        std::fs::create_dir_all(root.join("tools")).unwrap();
        let w = WorkspacePaths::of(&root);
        let r = root.display().to_string();
        for reaching in [
            r.clone(),
            format!("{r}/tools/p.py"),
            format!("--require={r}/x.js"),
            format!("python3 {r}/tools/p.py && true"),
            format!("/{}", r.trim_start_matches('/')),
            r.trim_start_matches('/').to_string(),
            format!("{}/tools", r.trim_start_matches('/')),
            // A second reader's spellings: the variable, doubled separators and `.` segments
            // inside longer text, a relative path from `/`, `/proc/self/root`, `..`, lists.
            "exec python3 \"$GAFFER_WORKSPACE/tools/p.py\"".to_string(),
            format!("runpy.run_path('{}')", r.replacen('/', "//", 2)),
            format!("run_path('./{}/tools/q.py')", r.trim_start_matches('/')),
            format!("/opt/lib:{}", r.replace('/', "/./")),
            format!("-r{}/x.rb", r.replace('/', "//")),
            format!("/proc/self/root{r}/tools"),
            format!("/proc/self/task/2/root{r}/tools/p.py"),
            format!("/usr/../{}/tools", r.trim_start_matches('/')),
        ] {
            assert!(w.reached_by(&reaching), "{reaching}");
        }
        for other in [
            format!("{r}2/p.py"),
            format!("{r}.bak"),
            format!("/elsewhere/{}", r.trim_start_matches('/')),
            "/usr/bin/python3".to_string(),
            "-u".to_string(),
        ] {
            assert!(!w.reached_by(&other), "{other}");
        }
        // A symlink outside that points in is the workspace too.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(root.join("tools"), &link).unwrap();
        assert!(w.reached_by(&link.display().to_string()));
        assert!(WorkspacePaths::of(std::path::Path::new("/")).reached_by("/usr/bin/env"));
    }
}
