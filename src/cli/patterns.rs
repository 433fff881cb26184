//! `gaffer patterns …`: the worker-pattern selector on the command line, mirroring the
//! reference CLI (`worker-pattern`): request commands print dry-run plans, `validate-roster`,
//! `init-config` and `doctor` help set up a roster. Nothing here executes work: `--execute` is
//! reserved and fails closed.
//!
//! Exit codes: 0 success; 1 a failed check (`doctor`, `validate-roster`), an unusable policy or
//! a refused write; 2 bad arguments or an invalid request (named field), `--execute`, or a
//! task-graph command without `--dry-run`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;
use serde_json::{Value, json};

use crate::methods::patterns::{cached_policy, roster_origin_label};
use crate::patterns::roster::{self, ROSTER_TEMPLATE, RosterEnv};
use crate::patterns::{self, OutputKind, SelectContext, TextForm, build_plan};

#[derive(Debug, Subcommand)]
pub enum PatternsCmd {
    /// Select a pattern and print the plan (JSON, or a summary with --text).
    Select(RequestArgs),
    /// Print the prompt contract every lane works under (text).
    Render(RequestArgs),
    /// Print the per-lane prompt bundle (JSON, or the prompt contract with --text).
    RenderPrompts(RequestArgs),
    /// Print the dry-run ephemeral-worker spec (JSON).
    RenderEphemeralWorkers(RequestArgs),
    /// Deprecated name of render-ephemeral-workers.
    RenderDelegate(RequestArgs),
    /// Print the dry-run persistent-worker spec (JSON).
    RenderPersistentWorkers(RequestArgs),
    /// Deprecated name of render-persistent-workers.
    RenderSwarm(RequestArgs),
    /// Print the dry-run task graph (JSON); requires --dry-run.
    RenderTaskGraph(RequestArgs),
    /// Deprecated name of render-task-graph; requires --dry-run.
    RenderKanban(RequestArgs),
    /// Print the dry-run execution plan (JSON).
    RenderExecutionPlan(RequestArgs),
    /// Check a roster file; exit 1 when it has errors.
    ValidateRoster {
        /// Roster YAML file.
        path: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print (or write with --write) a roster template.
    InitConfig {
        /// Where to write (default: .gaffer/roster.yaml in the workspace).
        #[arg(long, value_name = "PATH")]
        target: Option<PathBuf>,
        /// Write the file instead of printing it.
        #[arg(long)]
        write: bool,
        /// Only print, even with --write.
        #[arg(long)]
        dry_run: bool,
        /// Overwrite an existing file.
        #[arg(long)]
        force: bool,
    },
    /// Read-only checks of the selector setup (policy, roster, deprecated variables).
    Doctor {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Check this roster instead of the configured one.
        #[arg(long, value_name = "PATH")]
        roster: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Risk {
    Low,
    Normal,
    High,
    Critical,
}

impl Risk {
    fn as_str(self) -> &'static str {
        match self {
            Risk::Low => "low",
            Risk::Normal => "normal",
            Risk::High => "high",
            Risk::Critical => "critical",
        }
    }
}

/// The request options shared by every request command.
#[derive(Debug, Clone, Args)]
pub struct RequestArgs {
    /// What the work should achieve.
    pub objective: String,
    /// A scope the work touches (repeatable).
    #[arg(long = "scope", value_name = "SCOPE")]
    pub scopes: Vec<String>,
    /// An ordered prerequisite (repeatable).
    #[arg(long = "dependency", value_name = "DEP")]
    pub dependencies: Vec<String>,
    #[arg(long, value_enum, default_value = "normal")]
    pub risk: Risk,
    /// Force independent review on (wins over --no-review).
    #[arg(long)]
    pub review_required: bool,
    /// Turn the default independent review off.
    #[arg(long)]
    pub no_review: bool,
    /// Ask for test evidence.
    #[arg(long)]
    pub tests_required: bool,
    /// Number of alternative designs wanted.
    #[arg(
        long,
        default_value_t = 0,
        allow_negative_numbers = true,
        value_name = "N"
    )]
    pub variant_count: i64,
    /// Track the work as a durable task graph.
    #[arg(long)]
    pub durable: bool,
    /// Map lanes onto named workers from the roster.
    #[arg(long)]
    pub persistent_workers: bool,
    /// The work repairs or resumes something that failed.
    #[arg(long)]
    pub recovery: bool,
    /// Most lanes that may run at once.
    #[arg(
        long,
        default_value_t = 4,
        allow_negative_numbers = true,
        value_name = "N"
    )]
    pub max_parallel_lanes: i64,
    /// A note; `pattern:<name>` forces a pattern (repeatable).
    #[arg(long = "note", value_name = "NOTE")]
    pub notes: Vec<String>,
    /// Roster YAML to map persistent workers from (instead of the configured one).
    #[arg(long, value_name = "FILE")]
    pub roster: Option<PathBuf>,
    /// Print text instead of JSON where the command has a text form.
    #[arg(long, conflicts_with = "json")]
    pub text: bool,
    /// Print JSON (the default).
    #[arg(long)]
    pub json: bool,
    /// Confirms that only a dry run is wanted (required by the task-graph commands).
    #[arg(long)]
    pub dry_run: bool,
    /// Reserved: gaffer never executes plans from here, so this always fails.
    #[arg(long)]
    pub execute: bool,
}

impl RequestArgs {
    fn params(&self, output: OutputKind) -> Value {
        let mut p = json!({
            "objective": self.objective,
            "scopes": self.scopes,
            "dependencies": self.dependencies,
            "risk_level": self.risk.as_str(),
            "review_required": self.review_required || !self.no_review,
            "tests_required": self.tests_required,
            "variants_requested": self.variant_count,
            "durable": self.durable,
            "persistent_workers": self.persistent_workers,
            "recovery": self.recovery,
            "max_parallel_lanes": self.max_parallel_lanes,
            "notes": self.notes,
            "output": output.as_str(),
        });
        if let Some(r) = &self.roster {
            p["roster_path"] = json!(absolute(r).display().to_string());
        }
        p
    }
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

/// What a request command prints.
#[derive(Clone, Copy)]
enum Print {
    /// A key of the wrapper, as pretty JSON.
    Json(OutputKind, &'static str),
    Text(TextForm),
}

pub fn run(cmd: PatternsCmd, workspace: &Path, policy_file: Option<&Path>) -> ExitCode {
    use PatternsCmd::*;
    let (args, print, deprecated, needs_dry_run) = match cmd {
        ValidateRoster { path, json } => return validate_roster(&path, json),
        InitConfig {
            target,
            write,
            dry_run,
            force,
        } => return init_config(workspace, target, write && !dry_run, force),
        Doctor { json, roster } => return doctor(workspace, policy_file, roster.as_deref(), json),
        Select(a) => {
            let print = if a.text {
                Print::Text(TextForm::Summary)
            } else {
                Print::Json(OutputKind::Select, "plan")
            };
            (a, print, None, false)
        }
        Render(a) => (a, Print::Text(TextForm::PromptContract), None, false),
        RenderPrompts(a) => {
            let print = if a.text {
                Print::Text(TextForm::PromptContract)
            } else {
                Print::Json(OutputKind::PromptBundle, "prompt_bundle")
            };
            (a, print, None, false)
        }
        RenderEphemeralWorkers(a) => (
            a,
            Print::Json(OutputKind::EphemeralWorkers, "ephemeral_workers"),
            None,
            false,
        ),
        RenderDelegate(a) => (
            a,
            Print::Json(OutputKind::EphemeralWorkers, "ephemeral_workers"),
            Some(("render-delegate", "render-ephemeral-workers")),
            false,
        ),
        RenderPersistentWorkers(a) => (
            a,
            Print::Json(OutputKind::PersistentWorkers, "persistent_workers"),
            None,
            false,
        ),
        RenderSwarm(a) => (
            a,
            Print::Json(OutputKind::PersistentWorkers, "persistent_workers"),
            Some(("render-swarm", "render-persistent-workers")),
            false,
        ),
        RenderTaskGraph(a) => (
            a,
            Print::Json(OutputKind::TaskGraph, "task_graph"),
            None,
            true,
        ),
        RenderKanban(a) => (
            a,
            Print::Json(OutputKind::TaskGraph, "task_graph"),
            Some(("render-kanban", "render-task-graph")),
            true,
        ),
        RenderExecutionPlan(a) => (
            a,
            Print::Json(OutputKind::ExecutionPlan, "execution_plan"),
            None,
            false,
        ),
    };
    if let Some((old, new)) = deprecated {
        eprintln!("gaffer patterns: warning: `{old}` is deprecated; use `{new}`");
    }
    if args.execute {
        eprintln!(
            "gaffer patterns: --execute is reserved and fails closed: gaffer only plans; run lanes through your runtime"
        );
        return ExitCode::from(2);
    }
    if needs_dry_run && !args.dry_run {
        eprintln!(
            "gaffer patterns: this command only renders a dry-run task graph; pass --dry-run to confirm"
        );
        return ExitCode::from(2);
    }
    request(workspace, policy_file, &args, print)
}

fn request(
    workspace: &Path,
    policy_file: Option<&Path>,
    args: &RequestArgs,
    print: Print,
) -> ExitCode {
    let ctx = match context(workspace, policy_file) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let output = match print {
        Print::Json(kind, _) => kind,
        Print::Text(_) => OutputKind::Select,
    };
    let params = args.params(output);
    let parsed = match patterns::parse_params(&params) {
        Ok(p) => p,
        Err(e) => return invalid(&e),
    };
    let outcome = match build_plan(&parsed.request, parsed.roster_path.as_deref(), &ctx) {
        Ok(o) => o,
        Err(e) => return invalid(&e),
    };
    for d in &outcome.diagnostics {
        eprintln!("gaffer patterns: note: {d}");
    }
    let text = match print {
        Print::Text(form) => patterns::render::render_text_form(&outcome, form),
        Print::Json(kind, key) => {
            let wrapped =
                match serde_json::to_value(patterns::render::render_output(&outcome, kind)) {
                    Ok(v) => v,
                    Err(e) => {
                        eprintln!("gaffer patterns: cannot encode the result: {e}");
                        return ExitCode::FAILURE;
                    }
                };
            // Sorted keys, two-space indent, no trailing newline, as the reference prints.
            super::output::json(&wrapped[key])
        }
    };
    emit(&text)
}

fn emit(text: &str) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gaffer patterns: cannot write output: {e}");
            ExitCode::FAILURE
        }
    }
}

fn invalid(e: &patterns::PatternError) -> ExitCode {
    eprintln!("gaffer patterns: invalid `{}`: {}", e.field, e.message);
    ExitCode::from(2)
}

fn context(workspace: &Path, policy_file: Option<&Path>) -> Result<SelectContext, ExitCode> {
    match cached_policy(workspace, policy_file) {
        Ok(policy) => Ok(SelectContext::for_workspace(workspace, policy)),
        Err((path, e)) => {
            eprintln!(
                "gaffer patterns: the selection policy {} is invalid at `{}`: {}",
                path.display(),
                e.key,
                e.message
            );
            Err(ExitCode::FAILURE)
        }
    }
}

fn validate_roster(path: &Path, as_json: bool) -> ExitCode {
    let report = roster::validate_roster(path);
    let text = if as_json {
        super::output::json(&report) + "\n"
    } else {
        let mut t = format!(
            "{} roster {} ({} worker{})\n",
            if report.ok { "OK" } else { "FAIL" },
            report.path,
            report.worker_count,
            if report.worker_count == 1 { "" } else { "s" }
        );
        for e in &report.errors {
            t.push_str(&format!("  error: {e}\n"));
        }
        for w in &report.warnings {
            t.push_str(&format!("  warning: {w}\n"));
        }
        t
    };
    let code = emit(&text);
    if report.ok { code } else { ExitCode::FAILURE }
}

fn init_config(workspace: &Path, target: Option<PathBuf>, write: bool, force: bool) -> ExitCode {
    let target = target.unwrap_or_else(|| workspace.join(".gaffer").join("roster.yaml"));
    if !write {
        return emit(ROSTER_TEMPLATE);
    }
    if let Some(parent) = target.parent().filter(|p| !p.as_os_str().is_empty())
        && let Err(e) = std::fs::create_dir_all(parent)
    {
        eprintln!("gaffer patterns: cannot create {}: {e}", parent.display());
        return ExitCode::FAILURE;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true);
    if force {
        options.create(true).truncate(true);
    } else {
        // create_new makes the refusal atomic: an existing file is never touched.
        options.create_new(true);
    }
    let result = options.open(&target).and_then(|mut f| {
        f.write_all(ROSTER_TEMPLATE.as_bytes())
            .and_then(|()| f.sync_all())
    });
    match result {
        Ok(()) => {
            crate::outln!("wrote a roster template to {}", target.display());
            ExitCode::SUCCESS
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            eprintln!(
                "gaffer patterns: {} already exists; refusing to overwrite it (pass --force to replace it)",
                target.display()
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("gaffer patterns: cannot write {}: {e}", target.display());
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, Serialize)]
struct DoctorReport {
    ok: bool,
    checks: serde_json::Map<String, Value>,
    warnings: Vec<String>,
}

/// The policy files the selector would use, and whether they load.
fn policy_check(workspace: &Path, policy_file: Option<&Path>) -> (Option<bool>, String) {
    let source = policy_file
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| {
            let f = workspace
                .join(".gaffer")
                .join(patterns::policy::WORKSPACE_POLICY_FILE);
            if f.is_file() {
                f.display().to_string()
            } else {
                "built-in policy".to_owned()
            }
        });
    match cached_policy(workspace, policy_file) {
        Ok(_) => (Some(true), source),
        Err((path, e)) => (
            Some(false),
            format!(
                "{} is invalid at `{}`: {}",
                path.display(),
                e.key,
                e.message
            ),
        ),
    }
}

/// The roster lanes would be placed from (given, or found as selection finds it), and
/// whether it validates; no verdict when none is configured.
fn roster_check(workspace: &Path, roster_arg: Option<&Path>) -> (Option<bool>, String) {
    let target = match roster_arg {
        Some(p) => Some((
            p.display().to_string(),
            p.to_path_buf(),
            "given path".to_owned(),
        )),
        None => {
            let ctx = SelectContext::for_workspace(workspace, patterns::Policy::builtin());
            roster::locate(None, &ctx).map(|loc| {
                let origin = roster_origin_label(&loc.origin);
                (loc.shown, loc.path, origin)
            })
        }
    };
    let Some((shown, path, origin)) = target else {
        return (
            None,
            "not configured (optional: lanes keep logical profile names)".to_owned(),
        );
    };
    let report = roster::validate_roster_at(&shown, &path);
    if report.ok {
        (
            Some(true),
            format!("{shown} ({origin}), {} workers", report.worker_count),
        )
    } else {
        (
            Some(false),
            format!("{shown} ({origin}): {}", report.errors.join("; ")),
        )
    }
}

/// The doctor's report as lines of text, with what to do next.
fn doctor_text(report: &DoctorReport) -> String {
    let mut t = String::new();
    for (k, v) in &report.checks {
        t.push_str(&format!("{k}: {}\n", v.as_str().unwrap_or_default()));
    }
    for w in &report.warnings {
        t.push_str(&format!("warning: {w}\n"));
    }
    t.push_str("Nothing was launched and no runtime setting was changed.\n");
    t.push_str(if report.ok {
        "Next: `gaffer patterns select \"<objective>\"` to plan a task.\n"
    } else {
        "Next: fix the failed checks above, then run doctor again.\n"
    });
    t
}

fn doctor(
    workspace: &Path,
    policy_file: Option<&Path>,
    roster_arg: Option<&Path>,
    as_json: bool,
) -> ExitCode {
    let mut checks = serde_json::Map::new();
    let mut ok = true;
    let mut check = |name: &str, passed: Option<bool>, detail: String| {
        let label = match passed {
            Some(true) => format!("OK: {detail}"),
            Some(false) => {
                ok = false;
                format!("FAIL: {detail}")
            }
            None => detail,
        };
        checks.insert(name.to_owned(), json!(label));
    };
    check(
        "Package",
        Some(true),
        format!("gaffer {}", env!("CARGO_PKG_VERSION")),
    );
    let (passed, detail) = policy_check(workspace, policy_file);
    check("Policy files", passed, detail);
    check(
        "MCP entrypoint",
        Some(true),
        "gaffer serve --mcp".to_owned(),
    );
    let (passed, detail) = roster_check(workspace, roster_arg);
    check("Roster", passed, detail);
    check("Credentials", None, "not required".to_owned());
    check(
        "Runtime launch",
        None,
        "not attempted (plans only)".to_owned(),
    );
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    check("Import path", None, exe);
    let warnings: Vec<String> = RosterEnv::from_process()
        .deprecated_in_use()
        .into_iter()
        .map(|var| format!("{var} is deprecated; use the WORKER_PATTERNS_* variable instead"))
        .collect();
    let report = DoctorReport {
        ok,
        checks,
        warnings,
    };
    let text = if as_json {
        super::output::json(&report) + "\n"
    } else {
        doctor_text(&report)
    };
    let code = emit(&text);
    if report.ok { code } else { ExitCode::FAILURE }
}
