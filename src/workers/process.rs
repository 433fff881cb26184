//! The process backend: a worker is an OS process running the profile's argv.
//!
//! - The program runs directly (no shell), in the workspace root, as the leader of its own
//!   process group so stop and timeout reach everything it started, inside the sandbox
//!   ([`crate::sandbox`]: the bundle's `mount_grant` / `network_policy` declarations widen it).
//! - The environment is cleared except for a few locale/path basics, the worker's own id and
//!   profile, and the variables named by the bundle's `secret_ref` declarations of the form
//!   `env:NAME` (copied from gaffer's environment; a missing one fails the spawn).
//! - Input follows the profile's input mode; stdout and stderr are streamed as events.
//! - The run ends with one `Ended` event: exit status, stop, or timeout.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::backend::{ExecEvent, ExecResult, ExecutionBackend, Outcome, SpawnRequest, Spawned};
use super::procinfo;
use super::types::{ExitInfo, RunState, Segment, Stream, WorkerStatus, flatten};
use crate::bundles::{Declaration, DeclarationKind, InputMode, Profile};

/// Variables a worker inherits from gaffer as they are, besides its declared secrets (and
/// `PATH`, without its relative entries).
const BASE_ENV: &[&str] = &["LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR"];
/// Time a stopped worker gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// On stop, stdin is closed first and the process gets this long to finish the input it was
/// given (an echo, a filter) before SIGTERM.
const STOP_DRAIN: Duration = Duration::from_millis(300);
/// How long to wait for the output pipes to drain after the process ended.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);
const READ_CHUNK: usize = 16 * 1024;

struct LiveProcess {
    input_mode: InputMode,
    stdin: Option<mpsc::UnboundedSender<Vec<u8>>>,
    stop: CancellationToken,
    stop_reason: Arc<Mutex<Option<String>>>,
    pgid: u32,
}

/// Runs workers as local processes.
#[derive(Default)]
pub struct ProcessBackend {
    live: Arc<Mutex<HashMap<String, LiveProcess>>>,
}

impl ProcessBackend {
    pub fn new() -> Self {
        Self::default()
    }

    fn with_live<T>(&self, f: impl FnOnce(&mut HashMap<String, LiveProcess>) -> T) -> T {
        let mut guard = self.live.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }
}

/// The bytes one input becomes on stdin.
pub fn render_input(mode: InputMode, segments: &[Segment]) -> Option<Vec<u8>> {
    match mode {
        InputMode::StdinText => {
            let mut text = flatten(segments);
            if !text.ends_with('\n') {
                text.push('\n');
            }
            Some(text.into_bytes())
        }
        InputMode::StdinJsonl => {
            let line = serde_json::json!({ "segments": segments, "text": flatten(segments) });
            let mut bytes = serde_json::to_vec(&line).ok()?;
            bytes.push(b'\n');
            Some(bytes)
        }
        InputMode::Argument => None,
    }
}

impl ExecutionBackend for ProcessBackend {
    fn id(&self) -> &'static str {
        "process"
    }

    fn can_run(&self, profile: &Profile, declarations: &[Declaration]) -> Result<(), String> {
        if profile.command.is_empty() {
            return Err("the profile declares no command to run".to_string());
        }
        // Declarations the sandbox cannot enforce are refused, never ignored.
        for d in declarations {
            if d.kind == DeclarationKind::SecretRef && d.env_var().is_none() {
                return Err(format!(
                    "secret `{}` is not an env: reference, which is the only kind this backend can provide",
                    d.name
                ));
            }
        }
        crate::sandbox::check_declarations(declarations).map_err(|e| e.to_string())
    }

    fn spawn(
        &self,
        req: SpawnRequest<'_>,
        events: mpsc::UnboundedSender<ExecEvent>,
    ) -> Result<Spawned, String> {
        self.can_run(req.profile, req.declarations)?;
        if self.with_live(|live| live.contains_key(req.worker_id)) {
            return Err("the worker is already running".to_string());
        }
        let mut cmd = command_for(&req)?;
        let mut child = cmd.spawn().map_err(|e| {
            format!(
                "cannot start `{}`: {}",
                req.profile.command[0],
                e.kind_description()
            )
        })?;
        let pid = child.id().unwrap_or(0);
        let ticks = procinfo::start_ticks(pid);
        let stdin_tx = child.stdin.take().map(stdin_writer);
        let readers = pump_outputs(&mut child, req.worker_id, &events);

        let stop = CancellationToken::new();
        let stop_reason = Arc::new(Mutex::new(None));
        let live = LiveProcess {
            input_mode: req.profile.input_mode,
            stdin: stdin_tx,
            stop: stop.clone(),
            stop_reason: stop_reason.clone(),
            pgid: pid,
        };
        self.with_live(|m| m.insert(req.worker_id.to_string(), live));

        let timeout = req.profile.timeout_ms.map(Duration::from_millis);
        let registry = self.live.clone();
        let worker_id = req.worker_id.to_string();
        tokio::spawn(async move {
            let (status, reason, exit) =
                supervise(&mut child, pid, timeout, stop, stop_reason).await;
            // Whatever the worker left behind in its group goes with it.
            procinfo::kill_group(pid, libc::SIGKILL);
            registry
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&worker_id);
            for r in readers {
                let _ = tokio::time::timeout(DRAIN_LIMIT, r).await;
            }
            let _ = events.send(ExecEvent::Ended {
                worker_id,
                status,
                reason,
                exit,
            });
        });

        let takes_stdin = req.profile.input_mode != InputMode::Argument;
        Ok(Spawned {
            run_state: if takes_stdin {
                RunState::Idle
            } else {
                RunState::Busy
            },
            input_capable: takes_stdin,
            child_pid: Some(pid),
            child_start_ticks: ticks,
        })
    }

    fn input(&self, worker_id: &str, segments: &[Segment]) -> ExecResult {
        self.with_live(|live| {
            let Some(p) = live.get(worker_id) else {
                return ExecResult::new(
                    Outcome::Rejected,
                    RunState::Stopped,
                    "the worker has no live process here".to_string(),
                );
            };
            let Some(bytes) = render_input(p.input_mode, segments) else {
                return ExecResult::new(
                    Outcome::Unsupported,
                    RunState::Busy,
                    "this profile takes input only at creation".to_string(),
                );
            };
            match &p.stdin {
                Some(tx) if tx.send(bytes).is_ok() => ExecResult::accepted(RunState::Idle),
                _ => ExecResult::new(
                    Outcome::Errored,
                    RunState::Errored,
                    "the worker's input is closed".to_string(),
                ),
            }
        })
    }

    fn stop(&self, worker_id: &str, reason: &str) -> ExecResult {
        self.with_live(|live| match live.get_mut(worker_id) {
            Some(p) => {
                *p.stop_reason.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.to_string());
                // Dropping the sender lets the writer flush what is queued, then close stdin.
                p.stdin = None;
                p.stop.cancel();
                ExecResult::accepted(RunState::Stopped)
            }
            None => ExecResult::new(
                Outcome::Rejected,
                RunState::Stopped,
                "the worker has no live process here".to_string(),
            ),
        })
    }

    fn cancel(&self, worker_id: &str) -> ExecResult {
        // Cancelling the current work of a plain process means interrupting it, as a terminal
        // would on Ctrl-C; the process decides whether that ends it.
        self.with_live(|live| match live.get(worker_id) {
            Some(p) if procinfo::kill_group(p.pgid, libc::SIGINT) => {
                ExecResult::accepted(RunState::Idle)
            }
            Some(_) => ExecResult::new(
                Outcome::Errored,
                RunState::Errored,
                "the process could not be signalled".to_string(),
            ),
            None => ExecResult::new(
                Outcome::Rejected,
                RunState::Stopped,
                "the worker has no live process here".to_string(),
            ),
        })
    }

    fn restore(&self, _worker_id: &str) -> ExecResult {
        // A process cannot be re-attached once its parent is gone, and re-running it would be
        // a silent respawn; a restarted gaffer reports such workers as stopped instead.
        ExecResult::new(
            Outcome::Unsupported,
            RunState::Stopped,
            "processes are never respawned after a restart".to_string(),
        )
    }
}

/// Waits for the process to end by itself, by timeout or by a stop request.
async fn supervise(
    child: &mut Child,
    pgid: u32,
    timeout: Option<Duration>,
    stop: CancellationToken,
    stop_reason: Arc<Mutex<Option<String>>>,
) -> (WorkerStatus, String, Option<ExitInfo>) {
    let deadline = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        res = child.wait() => {
            let exit = res.ok().map(exit_info);
            let (status, reason) = classify(exit.as_ref());
            (status, reason, exit)
        }
        _ = deadline => {
            procinfo::kill_group(pgid, libc::SIGKILL);
            let exit = child.wait().await.ok().map(exit_info);
            let ms = timeout.map(|t| t.as_millis()).unwrap_or(0);
            (WorkerStatus::Failed, format!("timed out after {ms} ms"), exit)
        }
        _ = stop.cancelled() => {
            let exit = match tokio::time::timeout(STOP_DRAIN, child.wait()).await {
                Ok(res) => res.ok().map(exit_info),
                Err(_) => {
                    procinfo::kill_group(pgid, libc::SIGTERM);
                    match tokio::time::timeout(STOP_GRACE, child.wait()).await {
                        Ok(res) => res.ok().map(exit_info),
                        Err(_) => {
                            procinfo::kill_group(pgid, libc::SIGKILL);
                            child.wait().await.ok().map(exit_info)
                        }
                    }
                }
            };
            let why = stop_reason.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let reason = match why {
                Some(r) if !r.is_empty() => format!("stopped on request: {r}"),
                _ => "stopped on request".to_string(),
            };
            (WorkerStatus::Stopped, reason, exit)
        }
    }
}

/// The child gets `fd` as descriptor 3, open across exec (set before the sandbox's own setup,
/// which runs after this in the child).
fn inherit_as_fd3(cmd: &mut Command, fd: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    let raw = fd.as_raw_fd();
    // SAFETY: between fork and exec; dup2 and fcntl are async-signal-safe and `raw` stays
    // open in the parent until the spawn has returned.
    unsafe {
        cmd.pre_exec(move || {
            if raw == 3 {
                if libc::fcntl(3, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(raw, 3) != 3 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn exit_info(status: std::process::ExitStatus) -> ExitInfo {
    use std::os::unix::process::ExitStatusExt;
    ExitInfo {
        code: status.code(),
        signal: status.signal(),
    }
}

fn classify(exit: Option<&ExitInfo>) -> (WorkerStatus, String) {
    match exit {
        Some(ExitInfo { code: Some(0), .. }) => {
            (WorkerStatus::Stopped, "exited with status 0".to_string())
        }
        Some(ExitInfo { code: Some(c), .. }) => {
            (WorkerStatus::Failed, format!("exited with status {c}"))
        }
        Some(ExitInfo {
            signal: Some(s), ..
        }) => (WorkerStatus::Failed, format!("killed by signal {s}")),
        _ => (
            WorkerStatus::Failed,
            "ended without an exit status".to_string(),
        ),
    }
}

/// The worker's command: its program (a program with a slash is workspace-relative), its
/// arguments (and its initial input, for profiles that take it there), a cleared environment
/// holding only the base variables, gaffer's own, the request's extra variables and the
/// granted secrets, the channel as fd 3 when there is one, stdin piped (or null for profiles
/// that take their input as an argument), output piped, and the sandbox its declarations ask
/// for.
fn command_for(req: &SpawnRequest<'_>) -> Result<Command, String> {
    let argv = &req.profile.command;
    // A program given with a slash is workspace-relative; resolve it explicitly, since how a
    // relative program combines with `current_dir` is left to the platform.
    let program = if argv[0].contains('/') {
        req.workspace_root.join(&argv[0])
    } else {
        std::path::PathBuf::from(&argv[0])
    };
    let mut cmd = Command::new(program);
    cmd.args(&argv[1..]);
    if req.profile.input_mode == InputMode::Argument
        && let Some(input) = req.initial_input
    {
        cmd.arg(flatten(input));
    }
    cmd.current_dir(req.workspace_root);
    cmd.env_clear();
    for name in BASE_ENV {
        if let Some(v) = std::env::var_os(name) {
            cmd.env(name, v);
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", absolute_path_entries(&path));
    }
    cmd.env("GAFFER_WORKER_ID", req.worker_id);
    cmd.env("GAFFER_PROFILE", req.profile.selector.value());
    for (name, value) in req.env {
        cmd.env(name, value);
    }
    for secret in req.secrets {
        cmd.env(&secret.env, &secret.value);
    }
    if let Some(fd) = req.channel {
        inherit_as_fd3(&mut cmd, fd);
    }
    let takes_stdin = req.profile.input_mode != InputMode::Argument;
    cmd.stdin(if takes_stdin {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    cmd.stdout(Stdio::piped());
    cmd.stderr(Stdio::piped());
    cmd.kill_on_drop(true);
    let spec = crate::sandbox::from_declarations(req.workspace_root, req.declarations)
        .map_err(|e| e.to_string())?
        .with_timeout_ms(req.profile.timeout_ms);
    crate::sandbox::confine(&mut cmd, &spec, req.sandbox).map_err(|e| e.to_string())?;
    Ok(cmd)
}

/// `PATH` without its relative entries (an empty one means the current directory): a worker
/// starts in the workspace root, so a bare program name would otherwise find a file the agent
/// wrote there before the program the profile names. With none left, the system's (an empty
/// `PATH` would itself mean the current directory).
fn absolute_path_entries(path: &std::ffi::OsStr) -> std::ffi::OsString {
    const SYSTEM: &str = "/usr/local/bin:/usr/bin:/bin";
    let kept: Vec<std::path::PathBuf> = std::env::split_paths(path)
        .filter(|p| p.is_absolute())
        .collect();
    match std::env::join_paths(kept) {
        Ok(p) if !p.is_empty() => p,
        _ => SYSTEM.into(),
    }
}

/// The sender of a task writing what is sent to the worker's stdin, in order; the task ends
/// when the pipe closes or every sender is dropped.
fn stdin_writer(mut stdin: tokio::process::ChildStdin) -> mpsc::UnboundedSender<Vec<u8>> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        while let Some(bytes) = rx.recv().await {
            if stdin.write_all(&bytes).await.is_err() || stdin.flush().await.is_err() {
                break;
            }
        }
    });
    tx
}

/// Tasks passing the worker's stdout and stderr on as events.
fn pump_outputs(
    child: &mut tokio::process::Child,
    worker_id: &str,
    events: &mpsc::UnboundedSender<ExecEvent>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(tokio::spawn(pump(
            out,
            worker_id.to_string(),
            Stream::Stdout,
            events.clone(),
        )));
    }
    if let Some(err) = child.stderr.take() {
        readers.push(tokio::spawn(pump(
            err,
            worker_id.to_string(),
            Stream::Stderr,
            events.clone(),
        )));
    }
    readers
}

async fn pump<R: tokio::io::AsyncRead + Unpin>(
    mut reader: R,
    worker_id: String,
    stream: Stream,
    events: mpsc::UnboundedSender<ExecEvent>,
) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let ev = ExecEvent::Output {
                    worker_id: worker_id.clone(),
                    stream,
                    bytes: buf[..n].to_vec(),
                };
                if events.send(ev).is_err() {
                    break;
                }
            }
        }
    }
}

trait KindDescription {
    fn kind_description(&self) -> String;
}

impl KindDescription for std::io::Error {
    /// The error without OS paths: only its kind.
    fn kind_description(&self) -> String {
        match self.kind() {
            std::io::ErrorKind::NotFound => "program not found".to_string(),
            std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
            k => format!("{k}"),
        }
    }
}

#[cfg(test)]
mod tests;
