//! A PID namespace per started process, so nothing it starts outlives it, its timeout or its
//! gaffer: descendants cannot leave a PID namespace, and the kernel kills all of them when the
//! namespace's init exits.
//!
//! Between fork and exec (after `unshare(CLONE_NEWPID)`) the child forks twice:
//! - the **keeper** (the process gaffer started, in gaffer's namespace, dying with gaffer)
//!   ignores the job-control signals sent to its process group, waits for the init, and ends
//!   with exactly the program's status (exit code, or the same signal);
//! - the **init** (PID 1 inside, dying with the keeper) reaps orphans until the program ends,
//!   reports its wait status to the keeper through a pipe, and exits, which ends every process
//!   still in the namespace;
//! - the **program** (PID 2 inside) returns to the caller and is exec'd, with ordinary signal
//!   semantics (it is not an init), in the same process group as the keeper.
//!
//! Everything here is a system call on stack data: fork-safe.

use std::io;

/// Signals a process group gets from a terminal or from gaffer's interrupt; the keeper leaves
/// them to the program.
const LEFT_TO_THE_PROGRAM: [libc::c_int; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Closes every descriptor but `keep` (the exec-error pipe of the caller included, which only
/// the program's exec may close).
fn close_all_but(keep: libc::c_int) {
    // SAFETY: close_range on plain descriptor numbers.
    unsafe {
        if keep > 0 {
            libc::close_range(0, (keep - 1) as libc::c_uint, 0);
        }
        libc::close_range((keep + 1) as libc::c_uint, libc::c_uint::MAX, 0);
    }
}

/// Splits the child as described above; returns only in the program.
pub fn enter() -> io::Result<()> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 into a live two-element array.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    let [status_r, status_w] = fds;
    // SAFETY: fork in a single-threaded child; both sides only make system calls.
    let init = check(unsafe { libc::fork() })?;
    if init == 0 {
        // SAFETY: close on our own descriptor.
        unsafe { libc::close(status_r) };
        return be_init(status_w);
    }
    // SAFETY: as above.
    unsafe { libc::close(status_w) };
    keep(init, status_r)
}

/// PID 1 inside: dies with the keeper, forks the program, reaps until it ends.
fn be_init(status_w: libc::c_int) -> io::Result<()> {
    // SAFETY: prctl, poll, fork, waitpid, write and _exit on stack data.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
            libc::_exit(126);
        }
        // The keeper already gone (gaffer died before the death signal was set): stop here.
        let mut p = libc::pollfd {
            fd: status_w,
            events: libc::POLLOUT,
            revents: 0,
        };
        if libc::poll(&mut p, 1, 0) == -1 || p.revents & libc::POLLERR != 0 {
            libc::_exit(126);
        }
        let program = libc::fork();
        if program == 0 {
            libc::close(status_w);
            return Ok(());
        }
        if program == -1 {
            libc::_exit(126);
        }
        close_all_but(status_w);
        let mut status = 0;
        loop {
            let pid = libc::waitpid(-1, &mut status, 0);
            if pid == program {
                break;
            }
            if pid == -1 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                libc::_exit(126);
            }
        }
        let bytes = status.to_ne_bytes();
        libc::write(status_w, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(0)
    }
}

/// The process gaffer started: waits for the init and ends as the program ended.
fn keep(init: libc::pid_t, status_r: libc::c_int) -> io::Result<()> {
    // SAFETY: signal, read, waitpid, kill and _exit on stack data; never returns.
    unsafe {
        for sig in LEFT_TO_THE_PROGRAM {
            libc::signal(sig, libc::SIG_IGN);
        }
        close_all_but(status_r);
        let mut bytes = [0u8; 4];
        let mut got = 0usize;
        while got < bytes.len() {
            let n = libc::read(
                status_r,
                bytes[got..].as_mut_ptr().cast(),
                bytes.len() - got,
            );
            if n > 0 {
                got += n as usize;
            } else if n == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
        let mut init_status = 0;
        while libc::waitpid(init, &mut init_status, 0) == -1
            && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {}
        // Without a report the init itself was killed: end as it did.
        let status = if got == bytes.len() {
            libc::c_int::from_ne_bytes(bytes)
        } else {
            init_status
        };
        end_as(status)
    }
}

/// Exits with `status` as `waitpid` reported it: the same code, or the same signal.
fn end_as(status: libc::c_int) -> ! {
    // SAFETY: signal, sigprocmask, kill and _exit; never returns.
    unsafe {
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            126
        })
    }
}
