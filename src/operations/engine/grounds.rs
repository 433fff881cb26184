//! What the policy in force rests on besides the journal's trust records: the policy file on
//! disk (an edit adds deny rules at once) and the operator's public key (which trust records
//! are checked against). And when gaffer looks at them.
//!
//! A decision is made with the latest look, at no cost, and the commit that records it looks
//! again: the first commit closure of each batch that asks stats both files, the others of that
//! batch reuse its look. A decision whose grounds changed in between is made again (a submit)
//! or claimed again (an execution). So what is recorded stands on the files as they were when
//! its batch was staged, later than the submit began, and a batch of eight submits costs two
//! stats instead of sixteen. The batch's look runs under the workspace's state lock, as the
//! policy file is read (through a symlink too): a stat that hangs holds up readers as well.
//! A closure that keeps finding the grounds changed gives up after a few attempts: changing
//! `policy.yaml` on end can keep an operation from being recorded or claimed, which an agent
//! that can write it can do anyway with a deny rule.

use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use crate::operator::OperatorPublic;
use crate::workspace::Workspace;

/// A file as one stat sees it, `None` when it cannot be read: its size, modification and
/// change times, and on Unix its device and inode (a file replaced by a rename is another
/// file even when its size and times match).
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp(Option<(u64, Option<SystemTime>, [i64; 4])>);

fn file_stamp(path: &std::path::Path) -> FileStamp {
    FileStamp(std::fs::metadata(path).ok().map(|m| {
        #[cfg(unix)]
        let identity = {
            use std::os::unix::fs::MetadataExt;
            [m.ctime(), m.ctime_nsec(), m.dev() as i64, m.ino() as i64]
        };
        #[cfg(not(unix))]
        let identity = [0; 4];
        (m.len(), m.modified().ok(), identity)
    }))
}

/// The policy file's stamp and the operator's public key, as looked at once.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Grounds {
    policy_file: FileStamp,
    pub(crate) key: Option<OperatorPublic>,
}

/// The latest look, and the commit batch it was taken for when a commit closure took it.
struct Look {
    batch: Option<u64>,
    grounds: Grounds,
}

pub(super) struct GroundsWatch {
    /// Weak: commit closures hold this watch, and a closure queued in the workspace must not
    /// keep the workspace alive.
    ws: Weak<Workspace>,
    policy_path: std::path::PathBuf,
    latest: Mutex<Option<Look>>,
}

impl GroundsWatch {
    pub fn new(ws: &Arc<Workspace>) -> GroundsWatch {
        let policy_path = ws.gaffer_dir().join(super::super::policy::POLICY_FILE);
        GroundsWatch {
            ws: Arc::downgrade(ws),
            policy_path,
            latest: Mutex::new(None),
        }
    }

    fn look(&self) -> Grounds {
        Grounds {
            key: crate::operator::current_public(),
            policy_file: file_stamp(&self.policy_path),
        }
    }

    fn remember(&self, batch: Option<u64>, grounds: &Grounds) {
        *self.latest.lock().unwrap_or_else(|p| p.into_inner()) = Some(Look {
            batch,
            grounds: grounds.clone(),
        });
    }

    /// The grounds as they stand now (one stat of each file).
    pub fn now(&self) -> Grounds {
        let grounds = self.look();
        self.remember(None, &grounds);
        grounds
    }

    /// The latest look, for a decision its commit checks with [`Self::at_staging`]; the first
    /// one looks now.
    pub fn latest(&self) -> Grounds {
        let latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        match latest.as_ref() {
            Some(look) => look.grounds.clone(),
            None => {
                drop(latest);
                self.now()
            }
        }
    }

    /// The grounds as the batch being staged sees them: looked at by its first closure that
    /// asks, reused by the rest. Call only from a commit closure (see
    /// [`Workspace::staging_batch`]).
    pub fn at_staging(&self) -> Grounds {
        let Some(batch) = self.ws.upgrade().map(|ws| ws.staging_batch()) else {
            return self.now();
        };
        let batch = Some(batch);
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(look) = latest.as_ref()
            && look.batch == batch
        {
            return look.grounds.clone();
        }
        let grounds = self.look();
        *latest = Some(Look {
            batch,
            grounds: grounds.clone(),
        });
        grounds
    }
}
