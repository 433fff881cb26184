//! Indexes over the folded operations, so that what runs on every request or notification
//! costs the size of its answer, not the number of operations held: the next deadline and
//! what is due (expiry), a client's active window approvals (routing a submission), and
//! list order overall, per state and per client (`operations/list` with a limit).
//!
//! Derived from `operations` and `approvals` only: never stored in a snapshot, rebuilt after
//! one is decoded, and kept equal to a rebuild by every fold (the property test in
//! `state::index_tests` checks exactly that, and each query against a full scan).
//!
//! Every entry naming an operation shares one [`Id`] (a reference-counted copy of its id), so
//! an operation held costs one id allocation however many indexes list it; a rebuild fills
//! its trees in bulk (full nodes) rather than one insertion at a time.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::lifecycle::OpState;
use super::policy::GrantMode;
use super::state::{Approval, ApprovalStatus, Operation};

/// An operation id as the derived structures hold it: one allocation shared by all of them.
pub type Id = Arc<str>;

/// (created_at_ms, id): list order, newest last.
pub type OrderKey = (u64, Id);

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Index {
    /// Every operation.
    pub order: BTreeSet<OrderKey>,
    pub by_state: HashMap<OpState, BTreeSet<OrderKey>>,
    pub by_client: HashMap<String, BTreeSet<OrderKey>>,
    /// (deadline, id) of operations with one (see [`deadline`]), and each one's deadline.
    pub deadlines: BTreeSet<(u64, Id)>,
    deadline_of: HashMap<Id, u64>,
    /// Approval id -> the non-terminal operations that name it: whose deadline it decides.
    refs: HashMap<String, BTreeSet<Id>>,
    /// Client -> its active window approvals.
    pub windows: HashMap<String, BTreeSet<String>>,
}

/// When `op` expires if nobody acts: a pending request when its approval's request window
/// ends, an approved one when its decision expires. None for every other state.
pub fn deadline(op: &Operation, approvals: &BTreeMap<String, Approval>) -> Option<u64> {
    let a = approvals.get(op.approval_id.as_ref()?)?;
    match op.state {
        OpState::Pending if a.status == ApprovalStatus::Pending => Some(a.pending_expires_at_ms),
        OpState::Approved => a.decision.as_ref()?.expires_at_ms,
        _ => None,
    }
}

/// What is derived from `operations` and `approvals`, sharing one [`Id`] per operation.
#[derive(Debug, Default)]
pub struct Derived {
    pub index: Index,
    /// (terminal_at_ms, id) of terminal operations, oldest first.
    pub terminal: BTreeSet<(u64, Id)>,
    /// client -> idempotency key -> operation id.
    pub by_key: BTreeMap<String, BTreeMap<String, Id>>,
}

/// From this many operations on, [`derive`] builds its two halves on two threads.
pub(crate) const DERIVE_IN_PARALLEL_FROM: usize = 4096;

/// Everything derived from `operations` and `approvals`, each tree built in bulk. Each
/// operation's shared id is made once; list order and the rest are independent halves, built
/// side by side when there are many operations (a snapshot's decode is followed by this).
pub fn derive(
    operations: &super::state::Operations,
    approvals: &BTreeMap<String, Approval>,
) -> Derived {
    let ops: Vec<(&Operation, Id)> = operations
        .values()
        .map(|op| (&**op, Arc::from(op.id.as_str())))
        .collect();
    let (lists, rest) = if ops.len() >= DERIVE_IN_PARALLEL_FROM {
        std::thread::scope(|s| {
            let lists = crate::util::spawn_scoped(s, "gaffer-index", || Lists::of(&ops));
            let rest = Rest::of(&ops, approvals);
            let lists = lists.map_or_else(|| Lists::of(&ops), crate::util::join_scoped);
            (lists, rest)
        })
    } else {
        (Lists::of(&ops), Rest::of(&ops, approvals))
    };
    Derived {
        index: Index {
            order: lists.order,
            by_state: lists.by_state,
            by_client: lists.by_client,
            deadlines: rest.deadlines,
            deadline_of: rest.deadline_of,
            refs: rest.refs,
            windows: rest.windows,
        },
        terminal: rest.terminal,
        by_key: rest.by_key,
    }
}

/// List order: overall, per state, per client.
struct Lists {
    order: BTreeSet<OrderKey>,
    by_state: HashMap<OpState, BTreeSet<OrderKey>>,
    by_client: HashMap<String, BTreeSet<OrderKey>>,
}

impl Lists {
    fn of(ops: &[(&Operation, Id)]) -> Lists {
        let mut order = Vec::with_capacity(ops.len());
        let mut by_state: HashMap<OpState, Vec<OrderKey>> = HashMap::new();
        let mut by_client: HashMap<&str, Vec<OrderKey>> = HashMap::new();
        for (op, id) in ops {
            let key = (op.created_at_ms, Arc::clone(id));
            order.push(key.clone());
            by_state.entry(op.state).or_default().push(key.clone());
            by_client.entry(&op.client_id).or_default().push(key);
        }
        Lists {
            order: order.into_iter().collect(),
            by_state: by_state
                .into_iter()
                .map(|(s, v)| (s, v.into_iter().collect()))
                .collect(),
            by_client: by_client
                .into_iter()
                .map(|(c, v)| (c.to_string(), v.into_iter().collect()))
                .collect(),
        }
    }
}

/// Deadlines, approval references, windows, retention order and idempotency keys.
struct Rest {
    deadlines: BTreeSet<(u64, Id)>,
    deadline_of: HashMap<Id, u64>,
    refs: HashMap<String, BTreeSet<Id>>,
    windows: HashMap<String, BTreeSet<String>>,
    terminal: BTreeSet<(u64, Id)>,
    by_key: BTreeMap<String, BTreeMap<String, Id>>,
}

impl Rest {
    fn of(ops: &[(&Operation, Id)], approvals: &BTreeMap<String, Approval>) -> Rest {
        let mut refs: HashMap<&str, Vec<Id>> = HashMap::new();
        let mut deadlines = Vec::new();
        let mut terminal = Vec::new();
        let mut keys: HashMap<&str, Vec<(String, Id)>> = HashMap::new();
        for (op, id) in ops {
            if !op.state.is_terminal()
                && let Some(a) = &op.approval_id
            {
                refs.entry(a).or_default().push(Arc::clone(id));
            }
            if let Some(at) = deadline(op, approvals) {
                deadlines.push((at, Arc::clone(id)));
            }
            if let Some(t) = op.terminal_at_ms {
                terminal.push((t, Arc::clone(id)));
            }
            keys.entry(&op.client_id)
                .or_default()
                .push((op.idempotency_key.clone(), Arc::clone(id)));
        }
        let windows = approvals
            .values()
            .filter(|a| a.mode == GrantMode::Window && a.status == ApprovalStatus::Active)
            .fold(HashMap::<String, BTreeSet<String>>::new(), |mut w, a| {
                w.entry(a.client_id.clone())
                    .or_default()
                    .insert(a.id.clone());
                w
            });
        Rest {
            deadline_of: deadlines
                .iter()
                .map(|(at, id)| (Arc::clone(id), *at))
                .collect(),
            deadlines: deadlines.into_iter().collect(),
            refs: refs
                .into_iter()
                .map(|(a, v)| (a.to_string(), v.into_iter().collect()))
                .collect(),
            windows,
            terminal: terminal.into_iter().collect(),
            by_key: keys
                .into_iter()
                .map(|(c, v)| (c.to_string(), v.into_iter().collect()))
                .collect(),
        }
    }
}

fn remove_key<K: std::hash::Hash + Eq>(
    map: &mut HashMap<K, BTreeSet<OrderKey>>,
    k: &K,
    key: &OrderKey,
) {
    if let Some(set) = map.get_mut(k) {
        set.remove(key);
        if set.is_empty() {
            map.remove(k);
        }
    }
}

impl Index {
    /// The index of `operations` and `approvals`, from scratch.
    pub fn build(
        operations: &super::state::Operations,
        approvals: &BTreeMap<String, Approval>,
    ) -> Index {
        derive(operations, approvals).index
    }

    /// Adds `op` under its current fields (not its deadline: see [`Index::set_deadline`]),
    /// with a fresh shared id, which it returns.
    pub fn insert_op(&mut self, op: &Operation) -> Id {
        let id: Id = Arc::from(op.id.as_str());
        self.insert_op_as(op, Arc::clone(&id));
        id
    }

    /// [`Index::insert_op`] sharing `id` (`op`'s id).
    fn insert_op_as(&mut self, op: &Operation, id: Id) {
        let key = (op.created_at_ms, Arc::clone(&id));
        self.order.insert(key.clone());
        self.by_state
            .entry(op.state)
            .or_default()
            .insert(key.clone());
        // Looked up first: `entry` would allocate a copy of the client's name every time.
        match self.by_client.get_mut(op.client_id.as_str()) {
            Some(set) => {
                set.insert(key);
            }
            None => {
                self.by_client
                    .insert(op.client_id.clone(), BTreeSet::from([key]));
            }
        }
        if !op.state.is_terminal()
            && let Some(a) = &op.approval_id
        {
            self.refs.entry(a.clone()).or_default().insert(id);
        }
    }

    /// Removes `op` as it was last inserted, deadline included; returns its shared id.
    pub fn remove_op(&mut self, op: &Operation) -> Option<Id> {
        let key: (u64, Id) = (op.created_at_ms, Arc::from(op.id.as_str()));
        let taken = self.order.take(&key).map(|(_, id)| id);
        remove_key(&mut self.by_state, &op.state, &key);
        remove_key(&mut self.by_client, &op.client_id, &key);
        if let Some(a) = &op.approval_id
            && let Some(set) = self.refs.get_mut(a)
        {
            set.remove(op.id.as_str());
            if set.is_empty() {
                self.refs.remove(a);
            }
        }
        self.set_deadline(&op.id, None);
        taken
    }

    /// Re-files `op` (as last inserted) under state `to`: list order and its client's list
    /// do not depend on the state, so only its state's list moves, and it stops referring to
    /// its approval once terminal. Returns its shared id. The deadline is the caller's to
    /// refresh (it depends on the approval too).
    pub fn change_state(&mut self, op: &Operation, to: OpState) -> Id {
        let probe: OrderKey = (op.created_at_ms, Arc::from(op.id.as_str()));
        let mut key = None;
        if let Some(set) = self.by_state.get_mut(&op.state) {
            key = set.take(&probe);
            if set.is_empty() {
                self.by_state.remove(&op.state);
            }
        }
        let key = key.unwrap_or(probe);
        let id = Arc::clone(&key.1);
        self.by_state.entry(to).or_default().insert(key);
        if to.is_terminal()
            && let Some(a) = &op.approval_id
            && let Some(set) = self.refs.get_mut(a)
        {
            set.remove(op.id.as_str());
            if set.is_empty() {
                self.refs.remove(a);
            }
        }
        id
    }

    pub fn set_deadline(&mut self, id: &str, at: Option<u64>) {
        let shared = match self.deadline_of.remove_entry(id) {
            Some((shared, old)) => {
                self.deadlines.remove(&(old, Arc::clone(&shared)));
                shared
            }
            None if at.is_some() => Arc::from(id),
            None => return,
        };
        if let Some(at) = at {
            self.deadline_of.insert(Arc::clone(&shared), at);
            self.deadlines.insert((at, shared));
        }
    }

    /// Files `a` among its client's active windows, or takes it out.
    pub fn set_window(&mut self, a: &Approval) {
        if a.mode == GrantMode::Window && a.status == ApprovalStatus::Active {
            self.windows
                .entry(a.client_id.clone())
                .or_default()
                .insert(a.id.clone());
        } else {
            self.remove_window(&a.client_id, &a.id);
        }
    }

    pub fn remove_window(&mut self, client: &str, id: &str) {
        if let Some(set) = self.windows.get_mut(client) {
            set.remove(id);
            if set.is_empty() {
                self.windows.remove(client);
            }
        }
    }

    /// The non-terminal operations naming approval `id`.
    pub fn referring(&self, id: &str) -> Vec<Id> {
        self.refs
            .get(id)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The earliest deadline.
    pub fn next_deadline(&self) -> Option<u64> {
        self.deadlines.first().map(|(at, _)| *at)
    }

    /// Ids of operations whose deadline is at or before `now`, earliest first.
    pub fn due(&self, now: u64) -> impl Iterator<Item = &str> {
        self.deadlines
            .iter()
            .take_while(move |(at, _)| *at <= now)
            .map(|(_, id)| &**id)
    }

    /// (created_at_ms, id) in list order (newest first) of the operations matching `client`
    /// and `states`, walking the smallest index that covers the filter: the caller stops at
    /// its limit.
    pub fn newest_first<'a>(
        &'a self,
        client: Option<&'a str>,
        states: &'a [OpState],
    ) -> Box<dyn Iterator<Item = (u64, &'a str)> + 'a> {
        Box::new(
            self.newest_keys(client, states)
                .map(|(at, id)| (*at, &**id)),
        )
    }

    fn newest_keys<'a>(
        &'a self,
        client: Option<&'a str>,
        states: &'a [OpState],
    ) -> Box<dyn Iterator<Item = &'a OrderKey> + 'a> {
        let empty: &'a BTreeSet<OrderKey> = empty_set();
        let per_client = client.map(|c| self.by_client.get(c).unwrap_or(empty));
        let mut distinct: Vec<OpState> = Vec::with_capacity(states.len());
        for s in states {
            if !distinct.contains(s) {
                distinct.push(*s);
            }
        }
        let per_state: Vec<&BTreeSet<OrderKey>> = distinct
            .iter()
            .filter_map(|s| self.by_state.get(s))
            .collect();
        let state_total: usize = per_state.iter().map(|s| s.len()).sum();
        match per_client {
            Some(set) if states.is_empty() || set.len() <= state_total => {
                Box::new(set.iter().rev())
            }
            _ if !states.is_empty() => Box::new(MergeNewest::new(per_state)),
            _ => Box::new(self.order.iter().rev()),
        }
    }
}

fn empty_set() -> &'static BTreeSet<OrderKey> {
    static EMPTY: BTreeSet<OrderKey> = BTreeSet::new();
    &EMPTY
}

/// Newest-first merge of disjoint ordered sets (one per state).
struct MergeNewest<'a> {
    heads:
        Vec<std::iter::Peekable<std::iter::Rev<std::collections::btree_set::Iter<'a, OrderKey>>>>,
}

impl<'a> MergeNewest<'a> {
    fn new(sets: Vec<&'a BTreeSet<OrderKey>>) -> Self {
        MergeNewest {
            heads: sets
                .into_iter()
                .map(|s| s.iter().rev().peekable())
                .collect(),
        }
    }
}

impl<'a> Iterator for MergeNewest<'a> {
    type Item = &'a OrderKey;
    fn next(&mut self) -> Option<&'a OrderKey> {
        let mut best: Option<(usize, &'a OrderKey)> = None;
        for (i, h) in self.heads.iter_mut().enumerate() {
            if let Some(&k) = h.peek()
                && best.is_none_or(|(_, b)| k > b)
            {
                best = Some((i, k));
            }
        }
        let (i, k) = best?;
        self.heads[i].next();
        Some(k)
    }
}
