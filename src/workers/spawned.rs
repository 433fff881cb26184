//! Which worker processes this machine started, kept outside the workspace.
//!
//! The journal names the process that runs a worker (`Owner.child_pid`, start ticks), but the
//! agent can append any journal record, so that pid is only a claim: signalled on the
//! journal's word, a forged worker would have gaffer kill any process group of the user (pid
//! 1: all of them). So the orphan sweep signals a process only when this machine proves it is
//! that worker's own process: the gaffer process that spawned it wrote its pid, start time and
//! boot into the anchor's directory (see [`crate::anchor`]: the agent and every process gaffer
//! starts cannot write there), and the kernel still shows that very process.
//!
//! Why not ask `/proc` instead: what gaffer spawns is the sandbox's keeper, which never execs
//! (its command line is gaffer's own and names no worker) and is not dumpable (its `exe` link
//! cannot be read), so nothing in `/proc` ties a pid to a worker id.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::procinfo;
use super::types::InputAuth;

/// What the spawning process wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Spawn {
    pid: u32,
    start_ticks: u64,
    boot_id: String,
    /// Hex of the worker's input key ([`InputKey`]).
    #[serde(default)]
    input_key: String,
}

/// The key journalled input to one worker is authenticated with: random per start, held by
/// the owning process and written only to its spawn record, so a gaffer process on this
/// machine can send input (`gaffer worker input`, another session) and the agent cannot.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct InputKey([u8; 32]);

impl std::fmt::Debug for InputKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InputKey(..)")
    }
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

impl InputKey {
    pub fn new() -> std::io::Result<InputKey> {
        let bytes = crate::util::random_bytes(32)?;
        let mut key = [0u8; 32];
        key.copy_from_slice(&bytes);
        Ok(InputKey(key))
    }

    fn mac(&self, worker_id: &str, nonce: &str, segments: &str) -> HmacSha256 {
        use hmac::{KeyInit, Mac};
        // `new_from_slice` takes keys of any length; 32 bytes never fail.
        let mut mac = HmacSha256::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!());
        for part in ["gaffer worker.input v1", worker_id, nonce, segments] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        mac
    }

    /// Authenticates `segments` (their JSON text) as input for `worker_id`.
    pub fn sign(&self, worker_id: &str, segments: &str) -> std::io::Result<InputAuth> {
        use hmac::Mac;
        let nonce = crate::util::hex(&crate::util::random_bytes(16)?);
        let mac = crate::util::hex(
            &self
                .mac(worker_id, &nonce, segments)
                .finalize()
                .into_bytes(),
        );
        Ok(InputAuth { nonce, mac })
    }

    /// Whether `auth` was made with this key for exactly this input (compared in constant
    /// time).
    pub fn verifies(&self, worker_id: &str, segments: &str, auth: &InputAuth) -> bool {
        use hmac::Mac;
        let Some(tag) = crate::util::unhex32(&auth.mac) else {
            return false;
        };
        self.mac(worker_id, &auth.nonce, segments)
            .verify_slice(&tag)
            .is_ok()
    }
}

/// Why a process the journal names is not signalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unproven {
    #[error("this machine has no record of starting a process for this worker")]
    NotSpawnedHere,
    #[error("the journal names another process than the one this machine started")]
    Mismatch,
    #[error("the process this machine started for it has ended")]
    Gone,
    #[error("the process group is one gaffer never signals")]
    Forbidden,
}

/// The spawn records of one workspace (`<anchor dir>/workers/`), or none where no anchor can be
/// kept: then nothing is ever proven and no orphan is signalled.
#[derive(Debug, Clone)]
pub struct SpawnRecords {
    dir: Option<PathBuf>,
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

impl SpawnRecords {
    pub fn in_dir(dir: Option<PathBuf>) -> SpawnRecords {
        SpawnRecords { dir }
    }

    /// The worker id comes from the journal: it names a file only through its hash.
    fn path(&self, worker_id: &str) -> Option<PathBuf> {
        let name = crate::util::sha256_hex(format!("worker\0{worker_id}").as_bytes());
        self.dir.as_ref().map(|d| d.join(&name[..32]))
    }

    /// Records that this process started `pid` for `worker_id`. A failure is logged: the only
    /// loss is that a surviving orphan will not be ended by another process's sweep.
    pub fn remember(&self, worker_id: &str, pid: u32, start_ticks: Option<u64>, key: &InputKey) {
        let (Some(path), Some(start_ticks)) = (self.path(worker_id), start_ticks) else {
            return;
        };
        let spawn = Spawn {
            pid,
            start_ticks,
            boot_id: boot_id(),
            input_key: crate::util::hex(&key.0),
        };
        if let Err(e) = write_private(&path, &spawn) {
            tracing::warn!(worker = worker_id, error = %e, "could not record a worker's process outside the workspace");
        }
    }

    pub fn forget(&self, worker_id: &str) {
        if let Some(path) = self.path(worker_id) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// The input key of the worker this machine started for `worker_id` in this boot.
    pub fn input_key(&self, worker_id: &str) -> Option<InputKey> {
        let spawn = self.read(worker_id)?;
        if spawn.boot_id != boot_id() {
            return None;
        }
        crate::util::unhex32(&spawn.input_key).map(InputKey)
    }

    fn read(&self, worker_id: &str) -> Option<Spawn> {
        self.path(worker_id)
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice::<Spawn>(&b).ok())
    }

    /// The process group to signal for `worker_id`, when the journal's claim (`pid`, `ticks`)
    /// is the process this machine recorded starting for it and that process still runs.
    pub fn prove(&self, worker_id: &str, pid: u32, ticks: Option<u64>) -> Result<u32, Unproven> {
        let spawn = self.read(worker_id).ok_or(Unproven::NotSpawnedHere)?;
        if spawn.pid != pid || Some(spawn.start_ticks) != ticks {
            return Err(Unproven::Mismatch);
        }
        if spawn.boot_id != boot_id() || !procinfo::is_alive(pid, Some(spawn.start_ticks)) {
            return Err(Unproven::Gone);
        }
        if !procinfo::may_signal_group(pid) {
            return Err(Unproven::Forbidden);
        }
        Ok(pid)
    }
}

/// Written whole (temp file, rename), readable by this user only.
fn write_private(path: &Path, spawn: &Spawn) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&serde_json::to_vec(spawn).map_err(std::io::Error::other)?)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_process_recorded_for_that_worker_is_proven() {
        let dir = tempfile::tempdir().unwrap();
        let spawned = SpawnRecords::in_dir(Some(dir.path().join("workers")));
        let key = InputKey::new().unwrap();
        let mut child = std::process::Command::new("setsid")
            .args(["sleep", "30"])
            .spawn()
            .unwrap();
        let pid = child.id();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let ticks = procinfo::start_ticks(pid);
        assert!(ticks.is_some());
        assert_eq!(
            spawned.prove("w", pid, ticks),
            Err(Unproven::NotSpawnedHere)
        );
        spawned.remember("w", pid, ticks, &key);
        assert_eq!(spawned.prove("w", pid, ticks), Ok(pid));
        // Another worker id, another pid, missing or other ticks: the journal's word only.
        assert_eq!(
            spawned.prove("w2", pid, ticks),
            Err(Unproven::NotSpawnedHere)
        );
        assert_eq!(spawned.prove("w", 1, ticks), Err(Unproven::Mismatch));
        assert_eq!(spawned.prove("w", pid, None), Err(Unproven::Mismatch));
        let other = ticks.map(|t| t + 1);
        assert_eq!(spawned.prove("w", pid, other), Err(Unproven::Mismatch));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(spawned.prove("w", pid, ticks), Err(Unproven::Gone));
        spawned.forget("w");
        assert_eq!(
            spawned.prove("w", pid, ticks),
            Err(Unproven::NotSpawnedHere)
        );
        // A record naming pid 1 (as only a hand-written file could) is never signalled.
        if let Some(init) = procinfo::start_ticks(1) {
            spawned.remember("init", 1, Some(init), &key);
            assert_eq!(
                spawned.prove("init", 1, Some(init)),
                Err(Unproven::Forbidden)
            );
        }
        // No anchor: nothing is ever proven.
        let none = SpawnRecords::in_dir(None);
        none.remember("w", pid, ticks, &key);
        assert_eq!(none.prove("w", pid, ticks), Err(Unproven::NotSpawnedHere));
    }
}
