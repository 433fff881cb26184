//! `gaffer bundle sync FILE | check ID DIGEST | list`: thin wrappers over the bundle methods.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Subcommand;
use serde_json::{Value, json};

use crate::methods::{self, App, AppConfig};
use crate::rpc::Role;

/// Prints a line on stdout; a closed pipe (e.g. `| head`) is not an error worth a panic.
macro_rules! emit {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}
pub(crate) use emit;

#[derive(Debug, Subcommand)]
pub enum BundleCmd {
    /// Validate and store a bundle from a JSON or YAML file; prints its reference and summary.
    Sync {
        /// The bundle file (`-` reads standard input).
        file: PathBuf,
    },
    /// Check that a bundle id is synced with this digest.
    Check { id: String, digest: String },
    /// List the bundles synced to this workspace.
    List,
}

/// Opens the workspace at `root` for a one-shot command.
pub fn open(root: &Path, config: AppConfig) -> Result<Arc<App>, ExitCode> {
    App::open(root, config).map_err(|e| {
        eprintln!("gaffer: {e}");
        ExitCode::FAILURE
    })
}

/// Calls `method` in process and prints the result (or the error) as JSON.
pub async fn print_call(app: Arc<App>, method: &str, params: Value) -> ExitCode {
    print_call_as(app, Role::Agent, method, params).await
}

/// [`print_call`] in the role `role` (the operator's, where its key loads).
pub async fn print_call_as(app: Arc<App>, role: Role, method: &str, params: Value) -> ExitCode {
    match methods::call_local(app, role, method, params).await {
        Ok(v) => {
            emit!("{}", super::output::json(&v));
            ExitCode::SUCCESS
        }
        Err(e) => {
            emit!("{}", super::output::json_line(&json!({ "error": e })));
            ExitCode::FAILURE
        }
    }
}

/// Reads a bundle file as text (`-` for standard input).
pub fn read_bundle_file(file: &Path) -> Result<String, ExitCode> {
    let text = if file == Path::new("-") {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(file)
    };
    text.map_err(|e| {
        eprintln!("gaffer: cannot read {}: {e}", file.display());
        ExitCode::from(2)
    })
}

pub async fn run(cmd: BundleCmd, root: &Path, config: AppConfig) -> ExitCode {
    let app = match open(root, config) {
        Ok(a) => a,
        Err(code) => return code,
    };
    match cmd {
        BundleCmd::Sync { file } => match read_bundle_file(&file) {
            Ok(text) => print_call(app, "bundles/sync", json!({ "text": text })).await,
            Err(code) => code,
        },
        BundleCmd::Check { id, digest } => {
            print_call(app, "bundles/check", json!({ "id": id, "digest": digest })).await
        }
        BundleCmd::List => print_call(app, "bundles/list", json!({})).await,
    }
}
