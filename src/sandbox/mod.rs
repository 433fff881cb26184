//! What every process gaffer starts runs inside (workers, `command.run`, external providers).
//!
//! On Linux, between fork and exec the child
//! 1. enters new user, mount and PID namespaces (and a new network namespace unless a
//!    declaration grants TCP ports), mapping its own uid/gid; the program runs as PID 2 under
//!    an init that ends the namespace, and every process in it, when the program ends
//!    ([`pidns`]);
//! 2. covers `<workspace>/.gaffer/` with an empty read-only tmpfs, so the store can be neither
//!    read nor written, then enters its working directory again by path (the directory the
//!    spawn entered may be the store itself, reached through a symlink swapped in after
//!    gaffer checked the path, and no mount covers a directory a process is already in);
//! 3. gets rlimits (CPU time from its timeout, file size, process count), its own process
//!    group (set by the caller) and SIGKILL when its gaffer dies;
//! 4. in the program, mounts a procfs of its own PID namespace over `/proc`, so no host
//!    process (its command line, its status) is listed there;
//! 5. restricts the program with Landlock: read-write on the workspace, read+execute on system
//!    paths, nothing else (the user's config dir with the operator key, the rest of `$HOME`,
//!    `/tmp`) unless a `mount_grant` declares it; TCP bind/connect only to declared ports;
//!    scoped so it can neither signal gaffer nor reach abstract unix sockets outside.
//!
//! Where the kernel cannot do this, [`probe`] says why and processes are refused.

mod declare;
mod exec;
mod pidns;
mod rules;

use std::path::{Path, PathBuf};

pub use declare::{check_declarations, from_declarations, resolve_grant};

/// Landlock ABI needed: 6 adds signal and abstract-socket scoping.
pub const MIN_ABI: i32 = 6;
/// Largest file a sandboxed process may write.
pub const FILE_SIZE_LIMIT: u64 = 1 << 30;
/// Processes (per sandbox user namespace) a sandboxed process may have.
pub const PROCESS_LIMIT: u64 = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxError {
    #[error("the sandbox is unavailable: {0}")]
    Unavailable(String),
    #[error("declaration `{name}`: {why}")]
    Declaration { name: String, why: String },
    #[error("the sandbox could not be set up: {0}")]
    Setup(String),
}

/// A path a declaration grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub path: PathBuf,
    pub write: bool,
}

/// How much of the workspace a sandboxed process may reach (`.gaffer/` is covered whatever
/// this says).
/// Spelled `write`, `read` and `none` in a provider's declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceAccess {
    /// Read, write and execute: workers and commands work there.
    #[default]
    #[serde(rename = "write")]
    ReadWrite,
    /// Read and execute only.
    Read,
    /// Nothing: not even a file's existence can be read, so nothing the agent writes there
    /// can become this process's code (an external provider by default).
    None,
}

/// What one process may reach.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Spec {
    pub workspace: PathBuf,
    pub workspace_access: WorkspaceAccess,
    pub grants: Vec<Grant>,
    /// TCP ports it may connect to; empty means no network at all.
    pub tcp_connect: Vec<u16>,
    /// CPU seconds (from the run's timeout).
    pub cpu_seconds: Option<u64>,
}

impl Spec {
    pub fn new(workspace: &Path) -> Spec {
        Spec {
            workspace: workspace.to_path_buf(),
            ..Spec::default()
        }
    }

    pub fn with_timeout_ms(mut self, ms: Option<u64>) -> Spec {
        self.cpu_seconds = ms.map(|ms| ms.div_ceil(1000) + 1);
        self
    }
}

/// What this kernel offers, for `doctor` and for refusing early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Support {
    pub landlock_abi: i32,
    pub user_namespaces: bool,
    /// A sandbox can mount a procfs of its own PID namespace over `/proc`.
    pub own_proc: bool,
}

impl Support {
    pub fn problem(&self) -> Option<String> {
        if self.landlock_abi < MIN_ABI {
            return Some(format!(
                "Landlock ABI {} (need {MIN_ABI}: filesystem, TCP and scope rules)",
                self.landlock_abi
            ));
        }
        if !self.user_namespaces {
            return Some("unprivileged user namespaces are not available".into());
        }
        None
    }
}

/// Asks the kernel what it supports (cheap, but for whether a sandbox can mount a `/proc` of
/// its own: that is tried once per process, in a throwaway child).
pub fn probe() -> Support {
    let landlock_abi = rules::kernel_abi();
    let user_namespaces = exec::user_namespaces_work();
    Support {
        landlock_abi,
        user_namespaces,
        own_proc: user_namespaces && exec::own_proc_works(),
    }
}

/// What the operator's trusted policy says about the sandbox (`sandbox: off`, or
/// `shared_proc`); an untrusted policy never loosens it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Setting {
    #[default]
    Required,
    /// `sandbox: shared_proc`: sandboxed, but where the kernel refuses the sandbox a `/proc` of
    /// its own (a container that masks parts of its `/proc`), the host's stays visible (every
    /// process's command line and status; never their memory, environment or descriptors).
    SharedProc,
    /// The operator's trusted policy says `sandbox: off`.
    Off,
}

/// How a process is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confinement {
    /// `own_proc`: the program gets a `/proc` of its own PID namespace, and fails to start
    /// without it; false only under `sandbox: shared_proc` on a kernel that refuses one.
    Sandboxed { own_proc: bool },
    /// Only its own process group and death with gaffer: the trusted policy turned it off.
    Unconfined,
}

/// Whether a process may start and how, given what the kernel offers: sandboxed unless the
/// trusted policy turned the sandbox off; refused when it is required and cannot be had.
pub fn decide(setting: Setting, support: &Support) -> Result<Confinement, SandboxError> {
    let refused = |p: String| {
        Err(SandboxError::Unavailable(format!(
            "{p}; gaffer starts no process without it unless the operator's trusted policy says `sandbox: off`"
        )))
    };
    match (setting, support.problem()) {
        (Setting::Off, _) => Ok(Confinement::Unconfined),
        (_, Some(p)) => refused(p),
        (Setting::Required, None) if !support.own_proc => refused(format!(
            "{NO_OWN_PROC} (`sandbox: shared_proc` in the trusted policy accepts the host's, command lines of every process included)"
        )),
        (Setting::Required, None) => Ok(Confinement::Sandboxed { own_proc: true }),
        (Setting::SharedProc, None) => Ok(Confinement::Sandboxed {
            own_proc: support.own_proc,
        }),
    }
}

/// Why a sandbox would see the host's `/proc`.
pub const NO_OWN_PROC: &str = "the kernel refuses a sandbox a /proc of its own (a container that masks parts of its /proc does)";

/// Confines `cmd` to `spec` as [`decide`] says for this kernel. Fails (and the caller starts
/// nothing) when the sandbox is required and the kernel lacks what it needs.
pub fn confine(
    cmd: &mut tokio::process::Command,
    spec: &Spec,
    setting: Setting,
) -> Result<Confinement, SandboxError> {
    let how = decide(setting, &probe())?;
    match how {
        Confinement::Sandboxed { own_proc } => {
            let ruleset = rules::build(spec)?;
            let cwd = cmd.as_std().get_current_dir().map(Path::to_path_buf);
            let child = exec::ChildSetup::new(spec, own_proc, cwd.as_deref())?;
            exec::install(cmd, child, ruleset);
        }
        Confinement::Unconfined => exec::install_lifetime_only(cmd),
    }
    Ok(how)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(landlock_abi: i32, user_namespaces: bool, own_proc: bool) -> Support {
        Support {
            landlock_abi,
            user_namespaces,
            own_proc,
        }
    }

    #[test]
    fn without_the_sandbox_nothing_starts_unless_the_trusted_policy_turned_it_off() {
        let full = kernel(MIN_ABI, true, true);
        let own = Ok(Confinement::Sandboxed { own_proc: true });
        assert_eq!(decide(Setting::Required, &full), own);
        assert_eq!(decide(Setting::SharedProc, &full), own);
        for lacking in [
            kernel(0, true, true),
            kernel(MIN_ABI - 1, true, true),
            kernel(MIN_ABI, false, false),
        ] {
            for setting in [Setting::Required, Setting::SharedProc] {
                let refused = decide(setting, &lacking);
                let Err(SandboxError::Unavailable(why)) = refused else {
                    panic!("{lacking:?} started a process: {refused:?}");
                };
                assert!(why.contains("sandbox: off"), "{why}");
            }
            assert_eq!(decide(Setting::Off, &lacking), Ok(Confinement::Unconfined));
        }
        assert_eq!(decide(Setting::Off, &full), Ok(Confinement::Unconfined));
    }

    #[test]
    fn the_hosts_proc_is_shown_to_a_sandbox_only_where_the_trusted_policy_accepts_it() {
        let masked = kernel(MIN_ABI, true, false);
        let refused = decide(Setting::Required, &masked);
        let Err(SandboxError::Unavailable(why)) = refused else {
            panic!("started with the host's /proc: {refused:?}");
        };
        assert!(why.contains("sandbox: shared_proc"), "{why}");
        assert_eq!(
            decide(Setting::SharedProc, &masked),
            Ok(Confinement::Sandboxed { own_proc: false })
        );
        assert_eq!(decide(Setting::Off, &masked), Ok(Confinement::Unconfined));
    }

    #[test]
    fn this_kernel_gives_a_sandbox_a_proc_of_its_own() {
        // The machines gaffer is tested on can; a container masking /proc cannot (and the
        // sandbox e2e tests would say so too).
        let s = probe();
        assert!(s.problem().is_some() || s.own_proc, "{s:?}");
    }
}
