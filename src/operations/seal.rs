//! Seals: which operation records a gaffer on this machine wrote for a client it checked.
//!
//! The agent can write the store, so an `operation.created` record's client name, idempotency
//! key and plan are only its writer's claims: a forged request can name whichever client the
//! operator trusts most, or sit under another client's idempotency key so that the client's
//! retried submission "replays" an outcome that never happened. A serving or CLI process seals
//! each submission it accepts from a connection whose identity it checked, with an HMAC keyed
//! by a secret kept in the workspace's anchor directory (outside the workspace, where nothing
//! gaffer starts can read; see [`crate::anchor`]). A request whose seal does not check was
//! written by something else (or by gaffer on another machine, or before seals existed): it
//! is left out of the approvals list unless the operator asks for it, shown as unverified when
//! asked for, and a replayed submission refuses to report it.
//!
//! The request seal binds the journal seq of its record, so a copy appended after a prune
//! freed the id does not check. Every change gaffer records is sealed too (a step seal over
//! the state it leaves, bound to the creating record), but only when the operation stands as
//! gaffer left it: after a step the agent appended, nothing gaffer writes is vouched for, so a
//! forged step cannot be turned into a sealed outcome by gaffer's own recovery.
//!
//! A prune (`operation.pruned`, the retention sweep's) is sealed over its cut-off and the seq
//! of its record, and it is the one seal a fold checks ([`SealSource`]): a prune without a
//! seal that checks is skipped, so the agent cannot make gaffer forget a finished operation
//! and have its client's retry under the same key submitted, and run, again.
//!
//! A seal authorizes nothing: authority stays with the operator's signature and the trusted
//! policy, checked against the plan text at execution.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use hmac::{KeyInit, Mac};

use super::lifecycle::OpState;
use super::state::{Approval, OpFailure, Operation, Pruned, Transitioned};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Length of the key kept in the anchor directory.
pub const SEAL_KEY_LEN: usize = 32;

/// This machine's seal for one workspace.
pub struct Sealer {
    key: [u8; SEAL_KEY_LEN],
    workspace_id: String,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("workspace_id", &self.workspace_id)
            .finish_non_exhaustive()
    }
}

impl Sealer {
    pub fn new(key: [u8; SEAL_KEY_LEN], workspace_id: &str) -> Sealer {
        Sealer {
            key,
            workspace_id: workspace_id.to_string(),
        }
    }

    /// The MAC over what a request's record says and never changes (who asked, under which
    /// key, for which plan, in which words, on which terms, when) and the journal position
    /// of that record: a copy of it appended later (after a prune freed its id) is another
    /// record, and does not check.
    /// (The seq goes in last, so all but it can be fed before the record is staged.)
    fn request_mac(&self, op: &Operation, approval: Option<&Approval>) -> HmacSha256 {
        let mut mac = self.keyed("gaffer operation.request v2");
        let text = |v: &serde_json::Value| v.to_string();
        for p in [
            &op.id,
            &op.client_id,
            &op.idempotency_key,
            &op.submitted,
            &op.operation,
            &op.provider,
            &op.reason,
            &text(&op.target),
            &text(&op.arguments),
            &op.presentation.title,
            &op.presentation.summary,
            &op.created_at_ms.to_string(),
        ] {
            part(&mut mac, Some(p));
        }
        part(&mut mac, op.plan_digest.as_deref());
        part(&mut mac, op.approval_id.as_deref());
        // The terms of the request made with it (a window grant it runs under is not its own).
        match approval {
            Some(a) => {
                let mode = serde_json::to_value(a.mode).unwrap_or_default();
                for t in [
                    &a.id,
                    &text(&mode),
                    &a.requested_duration_seconds.to_string(),
                    &a.requested_max_uses.to_string(),
                    &a.created_at_ms.to_string(),
                    &a.pending_expires_at_ms.to_string(),
                ] {
                    part(&mut mac, Some(t));
                }
            }
            None => part(&mut mac, None),
        }
        mac
    }

    fn keyed(&self, domain: &str) -> HmacSha256 {
        // `new_from_slice` takes keys of any length; 32 bytes never fail.
        let mut mac = HmacSha256::new_from_slice(&self.key).unwrap_or_else(|_| unreachable!());
        part(&mut mac, Some(domain));
        part(&mut mac, Some(&self.workspace_id));
        mac
    }

    /// The seal of `op` (with `approval`, the request made with it), but for the journal
    /// position of its record, which is known only once it is staged (under the state lock,
    /// where little else should be done).
    pub fn request(&self, op: &Operation, approval: Option<&Approval>) -> RequestSeal {
        RequestSeal(self.request_mac(op, approval))
    }

    /// Whether `op`, folded from the record at `op.created_seq`, carries a seal this machine
    /// made for exactly that record. `approval` is the one `op.approval_id` names, if any: it
    /// counts as the request's own only when it was made for `op`.
    pub fn checks(&self, op: &Operation, approval: Option<&Approval>) -> bool {
        let own = approval.filter(|a| a.operation_id == op.id);
        let mut mac = self.request_mac(op, own);
        part(&mut mac, Some(&op.created_seq.to_string()));
        matches(op.request_seal.as_deref(), mac)
    }

    /// The MAC over an operation as a change gaffer recorded left it: its state and revision,
    /// and the error, result and upstream status it reports, bound to the record that created
    /// it (id and seq: a step of a copy re-created later does not check).
    fn step_mac(&self, step: Step<'_>) -> HmacSha256 {
        let mut mac = self.keyed("gaffer operation.step v1");
        part(&mut mac, Some(step.id));
        part(&mut mac, Some(&step.created_seq.to_string()));
        part(&mut mac, Some(step.state.as_str()));
        part(&mut mac, Some(&step.revision.to_string()));
        part(&mut mac, step.error.map(|e| e.code.as_str()));
        part(&mut mac, step.error.map(|e| e.message.as_str()));
        part(&mut mac, step.result.map(|v| v.to_string()).as_deref());
        let upstream = step.upstream_status.map(|u| u.to_string());
        part(&mut mac, upstream.as_deref());
        mac
    }

    /// The seal of the step `t` takes `op` to, folded as the state folds it; None when `op`
    /// as it stands was not left so by gaffer (a step the agent appended): gaffer does not
    /// vouch for what follows a change it did not make.
    pub fn seal_step(&self, op: &Operation, t: &Transitioned) -> Option<String> {
        self.stands(op).then(|| {
            hex_of(self.step_mac(Step {
                id: &op.id,
                created_seq: op.created_seq,
                state: t.to,
                revision: t.revision,
                error: t.error.as_ref().or(op.error.as_ref()),
                result: t.result.as_ref().or(op.result.as_ref()),
                upstream_status: t.upstream_status.or(op.upstream_status),
            }))
        })
    }

    /// Whether `op` is as gaffer left it: as created (the request seal speaks for the record
    /// that created it), or with a step seal this machine made for exactly its state.
    pub fn stands(&self, op: &Operation) -> bool {
        op.revision == 1 || matches(op.step_seal.as_deref(), self.step_mac(Step::of(op)))
    }
}

impl Sealer {
    /// The MAC over a retention sweep's cut-off and the journal position of its record: a
    /// copy appended later, or one with another cut-off, does not check.
    fn prune_mac(&self, before_ms: u64, seq: u64) -> HmacSha256 {
        let mut mac = self.keyed("gaffer operation.pruned v1");
        part(&mut mac, Some(&before_ms.to_string()));
        part(&mut mac, Some(&seq.to_string()));
        mac
    }

    /// The seal of a prune of everything terminal before `before_ms`, recorded at `seq`.
    pub fn seal_prune(&self, before_ms: u64, seq: u64) -> String {
        hex_of(self.prune_mac(before_ms, seq))
    }

    /// Whether the prune recorded at `seq` was sealed here, for exactly its cut-off.
    pub fn checks_prune(&self, p: &Pruned, seq: u64) -> bool {
        matches(p.seal.as_deref(), self.prune_mac(p.before_ms, seq))
    }

    /// Whether a finished `op` outlives every prune: a request accepted here whose ending
    /// gaffer did not seal (the agent ended it, maybe while it still ran, which starts its
    /// retention early). Forgotten, its client's retry under the same key would be submitted
    /// and run again; kept, the retry is refused as unverified. Kept for good: only what the
    /// agent ended is.
    pub fn keeps(&self, op: &Operation, approval: Option<&Approval>) -> bool {
        self.checks(op, approval) && !self.stands(op)
    }
}

/// Where a fold finds this machine's seal for the workspace it folds, to honour only the
/// prunes a gaffer here sealed (a prune the agent appends would make gaffer forget finished
/// operations, so a client's retried submission would run again).
#[derive(Clone, Default)]
pub struct SealSource(Option<Arc<Source>>);

enum Source {
    /// The key in the anchor directory of the workspace at `root`: read, never created, and
    /// looked for again until found (it may be made after the fold began).
    Anchored {
        root: PathBuf,
        chain: crate::store::ChainView,
        /// The id the journal's first record declares, when the fold read it.
        declared: Mutex<Option<String>>,
        found: Mutex<Option<Arc<Sealer>>>,
        /// A key that cannot be read is logged once.
        warned: AtomicBool,
    },
    Fixed(Arc<Sealer>),
}

impl std::fmt::Debug for SealSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0.as_deref() {
            Some(Source::Anchored { .. }) => "SealSource(anchor)",
            Some(Source::Fixed(_)) => "SealSource(fixed)",
            None => "SealSource(none)",
        })
    }
}

impl SealSource {
    /// The anchor's seal for the workspace at `root` (canonical) whose journal `chain` reads.
    pub fn anchored(root: &Path, chain: crate::store::ChainView) -> SealSource {
        SealSource(Some(Arc::new(Source::Anchored {
            root: root.to_path_buf(),
            chain,
            declared: Mutex::new(None),
            found: Mutex::new(None),
            warned: AtomicBool::new(false),
        })))
    }

    /// Always this sealer (for tests of the fold).
    pub fn fixed(sealer: Sealer) -> SealSource {
        SealSource(Some(Arc::new(Source::Fixed(Arc::new(sealer)))))
    }

    /// The fold read the journal's first record, which declares the workspace id: a replay
    /// from the start learns it before the chain view does.
    pub fn declared(&self, workspace_id: &str) {
        if let Some(Source::Anchored { declared, .. }) = self.0.as_deref() {
            *lock(declared) = Some(workspace_id.to_string());
        }
    }

    /// The sealer, if this machine's key for the workspace can be read now.
    pub fn sealer(&self) -> Option<Arc<Sealer>> {
        let (root, chain, declared, found, warned) = match self.0.as_deref()? {
            Source::Fixed(sealer) => return Some(Arc::clone(sealer)),
            Source::Anchored {
                root,
                chain,
                declared,
                found,
                warned,
            } => (root, chain, declared, found, warned),
        };
        if let Some(found) = lock(found).clone() {
            return Some(found);
        }
        let id = lock(declared).clone().or_else(|| chain.workspace_id())?;
        let key = crate::anchor::Anchor::locate(root, &id)
            .and_then(|a| a.existing_seal_key())
            .inspect_err(|e| {
                if !warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "the seal key cannot be read: no prune is honoured");
                }
            })
            .ok()
            .flatten()?;
        let sealer = Arc::new(Sealer::new(key, &id));
        *lock(found) = Some(Arc::clone(&sealer));
        Some(sealer)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A request seal waiting for the seq of its record.
#[derive(Clone)]
pub struct RequestSeal(HmacSha256);

impl RequestSeal {
    /// The seal of the request recorded at journal position `seq`.
    pub fn at(mut self, seq: u64) -> String {
        part(&mut self.0, Some(&seq.to_string()));
        hex_of(self.0)
    }
}

/// What a step seal covers.
struct Step<'a> {
    id: &'a str,
    created_seq: u64,
    state: OpState,
    revision: u64,
    error: Option<&'a OpFailure>,
    result: Option<&'a serde_json::Value>,
    upstream_status: Option<u16>,
}

impl<'a> Step<'a> {
    fn of(op: &'a Operation) -> Step<'a> {
        Step {
            id: &op.id,
            created_seq: op.created_seq,
            state: op.state,
            revision: op.revision,
            error: op.error.as_ref(),
            result: op.result.as_ref(),
            upstream_status: op.upstream_status,
        }
    }
}

/// One field into `mac`: absent, or present with its length, so no two different sets of
/// fields feed the same bytes (an absent field is not an empty one).
fn part(mac: &mut HmacSha256, field: Option<&str>) {
    match field {
        None => mac.update(&[0]),
        Some(f) => {
            mac.update(&[1]);
            mac.update(&(f.len() as u64).to_be_bytes());
            mac.update(f.as_bytes());
        }
    }
}

fn hex_of(mac: HmacSha256) -> String {
    crate::util::hex(&mac.finalize().into_bytes())
}

/// Whether `seal` is `mac`'s value (compared in constant time).
fn matches(seal: Option<&str>, mac: HmacSha256) -> bool {
    seal.and_then(unhex)
        .is_some_and(|bytes| mac.verify_slice(&bytes).is_ok())
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() != 64 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operations::state::tests::op;
    use std::sync::Arc;

    fn pending() -> Operation {
        let mut o = op("op_1", OpState::Pending, Some("apr_1"));
        o.client_id = "ci-agent".into();
        o
    }

    #[test]
    fn a_request_seal_checks_only_for_what_it_was_made_over() {
        let sealer = Sealer::new([7; SEAL_KEY_LEN], "ws_1");
        let mut sealed = pending();
        let approval = crate::operations::state::tests::approval("apr_1", "op_1");
        assert!(!sealer.checks(&sealed, Some(&approval)), "no seal");
        sealed.request_seal = Some(sealer.request(&sealed, Some(&approval)).at(42));
        assert!(
            !sealer.checks(&sealed, Some(&approval)),
            "folded at another seq"
        );
        sealed.created_seq = 42;
        assert!(sealer.checks(&sealed, Some(&approval)));
        // What changes over an operation's life is not in it: state, revision, result.
        let mut later = sealed.clone();
        later.state = OpState::Succeeded;
        later.revision = 3;
        later.result = Some(serde_json::json!({"ok": true}));
        assert!(sealer.checks(&later, Some(&approval)));
        let edits: [fn(&mut Operation); 13] = [
            |o| o.client_id = "operator-favourite".into(),
            |o| o.idempotency_key = "k2".into(),
            |o| o.submitted = "t".repeat(64),
            |o| o.operation = "command.run".into(),
            |o| o.reason = "the operator asked for this".into(),
            |o| o.target = Arc::new(serde_json::json!({"path": "x"})),
            |o| o.presentation.summary = "harmless".into(),
            |o| o.plan_digest = Some("e".repeat(64)),
            |o| o.plan_digest = Some(String::new()),
            |o| o.approval_id = None,
            |o| o.id = "op_2".into(),
            |o| o.created_at_ms += 1,
            |o| o.created_seq = 43,
        ];
        for edit in edits {
            let mut forged = sealed.clone();
            edit(&mut forged);
            assert!(!sealer.checks(&forged, Some(&approval)), "{forged:?}");
        }
        // The request's terms, and whether it came with one at all.
        let terms: [fn(&mut Approval); 4] = [
            |a| a.pending_expires_at_ms += 600_000,
            |a| a.requested_max_uses = 50,
            |a| a.requested_duration_seconds = 86_400,
            |a| a.created_at_ms += 1,
        ];
        for edit in terms {
            let mut forged = approval.clone();
            edit(&mut forged);
            assert!(!sealer.checks(&sealed, Some(&forged)), "{forged:?}");
        }
        assert!(!sealer.checks(&sealed, None));
        let mut not_its_own = approval.clone();
        not_its_own.operation_id = "op_other".into();
        assert!(!sealer.checks(&sealed, Some(&not_its_own)));
        // Another workspace's or another machine's key.
        assert!(!Sealer::new([7; SEAL_KEY_LEN], "ws_2").checks(&sealed, Some(&approval)));
        assert!(!Sealer::new([8; SEAL_KEY_LEN], "ws_1").checks(&sealed, Some(&approval)));
        let mut garbled = sealed.clone();
        garbled.request_seal = Some("zz".repeat(32));
        assert!(!sealer.checks(&garbled, Some(&approval)));
    }

    #[test]
    fn a_step_seal_checks_on_the_folded_operation_only_and_only_after_sealed_steps() {
        let sealer = Sealer::new([7; SEAL_KEY_LEN], "ws_1");
        let mut approved = pending();
        approved.state = OpState::Approved;
        approved.created_seq = 9;
        approved.upstream_status = Some(200);
        let step =
            |from: &Operation, to: OpState| crate::operations::engine::transition(from, to, 99);
        // Folded as the state folds it.
        let fold = |op: &Operation, t: &Transitioned| {
            let mut o = op.clone();
            o.state = t.to;
            o.revision = t.revision;
            if t.result.is_some() {
                o.result = t.result.clone();
            }
            o.step_seal = t.seal.clone();
            o
        };
        // As created, the request seal speaks for the operation.
        assert!(sealer.stands(&approved));
        let mut t = step(&approved, OpState::Executing);
        t.seal = sealer.seal_step(&approved, &t);
        let executing = fold(&approved, &t);
        assert!(sealer.stands(&executing));
        let mut t = step(&executing, OpState::Succeeded);
        t.result = Some(serde_json::json!({"bytes_written": 3}));
        t.seal = sealer.seal_step(&executing, &t);
        let ended = fold(&executing, &t);
        assert!(sealer.stands(&ended));
        let edits: [fn(&mut Operation); 7] = [
            |o| o.state = OpState::Failed,
            |o| o.revision = 4,
            |o| o.result = Some(serde_json::json!({"bytes_written": 4})),
            |o| o.upstream_status = None,
            |o| o.error = Some(OpFailure::new("x", "y")),
            |o| o.id = "op_2".into(),
            |o| o.created_seq = 10,
        ];
        for edit in edits {
            let mut forged = ended.clone();
            edit(&mut forged);
            assert!(!sealer.stands(&forged), "{forged:?}");
        }
        // A step the agent appended (no seal) is not vouched for, nor anything gaffer writes
        // after it.
        let forged = fold(&approved, &step(&approved, OpState::Executing));
        assert!(!sealer.stands(&forged));
        let after = step(&forged, OpState::Failed);
        assert_eq!(sealer.seal_step(&forged, &after), None);
    }
}
