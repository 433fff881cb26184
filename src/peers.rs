//! Presence of gaffer processes on a workspace: each running server leaves a small file in
//! `.gaffer/peers/` (only when the store already exists: reading never creates it) and removes
//! it on exit. Peers are the live entries other than our own.

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct Peer {
    pub pid: u32,
    pub started_ms: u64,
}

/// This process's identity on the workspace.
#[derive(Debug)]
pub struct Instance {
    pub me: Peer,
    file: Option<PathBuf>,
    dir: PathBuf,
}

impl Instance {
    pub fn register(gaffer_dir: &Path) -> Instance {
        let me = Peer {
            pid: std::process::id(),
            started_ms: crate::util::now_ms(),
        };
        let dir = gaffer_dir.join("peers");
        let mut file = None;
        if gaffer_dir.is_dir() {
            let path = dir.join(format!("{}.json", me.pid));
            let written = std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(&path, serde_json::to_vec(&me).unwrap_or_default()));
            match written {
                Ok(()) => file = Some(path),
                Err(e) => tracing::debug!(error = %e, "presence file not written"),
            }
        }
        Instance { me, file, dir }
    }

    /// Other live gaffer processes on this workspace.
    pub fn peers(&self) -> Vec<Peer> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<Peer> = entries
            .flatten()
            .filter_map(|e| std::fs::read(e.path()).ok())
            .filter_map(|b| serde_json::from_slice::<Peer>(&b).ok())
            .filter(|p| p.pid != self.me.pid && alive(p.pid))
            .collect();
        out.sort_by_key(|p| p.pid);
        out
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(f) = &self.file {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// Whether a process id is running (Linux `/proc`; elsewhere assume it is).
pub fn alive(pid: u32) -> bool {
    let proc_root = Path::new("/proc");
    if !proc_root.is_dir() {
        return true;
    }
    proc_root.join(pid.to_string()).exists()
}
