//! Presence of gaffer processes on a workspace: each running server leaves a small file in
//! `.gaffer/peers/` (only when the store already exists: reading never creates it) and removes
//! it on exit. Peers are the live entries other than our own.

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Largest presence file read; a real one is a few hundred bytes.
pub const PRESENCE_LIMIT: u64 = 64 << 10;

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct Peer {
    pub pid: u32,
    pub started_ms: u64,
}

/// Every presence file this process wrote, so an exit removes them even where destructors of
/// long-lived state never run.
fn written_files() -> &'static std::sync::Mutex<Vec<PathBuf>> {
    static FILES: std::sync::OnceLock<std::sync::Mutex<Vec<PathBuf>>> = std::sync::OnceLock::new();
    FILES.get_or_init(Default::default)
}

/// Removes this process's presence files; call on the way out of `main`.
pub fn remove_at_exit() {
    let files = std::mem::take(&mut *written_files().lock().unwrap_or_else(|p| p.into_inner()));
    for f in files {
        let _ = std::fs::remove_file(f);
    }
}

/// This process's identity on the workspace.
#[derive(Debug)]
pub struct Instance {
    pub me: Peer,
    file: std::sync::Mutex<Option<PathBuf>>,
    gaffer_dir: PathBuf,
    dir: PathBuf,
}

impl Instance {
    /// Records this process's presence if the store exists (reading never creates it). Call
    /// [`Instance::ensure_registered`] again before writing: other processes judge whether
    /// work claimed by us is orphaned by these files.
    pub fn register(gaffer_dir: &Path) -> Instance {
        let me = Peer {
            pid: std::process::id(),
            started_ms: crate::util::now_ms(),
        };
        let instance = Instance {
            me,
            file: std::sync::Mutex::new(None),
            gaffer_dir: gaffer_dir.to_path_buf(),
            dir: gaffer_dir.join("peers"),
        };
        instance.ensure_registered();
        instance
    }

    /// Writes the presence file once the store directory exists; cheap when already done.
    pub fn ensure_registered(&self) {
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if file.is_some() || !self.gaffer_dir.is_dir() {
            return;
        }
        let path = self.dir.join(format!("{}.json", self.me.pid));
        let written = std::fs::create_dir_all(&self.dir)
            .and_then(|()| std::fs::write(&path, serde_json::to_vec(&self.me).unwrap_or_default()));
        match written {
            Ok(()) => {
                written_files()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(path.clone());
                *file = Some(path);
            }
            Err(e) => tracing::warn!(error = %e, "presence file not written"),
        }
    }

    /// Other live gaffer processes on this workspace.
    pub fn peers(&self) -> Vec<Peer> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<Peer> = entries
            .flatten()
            .filter_map(|e| crate::util::read_regular_file(&e.path(), Some(PRESENCE_LIMIT)).ok())
            .filter_map(|b| serde_json::from_slice::<Peer>(&b).ok())
            .filter(|p| p.pid != self.me.pid && alive(p.pid))
            .collect();
        out.sort_by_key(|p| p.pid);
        out
    }
}

impl Instance {
    /// Removes the presence file: this process is about to exit (the process may end without
    /// running destructors, so exit paths call this rather than rely on `Drop`).
    pub fn deregister(&self) {
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = file.take() {
            let _ = std::fs::remove_file(f);
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = file.as_ref() {
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
