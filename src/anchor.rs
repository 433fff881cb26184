//! What this machine remembers about a workspace, kept outside it.
//!
//! The agent may write every file in the workspace, `.gaffer/` included, and the journal's hash
//! chain and the snapshot's checksum are keyless: the agent can recompute both. So nothing in
//! the store can vouch for itself against being cut back, rewritten or replaced. The anchor
//! lives in the operator's state directory (`$GAFFER_STATE_DIR`, else
//! `$XDG_STATE_HOME/gaffer`, else `~/.local/state/gaffer`), which the processes gaffer starts
//! cannot reach, one directory per workspace (its canonical path and id):
//!
//! - `head`: the seq and hash of the last record this machine saw durable, rewritten after
//!   every commit (two checksummed slots, so a torn write leaves the other; no fsync: it is
//!   written after the journal's fdatasync, so it is never ahead of the journal);
//! - `facts.json` (replaced atomically under `lock`): the marks of the snapshots gaffer wrote
//!   (any other snapshot is not loaded), the highest trust version verified per file (an older
//!   trust is never enforced again), the approvals' uses claimed here, approvals and client
//!   credentials revoked (a use claimed here is never claimed again, a revoked credential never
//!   proves its name again, whatever the journal says).
//! - `seal.key`: the secret this machine seals the requests it accepted with
//!   ([`crate::operations::seal`]), so a request written into the store by anything else is
//!   told apart.
//!
//! An agent that can write the state directory is outside what this protects against, as is
//! one that can read the operator's private key.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::operations::seal::SEAL_KEY_LEN;
use crate::store::SnapshotMark;

pub const STATE_DIR_ENV: &str = "GAFFER_STATE_DIR";
/// Snapshot marks kept: enough for the snapshots that can be in place while processes race.
const SNAPSHOTS_KEPT: usize = 4;
const SLOT: usize = 128;
/// How long a claim or revocation outlives its approval's signed expiry (clock adjustments).
const KEEP_AFTER_EXPIRY_MS: u64 = 24 * 3600 * 1000;

#[derive(Debug, thiserror::Error)]
pub enum AnchorError {
    #[error(
        "no state directory for the workspace anchor: set {STATE_DIR_ENV}, XDG_STATE_HOME or HOME"
    )]
    NoLocation,
    #[error(
        "the state directory {0} is inside the workspace, where the agent can write; set \
         {STATE_DIR_ENV} to a directory outside it"
    )]
    InsideWorkspace(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> AnchorError + '_ {
    move |source| AnchorError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn non_empty_env(k: &str) -> Option<PathBuf> {
    std::env::var_os(k)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `$GAFFER_STATE_DIR`, else `$XDG_STATE_HOME/gaffer`, else `~/.local/state/gaffer`.
pub fn state_dir() -> Result<PathBuf, AnchorError> {
    if let Some(p) = non_empty_env(STATE_DIR_ENV) {
        return Ok(p);
    }
    non_empty_env("XDG_STATE_HOME")
        .or_else(|| non_empty_env("HOME").map(|h| h.join(".local").join("state")))
        .map(|d| d.join("gaffer"))
        .ok_or(AnchorError::NoLocation)
}

/// The last record this machine saw durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadMark {
    pub seq: u64,
    pub hash: String,
}

/// Whether the store reaches what this machine remembers of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Standing {
    /// No journal yet: nothing to protect.
    Empty,
    /// The journal reaches the last head this machine saw (or this machine sees it first).
    Intact,
    /// The journal no longer reaches the head this machine saw: it was cut or rewritten.
    /// Nothing executes until the operator accepts the store as it is
    /// (`gaffer store reanchor`).
    RolledBack { detail: String },
    /// No anchor can be kept here, so a rollback could not be told: nothing executes.
    Unavailable { detail: String },
}

impl Standing {
    pub fn is_intact(&self) -> bool {
        matches!(self, Standing::Empty | Standing::Intact)
    }

    /// Why nothing may execute, when that is so.
    pub fn refusal(&self) -> Option<String> {
        match self {
            Standing::Empty | Standing::Intact => None,
            Standing::RolledBack { detail } => Some(format!(
                "the store was rolled back ({detail}); nothing executes until the operator \
                 accepts it as it is (gaffer store reanchor)"
            )),
            Standing::Unavailable { detail } => Some(format!(
                "no workspace anchor can be kept ({detail}), so a rolled-back store could not \
                 be told; nothing executes"
            )),
        }
    }
}

/// How one approval's uses stand on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UseMark {
    /// Claimed for execution: spent, whatever the journal later says.
    Claimed,
    /// Claimed, then given back by the process that claimed it (the effect never started).
    Released,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct ApprovalUses {
    keep_until_ms: u64,
    ops: BTreeMap<String, UseMark>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Facts {
    #[serde(default)]
    snapshots: Vec<SnapshotMark>,
    /// Trust file → the highest version verified on this machine.
    #[serde(default)]
    trust: BTreeMap<String, u64>,
    #[serde(default)]
    uses: BTreeMap<String, ApprovalUses>,
    /// Approval id → kept until (ms).
    #[serde(default)]
    revoked: BTreeMap<String, u64>,
    /// Client credentials the operator revoked (a credential does not expire, so neither does
    /// its revocation).
    #[serde(default)]
    clients_revoked: std::collections::BTreeSet<String>,
}

impl Facts {
    fn forget_expired(&mut self, now_ms: u64) {
        self.uses.retain(|_, u| u.keep_until_ms > now_ms);
        self.revoked.retain(|_, until| *until > now_ms);
    }
}

/// Why an approval's use is refused here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimRefused {
    #[error("this machine already claimed this approval for this operation")]
    AlreadyClaimed,
    #[error("this machine already spent every use of this approval")]
    UsedUp,
    #[error("the operator revoked this approval")]
    Revoked,
    #[error("the workspace anchor cannot record the use: {0}")]
    Unrecorded(String),
}

/// One workspace's anchor: a directory for this copy of it (its root and id: the head and the
/// snapshots, which belong to these files) and a ledger for its id (approval uses,
/// revocations, trust versions: signatures bind the id, so every copy of the store shares
/// them and a copy cannot spend a use again).
#[derive(Debug)]
pub struct Anchor {
    dir: PathBuf,
    ledger: PathBuf,
    /// The workspace id last seen at this path (`roots/<root>`): a store replaced by one with
    /// another id, or with none, is told from a new workspace.
    root_file: PathBuf,
    head: Mutex<Option<HeadFile>>,
}

/// The head file, held open to be read and written in place, and each slot as last read or
/// written through it with what it parses to. Every append reads both slots back; the one
/// unchanged since this process last saw it is not parsed again (the bytes decide, so a slot
/// another process rewrote is always parsed afresh).
#[derive(Debug)]
struct HeadFile {
    file: File,
    known: [Option<KnownSlot>; 2],
}

#[derive(Debug)]
struct KnownSlot {
    bytes: [u8; SLOT],
    /// A slot cut short by the file's end holds fewer.
    len: usize,
    parsed: Option<HeadMark>,
}

impl KnownSlot {
    fn read(chunk: &[u8]) -> KnownSlot {
        let mut bytes = [0u8; SLOT];
        let len = chunk.len().min(SLOT);
        bytes[..len].copy_from_slice(&chunk[..len]);
        KnownSlot {
            bytes,
            len,
            parsed: parse_slot(chunk),
        }
    }

    fn holds(&self, chunk: &[u8]) -> bool {
        self.bytes[..self.len] == *chunk
    }
}

impl HeadFile {
    fn new(file: File) -> HeadFile {
        HeadFile {
            file,
            known: [None, None],
        }
    }

    /// [`newest_slot`] of `bytes` (at most both slots, read from this file), parsing only the
    /// slots whose bytes changed since this process last saw them.
    fn newest(&mut self, bytes: &[u8]) -> Option<HeadMark> {
        for (known, chunk) in self.known.iter_mut().zip(bytes.chunks(SLOT)) {
            if !known.as_ref().is_some_and(|k| k.holds(chunk)) {
                *known = Some(KnownSlot::read(chunk));
            }
        }
        let present = bytes.len().div_ceil(SLOT).min(2);
        self.known[..present]
            .iter()
            .filter_map(|k| k.as_ref()?.parsed.as_ref())
            .max_by_key(|m| m.seq)
            .cloned()
    }

    /// Writes `mark` into its slot (by its seq's parity) and remembers what it parses to.
    fn write(&mut self, mark: &HeadMark) -> std::io::Result<()> {
        let i = (mark.seq % 2) as usize;
        let bytes = encode_slot(mark);
        self.file.write_all_at(&bytes, (i * SLOT) as u64)?;
        let parsed = if is_head_hash(&mark.hash) {
            Some(mark.clone())
        } else {
            parse_slot(&bytes)
        };
        self.known[i] = Some(KnownSlot {
            bytes,
            len: SLOT,
            parsed,
        });
        Ok(())
    }
}

impl Anchor {
    /// The anchor of the workspace at `root` (canonical) whose journal declares `workspace_id`.
    /// Nothing is created until something is recorded.
    pub fn locate(root: &Path, workspace_id: &str) -> Result<Anchor, AnchorError> {
        let base = state_dir()?;
        let absolute = if base.is_absolute() {
            base
        } else {
            std::env::current_dir().map_err(io_err(&base))?.join(base)
        };
        let canonical = canonical_prefix(&absolute);
        if canonical.starts_with(root) {
            return Err(AnchorError::InsideWorkspace(canonical));
        }
        let mut key = root.as_os_str().as_encoded_bytes().to_vec();
        key.push(0);
        key.extend_from_slice(workspace_id.as_bytes());
        let name = crate::util::sha256_hex(&key);
        let id = crate::util::sha256_hex(format!("id\0{workspace_id}").as_bytes());
        let at = crate::util::sha256_hex(root.as_os_str().as_encoded_bytes());
        Ok(Anchor {
            dir: canonical.join("workspaces").join(&name[..32]),
            ledger: canonical.join("ledgers").join(&id[..32]),
            root_file: canonical.join("roots").join(&at[..32]),
            head: Mutex::new(None),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key this machine seals the workspace's accepted requests with (see
    /// [`crate::operations::seal`]), created on first use. Two processes creating it at once
    /// agree: each writes its own file and links it into place, and the loser reads the
    /// winner's.
    pub fn seal_key(&self) -> Result<[u8; SEAL_KEY_LEN], AnchorError> {
        if let Some(key) = self.existing_seal_key()? {
            return Ok(key);
        }
        let path = self.dir.join("seal.key");
        self.ensure_dir()?;
        let fresh = crate::util::random_bytes(SEAL_KEY_LEN).map_err(io_err(&path))?;
        let tmp = self.dir.join(format!(
            "seal.key.{}.{}",
            std::process::id(),
            crate::util::hex(&crate::util::random_bytes(8).map_err(io_err(&path))?)
        ));
        let written = (|| {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&fresh)?;
            f.sync_all()?;
            match std::fs::hard_link(&tmp, &path) {
                Err(e) if e.kind() != ErrorKind::AlreadyExists => Err(e),
                // The name made durable too: a key lost to a power cut would leave every seal
                // made with it unverifiable.
                _ => File::open(&self.dir)?.sync_all(),
            }
        })();
        let _ = std::fs::remove_file(&tmp);
        written.map_err(io_err(&path))?;
        let bytes = std::fs::read(&path).map_err(io_err(&path))?;
        key_of(&path, &bytes)
    }

    /// The seal key if one was made, without making one (a fold checking what was sealed,
    /// `gaffer doctor`).
    pub fn existing_seal_key(&self) -> Result<Option<[u8; SEAL_KEY_LEN]>, AnchorError> {
        let path = self.dir.join("seal.key");
        match std::fs::read(&path) {
            Ok(bytes) => key_of(&path, &bytes).map(Some),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    fn ensure_dir(&self) -> Result<(), AnchorError> {
        ensure(&self.dir)
    }

    /// The last head recorded, if any (the newer of the two slots that check).
    pub fn head(&self) -> Result<Option<HeadMark>, AnchorError> {
        let path = self.dir.join("head");
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(&path)(e)),
        };
        let best = newest_slot(&bytes);
        if best.is_none() && !bytes.is_empty() {
            return Err(AnchorError::Corrupt {
                path,
                reason: "no slot checks".into(),
            });
        }
        Ok(best)
    }

    /// Records `mark` as the last head seen durable. Callers hold the store's lock, so heads
    /// arrive in order across processes.
    pub fn advance(&self, mark: &HeadMark) -> Result<(), AnchorError> {
        self.advance_checked(mark, |_| Standing::Intact).map(|_| ())
    }

    /// [`advance`](Self::advance), unless the head recorded so far does not stand against the
    /// journal `mark` ends (`judge`): a head another process anchored is not moved back by an
    /// append that landed on its records after they were destroyed. The recorded head is read
    /// through the handle kept for writing (one read, one write). Returns the verdict.
    pub fn advance_checked(
        &self,
        mark: &HeadMark,
        judge: impl FnOnce(&HeadMark) -> Standing,
    ) -> Result<Standing, AnchorError> {
        // Named only when opened and in errors: built then, not for every append.
        let path = || self.dir.join("head");
        let mut held = self.head.lock().unwrap_or_else(|p| p.into_inner());
        if held.is_none() {
            *held = Some(HeadFile::new(self.open_head(&path())?));
        }
        let Some(head) = held.as_mut() else {
            return Ok(Standing::Intact);
        };
        let mut slots = [0u8; 2 * SLOT];
        let mut read = 0;
        while read < slots.len() {
            match head.file.read_at(&mut slots[read..], read as u64) {
                Ok(0) => break,
                Ok(n) => read += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(&path())(e)),
            }
        }
        if let Some(recorded) = head.newest(&slots[..read]) {
            let verdict = judge(&recorded);
            if verdict != Standing::Intact {
                return Ok(verdict);
            }
        }
        head.write(mark).map_err(|e| io_err(&path())(e))?;
        Ok(Standing::Intact)
    }

    /// The head file for reading and writing in place, created if absent (never truncated).
    fn open_head(&self, path: &Path) -> Result<File, AnchorError> {
        self.ensure_dir()?;
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io_err(path))
    }

    /// Records `mark` only if no head was recorded yet (a journal first seen here), under the
    /// anchor's lock: an opener holds no store lock, so it must never overwrite a newer head.
    pub fn adopt(&self, mark: &HeadMark) -> Result<(), AnchorError> {
        let _lock = lock_dir(&self.dir)?;
        if self.head()?.is_none() {
            self.advance(mark)?;
        }
        Ok(())
    }

    /// Replaces the head outright, both slots (the operator accepting the store as it is).
    /// Written in place, never by rename: every running gaffer process keeps one handle on
    /// this file, and their next appends must advance the head that every reader reads. A
    /// crash between the two slots leaves the old one beside the new and the newest wins:
    /// at worst the store is judged as before the reset, and the operator runs it again.
    pub fn reset_head(&self, mark: &HeadMark) -> Result<(), AnchorError> {
        let path = self.dir.join("head");
        let f = self.open_head(&path)?;
        let mut both = encode_slot(mark).to_vec();
        both.extend_from_slice(&encode_slot(mark));
        f.write_all_at(&both, 0).map_err(io_err(&path))?;
        f.sync_data().map_err(io_err(&path))?;
        Ok(())
    }

    fn read_facts(dir: &Path) -> Result<Facts, AnchorError> {
        let path = dir.join("facts.json");
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| AnchorError::Corrupt {
                path,
                reason: e.to_string(),
            }),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(Facts::default()),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    /// Reads the facts under the anchor's lock, lets `f` change them, and writes them back
    /// durably when `f` says so (another process may be doing the same).
    fn update<T>(dir: &Path, f: impl FnOnce(&mut Facts) -> (bool, T)) -> Result<T, AnchorError> {
        let _lock = lock_dir(dir)?;
        let mut facts = Self::read_facts(dir)?;
        let (changed, out) = f(&mut facts);
        if changed {
            facts.forget_expired(crate::util::now_ms());
            let path = dir.join("facts.json");
            let bytes = serde_json::to_vec(&facts).map_err(|e| AnchorError::Corrupt {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            crate::store::write_file_atomic(&path, &bytes).map_err(|e| AnchorError::Corrupt {
                path,
                reason: e.to_string(),
            })?;
        }
        Ok(out)
    }

    /// Remembers a snapshot this process wrote.
    pub fn remember_snapshot(&self, mark: SnapshotMark) -> Result<(), AnchorError> {
        Self::update(&self.dir, |f| {
            if f.snapshots.contains(&mark) {
                return (false, ());
            }
            f.snapshots.push(mark);
            let extra = f.snapshots.len().saturating_sub(SNAPSHOTS_KEPT);
            f.snapshots.drain(..extra);
            (true, ())
        })
    }

    /// Whether gaffer on this machine wrote exactly this snapshot.
    pub fn knows_snapshot(&self, mark: &SnapshotMark) -> Result<bool, AnchorError> {
        Ok(Self::read_facts(&self.dir)?.snapshots.contains(mark))
    }

    /// The highest version of `file` trusted on this machine (0: none).
    pub fn trusted_version(&self, file: &str) -> Result<u64, AnchorError> {
        Ok(Self::read_facts(&self.ledger)?
            .trust
            .get(file)
            .copied()
            .unwrap_or(0))
    }

    /// Raises the highest trusted version of `file` to `version` (never lowers it).
    pub fn raise_trusted(&self, file: &str, version: u64) -> Result<(), AnchorError> {
        Self::update(&self.ledger, |f| {
            let v = f.trust.entry(file.to_string()).or_default();
            let raise = version > *v;
            if raise {
                *v = version;
            }
            (raise, ())
        })
    }

    /// Claims one use of `approval_id` for `op_id`, durably, before its effect: refused when
    /// this machine claimed it for that operation already, spent its `max_uses`, or saw it
    /// revoked.
    pub fn claim(
        &self,
        approval_id: &str,
        op_id: &str,
        max_uses: u32,
        expires_at_ms: u64,
    ) -> Result<(), ClaimRefused> {
        let outcome = Self::update(&self.ledger, |f| {
            if f.revoked.contains_key(approval_id) {
                return (false, Err(ClaimRefused::Revoked));
            }
            let uses = f.uses.entry(approval_id.to_string()).or_default();
            if uses.ops.contains_key(op_id) {
                return (false, Err(ClaimRefused::AlreadyClaimed));
            }
            let spent = uses
                .ops
                .values()
                .filter(|u| **u == UseMark::Claimed)
                .count();
            if spent >= max_uses as usize {
                return (false, Err(ClaimRefused::UsedUp));
            }
            uses.ops.insert(op_id.to_string(), UseMark::Claimed);
            uses.keep_until_ms = uses
                .keep_until_ms
                .max(expires_at_ms.saturating_add(KEEP_AFTER_EXPIRY_MS));
            (true, Ok(()))
        });
        outcome.unwrap_or_else(|e| Err(ClaimRefused::Unrecorded(e.to_string())))
    }

    /// Gives back a use this process claimed and whose effect never started.
    pub fn release(&self, approval_id: &str, op_id: &str) -> Result<(), AnchorError> {
        Self::update(&self.ledger, |f| {
            let entry = f
                .uses
                .get_mut(approval_id)
                .and_then(|u| u.ops.get_mut(op_id));
            match entry {
                Some(u) if *u == UseMark::Claimed => {
                    *u = UseMark::Released;
                    (true, ())
                }
                _ => (false, ()),
            }
        })
    }

    /// Remembers that the operator revoked `approval_id` (kept past `expires_at_ms`).
    pub fn revoke(&self, approval_id: &str, expires_at_ms: u64) -> Result<(), AnchorError> {
        let until = expires_at_ms.saturating_add(KEEP_AFTER_EXPIRY_MS);
        Self::update(&self.ledger, |f| {
            let v = f.revoked.entry(approval_id.to_string()).or_default();
            let later = until > *v;
            if later {
                *v = until;
            }
            (later, ())
        })
    }

    /// Remembers that the operator revoked client credential `credential_id`: a copy of the
    /// store cut back before the revocation still refuses it.
    pub fn revoke_client(&self, credential_id: &str) -> Result<(), AnchorError> {
        Self::update(&self.ledger, |f| {
            (f.clients_revoked.insert(credential_id.to_string()), ())
        })
    }

    /// Whether this machine remembers client credential `credential_id` as revoked.
    pub fn client_revoked(&self, credential_id: &str) -> Result<bool, AnchorError> {
        Ok(Self::read_facts(&self.ledger)?
            .clients_revoked
            .contains(credential_id))
    }

    /// The operator accepts the store as it is: the head is `mark`, and `workspace_id` is the
    /// store this path holds. Claimed uses, revocations and trust versions stay: a trust the
    /// store lost is trusted again only by a new signature (`gaffer trust` signs above it).
    pub fn reanchor(&self, mark: &HeadMark, workspace_id: &str) -> Result<(), AnchorError> {
        self.reset_head(mark)?;
        Self::update(&self.dir, |f| {
            f.snapshots.clear();
            (true, ())
        })?;
        write_atomic(&self.root_file, workspace_id.as_bytes())
    }

    /// The workspace id this machine last saw at this path, if any.
    pub fn root_id(&self) -> Result<Option<String>, AnchorError> {
        match std::fs::read_to_string(&self.root_file) {
            Ok(id) => Ok(Some(id)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&self.root_file)(e)),
        }
    }

    /// Records `workspace_id` as the store at this path, if none was recorded yet.
    pub fn adopt_root_id(&self, workspace_id: &str) -> Result<Option<String>, AnchorError> {
        let _lock = lock_dir(self.root_file.parent().unwrap_or(&self.dir))?;
        match self.root_id()? {
            Some(id) => Ok(Some(id)),
            None => {
                write_atomic(&self.root_file, workspace_id.as_bytes())?;
                Ok(None)
            }
        }
    }
}

fn key_of(path: &Path, bytes: &[u8]) -> Result<[u8; SEAL_KEY_LEN], AnchorError> {
    bytes.try_into().map_err(|_| AnchorError::Corrupt {
        path: path.to_path_buf(),
        reason: format!("a seal key is {SEAL_KEY_LEN} bytes, not {}", bytes.len()),
    })
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), AnchorError> {
    crate::store::write_file_atomic(path, bytes).map_err(|e| AnchorError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Creates `dir` if needed and holds its `lock` file's exclusive lock while the returned file
/// lives (other gaffer processes change the same facts).
fn lock_dir(dir: &Path) -> Result<File, AnchorError> {
    ensure(dir)?;
    let lock_path = dir.join("lock");
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(io_err(&lock_path))?;
    lock.lock().map_err(io_err(&lock_path))?;
    Ok(lock)
}

fn ensure(dir: &Path) -> Result<(), AnchorError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))
}

/// `path` with its longest existing prefix resolved (symlinks included), so a state
/// directory not created yet is still judged by where it will really be.
fn canonical_prefix(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut at = path.to_path_buf();
    loop {
        if let Ok(real) = at.canonicalize() {
            return rest.iter().rev().fold(real, |p, c| p.join(c));
        }
        match (at.file_name().map(|n| n.to_os_string()), at.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                at = parent.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

fn slot_body(mark: &HeadMark) -> String {
    format!("{:020} {}", mark.seq, mark.hash)
}

/// `{seq:020} {hash} {crc32 of what precedes:08x}\n`, padded with spaces to [`SLOT`] bytes
/// (cut there if longer). Written in place, as every append writes one.
fn encode_slot(mark: &HeadMark) -> [u8; SLOT] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [b' '; SLOT];
    let body = 20 + 1 + mark.hash.len();
    if body + 10 > SLOT {
        // No head this long is ever written; cut as the formatted line would be.
        let text = slot_body(mark);
        let line = format!("{text} {:08x}\n", crc32fast::hash(text.as_bytes()));
        let n = line.len().min(SLOT);
        out[..n].copy_from_slice(&line.as_bytes()[..n]);
        return out;
    }
    let mut seq = mark.seq;
    for digit in out[..20].iter_mut().rev() {
        *digit = b'0' + (seq % 10) as u8;
        seq /= 10;
    }
    out[21..body].copy_from_slice(mark.hash.as_bytes());
    let crc = crc32fast::hash(&out[..body]);
    for (k, digit) in out[body + 1..body + 9].iter_mut().enumerate() {
        *digit = HEX[(crc >> (28 - 4 * k) & 0xf) as usize];
    }
    out[body + 9] = b'\n';
    out
}

/// The newer of the head file's slots that check.
fn newest_slot(bytes: &[u8]) -> Option<HeadMark> {
    bytes
        .chunks(SLOT)
        .filter_map(parse_slot)
        .max_by_key(|m| m.seq)
}

/// The hashes a slot holds: 64 hex digits. A mark with one reads back from its slot as
/// written (see the round-trip property test).
fn is_head_hash(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit())
}

fn parse_slot(slot: &[u8]) -> Option<HeadMark> {
    let text = std::str::from_utf8(slot).ok()?;
    let line = text.split('\n').next()?;
    let (body, crc) = line.rsplit_once(' ')?;
    if u32::from_str_radix(crc, 16).ok()? != crc32fast::hash(body.as_bytes()) {
        return None;
    }
    let (seq, hash) = body.split_once(' ')?;
    is_head_hash(hash).then(|| {
        Some(HeadMark {
            seq: seq.parse().ok()?,
            hash: hash.to_string(),
        })
    })?
}

/// Compares the journal as opened with the anchored head. `hash_at` gives the hash of a record
/// the journal holds (recent ones); `snapshot` is the authenticated snapshot the state starts
/// from, if any (its seq and head).
/// `broken_at` is the first broken link read: a record at or before the anchored head was
/// altered in place (its successors then no longer link to it), which is a rewrite too.
pub fn judge(
    anchored: &HeadMark,
    last_seq: u64,
    hash_at: impl Fn(u64) -> Option<String>,
    snapshot: Option<(u64, &str)>,
    broken_at: Option<u64>,
) -> Standing {
    let rolled = |detail: String| Standing::RolledBack { detail };
    if let Some(at) = broken_at.filter(|at| *at <= anchored.seq) {
        return rolled(format!(
            "the hash chain breaks at seq {at}, at or before seq {} which this machine saw: \
             the journal was altered",
            anchored.seq
        ));
    }
    if last_seq < anchored.seq {
        return rolled(format!(
            "the journal ends at seq {last_seq}, but this machine saw it reach seq {}",
            anchored.seq
        ));
    }
    let found = match snapshot {
        Some((seq, head)) if seq == anchored.seq => Some(head.to_string()),
        Some((seq, _)) if seq > anchored.seq => return Standing::Intact,
        _ => hash_at(anchored.seq),
    };
    match found {
        Some(h) if h == anchored.hash => Standing::Intact,
        Some(h) => rolled(format!(
            "record {} hashes to {h}, but this machine saw {}: the journal was rewritten",
            anchored.seq, anchored.hash
        )),
        None => rolled(format!(
            "record {} (the last this machine saw) cannot be found to compare",
            anchored.seq
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(seq: u64, c: char) -> HeadMark {
        HeadMark {
            seq,
            hash: c.to_string().repeat(64),
        }
    }

    /// The slot written in place is, byte for byte, the line as formatted (the form every
    /// head file already holds), for any seq and for heads too long for a slot.
    #[test]
    fn a_slot_is_the_formatted_line_padded() {
        for (seq, hash) in [
            (0, "a".repeat(64)),
            (42, "0123456789abcdef".repeat(4)),
            (u64::MAX, "f".repeat(64)),
            (7, "b".repeat(200)),
        ] {
            let m = HeadMark { seq, hash };
            let body = slot_body(&m);
            let line = format!("{body} {:08x}\n", crc32fast::hash(body.as_bytes()));
            let mut want = [b' '; SLOT];
            let n = line.len().min(SLOT);
            want[..n].copy_from_slice(&line.as_bytes()[..n]);
            assert_eq!(encode_slot(&m), want, "seq {seq}");
        }
    }

    #[test]
    fn a_slot_round_trips_and_any_damage_is_refused() {
        let m = mark(42, 'a');
        let s = encode_slot(&m);
        assert_eq!(parse_slot(&s), Some(m));
        for i in 0..s.len() {
            let mut d = s;
            d[i] ^= 0x01;
            let parsed = parse_slot(&d);
            assert!(
                parsed.is_none() || parsed == Some(mark(42, 'a')),
                "byte {i} changed gave {parsed:?}"
            );
        }
    }

    proptest::proptest! {
        /// Any slot written reads back; any bytes at all parse to a head only if they check.
        #[test]
        fn prop_slots_round_trip_and_arbitrary_bytes_never_panic(
            seq in proptest::prelude::any::<u64>(),
            hash in "[0-9a-fA-F]{64}",
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
        ) {
            let m = HeadMark { seq, hash };
            proptest::prop_assert_eq!(parse_slot(&encode_slot(&m)), Some(m));
            if let Some(found) = parse_slot(&junk) {
                // Only a line exactly as written parses: the same bytes up to its newline.
                let line = encode_slot(&found);
                let end = line.iter().position(|b| *b == b'\n').map_or(0, |i| i + 1);
                proptest::prop_assert_eq!(&line[..end], &junk[..end.min(junk.len())]);
            }
        }
    }

    #[test]
    fn judging_the_journal_against_the_anchored_head() {
        let a = mark(10, 'a');
        let at = |seq: u64| (seq == 10).then(|| "a".repeat(64));
        let rolled = |s: Standing| matches!(s, Standing::RolledBack { .. });
        assert_eq!(judge(&a, 12, at, None, None), Standing::Intact);
        assert!(rolled(judge(&a, 9, at, None, None)));
        let other = |_| Some("b".repeat(64));
        assert!(rolled(judge(&a, 12, other, None, None)));
        assert!(rolled(judge(&a, 12, |_| None, None, None)));
        let head = "a".repeat(64);
        assert_eq!(
            judge(&a, 10, |_| None, Some((10, &head)), None),
            Standing::Intact
        );
        assert_eq!(
            judge(&a, 20, |_| None, Some((15, "x")), None),
            Standing::Intact
        );
        assert!(rolled(judge(&a, 10, |_| None, Some((10, "x")), None)));
        // A break after the anchored head is an append (no signed approval holds then); one at
        // or before it is an alteration.
        assert_eq!(judge(&a, 12, at, None, Some(11)), Standing::Intact);
        assert!(rolled(judge(&a, 12, at, None, Some(10))));
        assert!(rolled(judge(&a, 12, at, None, Some(3))));
    }

    fn anchor_in(dir: &Path) -> Anchor {
        Anchor {
            dir: dir.join("ws"),
            ledger: dir.join("ledger"),
            root_file: dir.join("roots").join("r"),
            head: Mutex::new(None),
        }
    }

    #[test]
    fn heads_advance_and_the_newest_slot_wins() {
        let d = tempfile::tempdir().expect("tempdir");
        let a = anchor_in(d.path());
        assert_eq!(a.head().expect("read"), None);
        for seq in 1..6 {
            a.advance(&mark(seq, 'c')).expect("advance");
            assert_eq!(a.head().expect("read"), Some(mark(seq, 'c')));
        }
        // A torn newest slot leaves the other one.
        let path = a.dir().join("head");
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[SLOT + 3] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        assert_eq!(a.head().expect("read"), Some(mark(4, 'c')));
    }

    #[test]
    fn a_reset_head_is_what_other_processes_next_appends_advance() {
        // Process `a` holds its handle on `head` from an earlier append; the operator resets
        // the head from process `b`; `a`'s next append must land where everyone reads.
        let d = tempfile::tempdir().expect("tempdir");
        let a = anchor_in(d.path());
        let b = anchor_in(d.path());
        a.advance(&mark(5, 'a')).expect("advance");
        b.reset_head(&mark(2, 'b')).expect("reset");
        assert_eq!(a.head().expect("read"), Some(mark(2, 'b')));
        a.advance(&mark(3, 'c')).expect("advance after the reset");
        assert_eq!(b.head().expect("read"), Some(mark(3, 'c')));
        assert_eq!(
            anchor_in(d.path()).head().expect("read"),
            Some(mark(3, 'c'))
        );
    }

    /// Each append judges the head the file holds now: a slot another process rewrote, or
    /// that was damaged, since this process last read or wrote it is parsed afresh, never
    /// taken from what this process remembers of it.
    #[test]
    fn an_append_judges_the_head_as_the_file_holds_it_not_as_remembered() {
        let d = tempfile::tempdir().expect("tempdir");
        let (a, b) = (anchor_in(d.path()), anchor_in(d.path()));
        let judged = |anchor: &Anchor, next: HeadMark| {
            let mut seen = None;
            anchor
                .advance_checked(&next, |m| {
                    seen = Some(m.clone());
                    Standing::Intact
                })
                .expect("advance");
            seen
        };
        a.advance(&mark(4, 'a')).expect("advance");
        assert_eq!(judged(&a, mark(5, 'a')), Some(mark(4, 'a')));
        assert_eq!(judged(&b, mark(6, 'b')), Some(mark(5, 'a')));
        assert_eq!(judged(&a, mark(7, 'c')), Some(mark(6, 'b')));
        assert_eq!(judged(&a, mark(8, 'c')), Some(mark(7, 'c')));
        // The newest slot (seq 8, slot 0) torn on disk: the other one stands.
        let path = a.dir().join("head");
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[3] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        assert_eq!(judged(&a, mark(9, 'd')), Some(mark(7, 'c')));
        // Cut back to one slot: only what is left is judged.
        std::fs::write(&path, &bytes[..SLOT]).expect("cut");
        assert_eq!(judged(&a, mark(10, 'e')), None);
        assert_eq!(a.head().expect("read"), Some(mark(10, 'e')));
    }

    #[test]
    fn a_use_is_claimed_once_and_revocation_refuses_the_rest() {
        let d = tempfile::tempdir().expect("tempdir");
        let a = anchor_in(d.path());
        let later = crate::util::now_ms() + 60_000;
        assert_eq!(a.claim("ap_1", "op_1", 2, later), Ok(()));
        assert_eq!(
            a.claim("ap_1", "op_1", 2, later),
            Err(ClaimRefused::AlreadyClaimed)
        );
        assert_eq!(a.claim("ap_1", "op_2", 2, later), Ok(()));
        assert_eq!(a.claim("ap_1", "op_3", 2, later), Err(ClaimRefused::UsedUp));
        a.release("ap_1", "op_2").expect("release");
        assert_eq!(a.claim("ap_1", "op_3", 2, later), Ok(()));
        a.revoke("ap_2", later).expect("revoke");
        assert_eq!(
            a.claim("ap_2", "op_9", 5, later),
            Err(ClaimRefused::Revoked)
        );
        // Uses past their keep are forgotten at the next write.
        assert_eq!(a.claim("ap_old", "op_1", 1, 0), Ok(()));
        a.raise_trusted("policy.yaml", 3).expect("raise");
        assert_eq!(a.claim("ap_old", "op_2", 1, 0), Ok(()));
    }

    #[test]
    fn trust_versions_only_rise_even_across_a_reanchor() {
        let d = tempfile::tempdir().expect("tempdir");
        let a = anchor_in(d.path());
        a.raise_trusted("policy.yaml", 3).expect("raise");
        a.raise_trusted("policy.yaml", 2).expect("raise");
        assert_eq!(a.trusted_version("policy.yaml").expect("read"), 3);
        assert_eq!(a.adopt_root_id("ws_a").expect("adopt"), None);
        assert_eq!(a.adopt_root_id("ws_b").expect("adopt"), Some("ws_a".into()));
        a.reanchor(&mark(7, 'd'), "ws_b").expect("reanchor");
        assert_eq!(a.trusted_version("policy.yaml").expect("read"), 3);
        assert_eq!(a.head().expect("read"), Some(mark(7, 'd')));
        assert_eq!(a.root_id().expect("read"), Some("ws_b".into()));
    }
}
