//! The part that runs in the child between fork and exec. Everything it needs is prepared
//! before the fork; the closure itself only makes system calls (no allocation on success).

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;

use std::os::fd::{AsRawFd, OwnedFd};

use landlock::RulesetCreated;

use super::{FILE_SIZE_LIMIT, PROCESS_LIMIT, SandboxError, Spec};

pub struct ChildSetup {
    parent: u32,
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    /// `<workspace>/.gaffer`, covered by an empty read-only tmpfs.
    gaffer_dir: Option<CString>,
    /// Host directories of other programs' unix sockets (the session bus, X11, container
    /// daemons): covered too, since Landlock before ABI 9 does not govern `connect()`.
    hidden: Vec<CString>,
    new_net: bool,
    cpu_seconds: Option<u64>,
    /// What the program may do beneath its own `/proc` (Landlock access bits).
    proc_access: u64,
    /// Whether the program must get a `/proc` of its own (else the host's may stay).
    own_proc: bool,
    /// The program's working directory, entered again by its path once `.gaffer/` and the
    /// socket directories are covered: the directory entered before the fork's namespaces
    /// (by the spawn, resolving the path then) may be `.gaffer/` itself if a directory on
    /// the path was swapped for a symlink after gaffer checked it, and a tmpfs mounted over
    /// `.gaffer/` does not cover a directory the process is already in. Entered without
    /// following magic links (`/proc/self/cwd`, `/proc/self/fd/N` would lead back there).
    cwd: CString,
}

/// Where other programs keep their unix sockets, unless the workspace lies inside (or holds)
/// one of them.
const SOCKET_DIRS: &[&str] = &["/run", "/var/run", "/tmp/.X11-unix", "/tmp/.ICE-unix"];

fn socket_dirs(workspace: &std::path::Path) -> Vec<CString> {
    let ws = workspace
        .canonicalize()
        .unwrap_or_else(|_| workspace.to_path_buf());
    let mut out: Vec<std::path::PathBuf> = Vec::new();
    for d in SOCKET_DIRS {
        let Ok(real) = std::path::Path::new(d).canonicalize() else {
            continue;
        };
        if real.is_dir() && !ws.starts_with(&real) && !real.starts_with(&ws) && !out.contains(&real)
        {
            out.push(real);
        }
    }
    out.into_iter()
        .filter_map(|p| CString::new(p.as_os_str().as_bytes()).ok())
        .collect()
}

impl ChildSetup {
    pub fn new(
        spec: &Spec,
        own_proc: bool,
        cwd: Option<&std::path::Path>,
    ) -> Result<ChildSetup, SandboxError> {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let dir = spec.workspace.join(".gaffer");
        let gaffer_dir = if dir.is_dir() {
            Some(
                CString::new(dir.as_os_str().as_bytes())
                    .map_err(|_| SandboxError::Setup("workspace path holds NUL".into()))?,
            )
        } else {
            None
        };
        let cwd = match cwd {
            Some(dir) if dir.is_absolute() => dir.to_path_buf(),
            // The spawn resolves a relative one against gaffer's own directory.
            rel => std::env::current_dir()
                .map(|here| rel.map_or_else(|| here.clone(), |dir| here.join(dir)))
                .map_err(|e| SandboxError::Setup(format!("no working directory: {e}")))?,
        };
        let cwd = CString::new(cwd.as_os_str().as_bytes())
            .map_err(|_| SandboxError::Setup("working directory path holds NUL".into()))?;
        Ok(ChildSetup {
            cwd,
            parent: std::process::id(),
            uid_map: format!("{uid} {uid} 1").into_bytes(),
            gid_map: format!("{gid} {gid} 1").into_bytes(),
            gaffer_dir,
            hidden: socket_dirs(&spec.workspace),
            new_net: spec.tcp_connect.is_empty(),
            cpu_seconds: spec.cpu_seconds,
            proc_access: super::rules::system_access(),
            own_proc,
        })
    }
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `chdir(path)`, resolving the path afresh but never through a `/proc` magic link: a symlink
/// swapped in on the path leads into the covers, or outside the workspace (where Landlock
/// rules), never back to a directory only a handle reaches.
fn enter_by_path(path: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: open_how is plain data; zeroed is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: a NUL-terminated path and a live open_how of the size passed; fchdir and close
    // on the descriptor just returned.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        ) as libc::c_int;
        check(fd)?;
        let entered = libc::fchdir(fd);
        libc::close(fd);
        check(entered)
    }
}

fn write_proc(path: &std::ffi::CStr, data: &[u8]) -> io::Result<()> {
    // SAFETY: plain open/write/close on a NUL-terminated path and a live buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        check(fd)?;
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        libc::close(fd);
        if n != data.len() as isize {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn set_limit(resource: libc::__rlimit_resource_t, value: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: setrlimit with a valid struct.
    check(unsafe { libc::setrlimit(resource, &lim) })
}

impl ChildSetup {
    fn namespaces(&self) -> io::Result<()> {
        let mut flags = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID;
        if self.new_net {
            flags |= libc::CLONE_NEWNET;
        }
        // SAFETY: the child is single-threaded after fork, as unshare(CLONE_NEWUSER) needs.
        check(unsafe { libc::unshare(flags) })?;
        write_proc(c"/proc/self/setgroups", b"deny")?;
        write_proc(c"/proc/self/uid_map", &self.uid_map)?;
        write_proc(c"/proc/self/gid_map", &self.gid_map)?;
        // From here on (the maps are written) this process, and the keeper and init forked
        // from it, which hold gaffer's environment and memory and never exec, cannot be read
        // through /proc or ptraced by the program; its own exec makes the program dumpable.
        // SAFETY: prctl with constant arguments.
        check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) })?;
        // SAFETY: mount(2) with NUL-terminated strings or nulls.
        unsafe {
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            for dir in &self.hidden {
                check(libc::mount(
                    c"tmpfs".as_ptr(),
                    dir.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    c"size=4k,mode=0555".as_ptr().cast(),
                ))?;
            }
            if let Some(dir) = &self.gaffer_dir {
                check(libc::mount(
                    c"tmpfs".as_ptr(),
                    dir.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    c"size=4k,mode=0555".as_ptr().cast(),
                ))?;
            }
            enter_by_path(&self.cwd)?;
        }
        Ok(())
    }

    fn limits(&self) -> io::Result<()> {
        if let Some(cpu) = self.cpu_seconds {
            set_limit(libc::RLIMIT_CPU, cpu)?;
        }
        set_limit(libc::RLIMIT_FSIZE, FILE_SIZE_LIMIT)?;
        set_limit(libc::RLIMIT_NPROC, PROCESS_LIMIT)
    }
}

/// SIGKILL when gaffer dies (set last: changing credentials clears it).
fn die_with_parent(parent: u32) -> io::Result<()> {
    // SAFETY: prctl and getppid are async-signal-safe.
    unsafe {
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL))?;
        if libc::getppid() as u32 != parent {
            return Err(io::Error::from(io::ErrorKind::BrokenPipe));
        }
    }
    Ok(())
}

/// A session of its own (and so a process group whose id is its pid, which gaffer kills as a
/// whole): no controlling terminal, so no `TIOCSTI` into the operator's.
fn new_session() -> io::Result<()> {
    // SAFETY: setsid is async-signal-safe.
    check(unsafe { libc::setsid() }).map(|_| ())
}

pub fn install(cmd: &mut tokio::process::Command, setup: ChildSetup, ruleset: RulesetCreated) {
    // A second handle on the same ruleset, for the rule on the sandbox's own /proc, which
    // exists only once the program has mounted it.
    let proc_rule: Option<OwnedFd> = ruleset.try_clone().ok().and_then(Option::from);
    let mut ruleset = Some(ruleset);
    // SAFETY: the closure runs between fork and exec and only makes system calls on data
    // prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            new_session()?;
            setup.namespaces()?;
            setup.limits()?;
            die_with_parent(setup.parent)?;
            let rs = ruleset
                .take()
                .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
            // Returns only in the program, PID 2 of its own PID namespace; the keeper and the
            // init run no code but gaffer's and are outside the Landlock domain, so the
            // program can neither signal nor trace them.
            super::pidns::enter()?;
            // Before Landlock: a restricted process may not mount.
            let fd = proc_rule.as_ref().map_or(-1, |fd| fd.as_raw_fd());
            match own_proc(fd, setup.proc_access) {
                Ok(()) => {}
                // Only `sandbox: shared_proc` lets the host's /proc stay.
                Err(_) if !setup.own_proc => {}
                Err(e) => return Err(e),
            }
            rs.restrict_self()
                .map_err(|_| io::Error::from_raw_os_error(libc::EPERM))?;
            Ok(())
        });
    }
}

/// A procfs of the caller's PID namespace over `/proc`.
///
/// # Safety
/// mount(2) with constant NUL-terminated strings: fork-safe.
unsafe fn mount_proc() -> libc::c_int {
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: as the function says.
    unsafe {
        libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            flags,
            std::ptr::null(),
        )
    }
}

/// Whether a sandbox can mount a `/proc` of its own here: tried in a child that enters new
/// user, mount and PID namespaces as a sandbox does (its mounts die with it). Only the kernel's
/// answer is kept; a probe that could not ask (no process or namespace to spare just then,
/// which the agent's own processes may cause) says no this time and asks again next time.
pub fn own_proc_works() -> bool {
    static WORKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if let Some(known) = WORKS.get() {
        return *known;
    }
    match try_own_proc() {
        Some(answer) => *WORKS.get_or_init(|| answer),
        None => false,
    }
}

/// Exit statuses of the probe's children: mounted, or refused by the kernel; anything else
/// means the probe could not ask.
const PROC_MOUNTED: libc::c_int = 0;
const PROC_REFUSED: libc::c_int = 3;

fn try_own_proc() -> Option<bool> {
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let uid_map = format!("{uid} {uid} 1");
    let gid_map = format!("{gid} {gid} 1");
    // SAFETY: between fork and _exit the child makes system calls only, on data prepared
    // before the fork; the parent waits for it.
    unsafe {
        let child = libc::fork();
        if child == 0 {
            let ok = libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID)
                == 0
                && write_proc(c"/proc/self/setgroups", b"deny").is_ok()
                && write_proc(c"/proc/self/uid_map", uid_map.as_bytes()).is_ok()
                && write_proc(c"/proc/self/gid_map", gid_map.as_bytes()).is_ok()
                && libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) == 0;
            if !ok {
                libc::_exit(1);
            }
            // The mount needs a process inside the new PID namespace.
            let inner = libc::fork();
            if inner == 0 {
                let status = if mount_proc() == 0 {
                    PROC_MOUNTED
                } else if matches!(
                    io::Error::last_os_error().raw_os_error(),
                    Some(libc::EPERM | libc::EACCES)
                ) {
                    PROC_REFUSED
                } else {
                    1
                };
                libc::_exit(status);
            }
            let mut status = 0;
            let done = inner > 0 && libc::waitpid(inner, &mut status, 0) == inner;
            libc::_exit(if done && libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                1
            });
        }
        if child < 0 {
            return None;
        }
        let mut status = 0;
        loop {
            let r = libc::waitpid(child, &mut status, 0);
            if r == child {
                return match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
                    (true, PROC_MOUNTED) => Some(true),
                    (true, PROC_REFUSED) => Some(false),
                    _ => None,
                };
            }
            if r == -1 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return None;
            }
        }
    }
}

/// `struct landlock_path_beneath_attr` of the kernel's uapi.
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: libc::c_int,
}

const LANDLOCK_RULE_PATH_BENEATH: libc::c_long = 1;

/// Mounts a procfs of the program's own PID namespace over `/proc`, so it lists only the
/// sandbox's processes (the host's `/proc` shows every process's command line), and lets the
/// program read it. A kernel refuses the mount where the current `/proc` has parts masked (a
/// container): then the host's `/proc` stays, read-only, its processes' memory, environment
/// and descriptors still closed by Landlock's ptrace scope, if the caller accepts that.
fn own_proc(ruleset_fd: libc::c_int, access: u64) -> io::Result<()> {
    if ruleset_fd < 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: mount, open, syscall and close with NUL-terminated strings and a stack struct.
    unsafe {
        check(mount_proc())?;
        let dir = libc::open(
            c"/proc".as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        );
        if dir == -1 {
            return Err(io::Error::last_os_error());
        }
        let attr = PathBeneathAttr {
            allowed_access: access,
            parent_fd: dir,
        };
        let r = libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset_fd,
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0u32,
        );
        let err = io::Error::last_os_error();
        libc::close(dir);
        if r == -1 { Err(err) } else { Ok(()) }
    }
}

pub fn install_lifetime_only(cmd: &mut tokio::process::Command) {
    let parent = std::process::id();
    // SAFETY: as above; prctl and getppid only.
    unsafe {
        cmd.pre_exec(move || {
            new_session()?;
            die_with_parent(parent)
        });
    }
}

/// Whether this process may create a user namespace.
pub fn user_namespaces_work() -> bool {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
    };
    if read("/proc/sys/user/max_user_namespaces") == Some(0) {
        return false;
    }
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    root || read("/proc/sys/kernel/unprivileged_userns_clone") != Some(0)
}
