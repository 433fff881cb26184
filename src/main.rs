//! The `gaffer` binary: logging setup and command dispatch. stdout carries protocol (or a
//! command's JSON output) only; logs go to stderr or `--log-file`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use gaffer::cli::{Cli, Command, Global, ServeArgs};
use gaffer::methods::{self, App, AppConfig, Server};
use gaffer::rpc::Role;
use gaffer::rpc::session::{self, ProfileChoice};
use tracing_subscriber::EnvFilter;

fn init_logging(g: &Global) -> Result<(), String> {
    let filter = g
        .log_level
        .clone()
        .or_else(|| std::env::var("GAFFER_LOG").ok())
        .unwrap_or_else(|| "warn".to_string());
    let filter =
        EnvFilter::try_new(&filter).map_err(|e| format!("bad --log-level {filter:?}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false);
    match &g.log_file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("cannot open log file {}: {e}", path.display()))?;
            builder.with_writer(Arc::new(file)).init();
        }
        None => builder.with_writer(std::io::stderr).init(),
    }
    Ok(())
}

fn config(g: &Global) -> AppConfig {
    AppConfig {
        workspace: g.workspace.clone(),
        patterns_policy: g.patterns_policy.clone(),
        client_token: gaffer::clients::token_from_env(),
        without_providers: false,
    }
}

fn root_of(g: &Global) -> PathBuf {
    g.workspace
        .clone()
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_else(|| PathBuf::from("."))
}

fn main() -> ExitCode {
    gaffer::runtime::tune_allocator();
    let cli = Cli::from_env();
    if let Err(e) = init_logging(&cli.global) {
        eprintln!("gaffer: {e}");
        return ExitCode::from(2);
    }
    let runtime = match gaffer::runtime::builder().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gaffer: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run(cli));
    // Background readers (stdin) must not keep the process alive after the session ended.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    gaffer::peers::remove_at_exit();
    code
}

async fn run(cli: Cli) -> ExitCode {
    let g = cli.global;
    match cli.command.unwrap_or(Command::Serve(ServeArgs::default())) {
        Command::Serve(args) => serve(&g, args).await,
        Command::Store(cmd) => gaffer::cli::store::run(cmd, &root_of(&g)).await,
        Command::Schema { out, check } => schema(&out, check),
        Command::Patterns(cmd) => {
            gaffer::cli::patterns::run(cmd, &root_of(&g), g.patterns_policy.as_deref())
        }
        Command::Doctor => doctor(&root_of(&g)),
        Command::Bundle(cmd) => gaffer::cli::bundles::run(cmd, &root_of(&g), config(&g)).await,
        Command::Worker(cmd) => gaffer::cli::workers::run(cmd, &root_of(&g), config(&g)).await,
        Command::Plan(cmd) => gaffer::cli::plans::run(cmd, &root_of(&g), config(&g)).await,
        Command::Call { method, params } => call(&g, &method, &params).await,
        Command::Ops(cmd) => gaffer::cli::operations::run(cmd, &root_of(&g)).await,
    }
}

async fn serve(g: &Global, args: ServeArgs) -> ExitCode {
    let choice = if args.lsp {
        ProfileChoice::Lsp
    } else if args.mcp {
        ProfileChoice::Mcp
    } else if args.jsonl {
        ProfileChoice::Jsonl
    } else {
        ProfileChoice::Auto
    };
    // A workspace named on the command line must exist: a server that cannot open it would
    // only fail every request.
    if let Some(ws) = &g.workspace
        && !ws.is_dir()
    {
        eprintln!(
            "gaffer: --workspace {} is not a directory; create it or name another",
            ws.display()
        );
        return ExitCode::from(2);
    }
    let host = Arc::new(Server { config: config(g) });
    let router = Arc::new(methods::router());
    let (input, output) = stdio();
    match session::serve(host, router, choice, input, output).await {
        Ok(end) => ExitCode::from(end.exit_code as u8),
        Err(e) => {
            tracing::error!(error = %e, "session failed");
            ExitCode::FAILURE
        }
    }
}

type Input = Box<dyn tokio::io::AsyncRead + Unpin + Send>;
type Output = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;

/// stdin/stdout as async streams. When they are pipes (how editors and agent hosts start us)
/// they are driven directly by the reactor; otherwise (files, terminals) through tokio's
/// blocking-thread adapters. The direct path saves two thread hops per message.
fn stdio() -> (Input, Output) {
    use std::os::fd::AsFd;
    use tokio::net::unix::pipe;
    let input: Input = match std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| pipe::Receiver::from_owned_fd(fd).ok())
    {
        Some(rx) => Box::new(rx),
        None => Box::new(tokio::io::stdin()),
    };
    let output: Output = match std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| pipe::Sender::from_owned_fd(fd).ok())
    {
        Some(tx) => {
            widen_pipe(&tx);
            Box::new(tx)
        }
        None => Box::new(tokio::io::stdout()),
    };
    (input, output)
}

/// Asks for a 1 MiB buffer on the reply pipe (the default is 64 KiB): a selection reply of a
/// few hundred KiB then goes out in one write instead of a write, a wait for the client to
/// drain, and a wake-up per 64 KiB. The kernel takes the pages only as bytes are in flight;
/// a refusal (a lower `pipe-max-size`, the user's pipe quota) leaves the default.
fn widen_pipe(fd: &impl std::os::fd::AsRawFd) {
    #[cfg(target_os = "linux")]
    // SAFETY: fcntl on a descriptor this process owns; no pointers.
    unsafe {
        libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, REPLY_PIPE_BYTES);
    }
}

/// The reply pipe's buffer when the kernel allows it (`/proc/sys/fs/pipe-max-size` is 1 MiB by
/// default).
#[cfg(target_os = "linux")]
const REPLY_PIPE_BYTES: libc::c_int = 1 << 20;

fn schema(out: &Path, check: bool) -> ExitCode {
    if check {
        let stale = methods::schema::stale(out);
        if stale.is_empty() {
            return ExitCode::SUCCESS;
        }
        for s in stale {
            eprintln!("stale: {}", out.join(s).display());
        }
        eprintln!("run `gaffer schema` to regenerate");
        return ExitCode::FAILURE;
    }
    match methods::schema::write(out) {
        Ok(n) => {
            eprintln!("wrote {n} schema files to {}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gaffer: schema: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn call(g: &Global, method: &str, params: &str) -> ExitCode {
    let params: serde_json::Value = match serde_json::from_str(params) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("gaffer: params are not JSON: {e}");
            return ExitCode::from(2);
        }
    };
    let app = match App::open(&root_of(g), config(g)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("gaffer: {e}");
            return ExitCode::FAILURE;
        }
    };
    match methods::call_local(app, Role::Agent, method, params).await {
        Ok(v) => {
            gaffer::outln!("{}", gaffer::cli::output::json(&v));
            ExitCode::SUCCESS
        }
        Err(e) => {
            gaffer::outln!(
                "{}",
                gaffer::cli::output::json_line(&serde_json::json!({ "error": e }))
            );
            ExitCode::FAILURE
        }
    }
}

fn doctor(root: &Path) -> ExitCode {
    let report = gaffer::cli::doctor::run(root);
    gaffer::outln!("{}", gaffer::cli::output::json(&report));
    if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
