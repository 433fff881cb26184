//! OS process identity: is the process we recorded still the same process?
//!
//! A pid alone can be reused after its process ends, so gaffer records the kernel start time
//! (`/proc/<pid>/stat` field 22, in clock ticks) next to it and treats a pid whose start time
//! differs as gone.

/// Start time of `pid` in clock ticks since boot, where the OS exposes it.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces; fields after the
    // last ')' start at field 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// Whether `pid` is alive and, when `ticks` is known, still the process that had that start
/// time. A zombie counts as gone. Without `ticks` this answers only "some process has that
/// pid": good enough to keep a worker's owner counted alive, never a reason to signal it.
pub fn is_alive(pid: u32, ticks: Option<u64>) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        // No procfs: fall back to asking the kernel whether the pid exists.
        if std::path::Path::new("/proc/self/stat").exists() {
            return false;
        }
        return signal(pid as i32, 0);
    };
    let Some(close) = stat.rfind(')') else {
        return false;
    };
    let mut fields = stat[close + 1..].split_whitespace();
    if fields.next() == Some("Z") {
        return false;
    }
    match ticks {
        Some(t) => start_ticks(pid) == Some(t),
        None => true,
    }
}

/// Sends `sig` to the process group led by `pgid`. Returns whether it was sent: never to a
/// group gaffer must not signal ([`may_signal_group`]).
pub fn kill_group(pgid: u32, sig: i32) -> bool {
    if !may_signal_group(pgid) {
        tracing::warn!(pgid, sig, "refusing to signal this process group");
        return false;
    }
    signal(-(pgid as i32), sig)
}

/// Whether `pgid` may be the group of a process gaffer started. `kill(-pgid)` with pgid 1
/// is `kill(-1)`, every process of the user; a pid past `i32::MAX` wraps negative and `-pgid`
/// would name one process (or -1); gaffer's own group holds gaffer. None of these is a worker.
pub fn may_signal_group(pgid: u32) -> bool {
    // SAFETY: getpgrp and getpid cannot fail.
    let (own_group, own_pid) = unsafe { (libc::getpgrp(), libc::getpid()) };
    pgid > 1 && pgid <= i32::MAX as u32 && pgid as i32 != own_group && pgid as i32 != own_pid
}

fn signal(target: i32, sig: i32) -> bool {
    // SAFETY: kill(2) has no memory-safety preconditions; a bad target only yields an error.
    unsafe { libc::kill(target, sig) == 0 }
}

/// Identity of the current gaffer process.
pub fn current() -> (u32, Option<u64>) {
    let pid = std::process::id();
    (pid, start_ticks(pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_process_is_alive_and_a_wrong_start_time_is_not() {
        let (pid, ticks) = current();
        assert!(is_alive(pid, ticks));
        if let Some(t) = ticks {
            assert!(!is_alive(pid, Some(t + 1)));
        }
    }

    #[test]
    fn init_every_process_wrapped_pids_and_gaffers_own_group_are_never_signalled() {
        // Signal 0 only asks; without the guard kill(-1, 0) and kill(-own group, 0) succeed.
        // SAFETY: getpgrp cannot fail.
        let own_group = unsafe { libc::getpgrp() } as u32;
        for pgid in [
            0,
            1,
            own_group,
            std::process::id(),
            u32::MAX,
            i32::MAX as u32 + 2,
        ] {
            assert!(!may_signal_group(pgid), "{pgid}");
            assert!(!kill_group(pgid, 0), "{pgid} was signalled");
        }
        assert!(!is_alive(u32::MAX, None));
        let mut child = std::process::Command::new("setsid")
            .args(["sleep", "5"])
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            kill_group(child.id(), 0),
            "a group of its own may be signalled"
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_reaped_child_is_gone() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = child.id();
        let ticks = start_ticks(pid);
        assert!(ticks.is_some());
        assert!(is_alive(pid, ticks));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!is_alive(pid, ticks));
        assert!(!is_alive(0, None));
    }
}
