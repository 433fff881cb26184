//! The Landlock ruleset, built in gaffer (it opens paths and allocates) and only enforced in
//! the child.

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, Scope,
};

use super::{SandboxError, Spec};

/// Read-only (and executable) system paths a program needs; missing ones are skipped.
const SYSTEM_PATHS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt", "/proc", "/sys",
];
/// The device files a program needs: read and write, no ioctl. Not all of `/dev`: that would
/// reach the operator's terminals (`/dev/pts/*`) and the host's `/dev/shm`.
const DEVICE_PATHS: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

const ABI_USED: ABI = ABI::V6;

/// The kernel's Landlock ABI version (0 when there is none).
pub fn kernel_abi() -> i32 {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION takes no attributes and returns the version.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    i32::try_from(v).unwrap_or(0).max(0)
}

/// What a program may do beneath the system paths (and its own `/proc`): read and execute.
pub fn system_access() -> u64 {
    AccessFs::from_read(ABI_USED).bits()
}

fn setup(e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Setup(e.to_string())
}

pub fn build(spec: &Spec) -> Result<RulesetCreated, SandboxError> {
    let all = AccessFs::from_all(ABI_USED);
    let read = AccessFs::from_read(ABI_USED);
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(all)
        .map_err(setup)?
        .handle_access(AccessNet::from_all(ABI_USED))
        .map_err(setup)?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(setup)?
        .create()
        .map_err(setup)?;
    let mut add = |path: &std::path::Path, access| -> Result<(), SandboxError> {
        let fd = PathFd::new(path).map_err(setup)?;
        (&mut rs)
            .add_rule(PathBeneath::new(fd, access))
            .map_err(setup)?;
        Ok(())
    };
    for p in SYSTEM_PATHS
        .iter()
        .map(std::path::Path::new)
        .filter(|p| p.exists())
    {
        add(p, read)?;
    }
    for p in DEVICE_PATHS
        .iter()
        .map(std::path::Path::new)
        .filter(|p| p.exists())
    {
        add(p, AccessFs::from_file(ABI_USED) & !AccessFs::IoctlDev)?;
    }
    match spec.workspace_access {
        super::WorkspaceAccess::ReadWrite => add(&spec.workspace, all)?,
        super::WorkspaceAccess::Read => add(&spec.workspace, read)?,
        super::WorkspaceAccess::None => {}
    }
    let holds = spec.workspace_access == super::WorkspaceAccess::ReadWrite;
    for g in &spec.grants {
        // Resolved now, as this process starts, through nothing in the workspace; then
        // opened without following links, so a link swapped in since leads nowhere.
        let path = super::resolve_grant(&g.path, Some(&spec.workspace), holds)
            .map_err(|why| setup(format!("granted path {}: {why}", g.path.display())))?;
        let fd = crate::util::openat2(
            libc::AT_FDCWD,
            &path,
            libc::O_PATH | libc::O_CLOEXEC,
            libc::RESOLVE_NO_SYMLINKS,
        )
        .map_err(|e| setup(format!("granted path {}: {e}", path.display())))?;
        (&mut rs)
            .add_rule(PathBeneath::new(fd, if g.write { all } else { read }))
            .map_err(setup)?;
    }
    for port in &spec.tcp_connect {
        (&mut rs)
            .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
            .map_err(setup)?;
    }
    Ok(rs)
}
