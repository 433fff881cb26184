//! Decisions taken against the current state before anything is written (they run inside the
//! workspace's commit, so they see every other process's records).

use super::request::CreateRequest;
use super::state::WorkerState;
use super::types::{Worker, WorkerStatus};
use crate::bundles::{BundleError, BundleState, FieldError, ProfileSelector};

/// Why a worker request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkerError {
    #[error("invalid request: {0}")]
    Invalid(#[from] FieldError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("profile {profile} is not part of bundle {bundle_id}")]
    ProfileNotInBundle {
        profile: ProfileSelector,
        bundle_id: String,
    },
    #[error("idempotency key {key} was already used for a different request (worker {worker_id})")]
    IdempotencyConflict { key: String, worker_id: String },
    #[error("no execution backend can run profile {profile}: {message}")]
    BackendUnavailable {
        profile: ProfileSelector,
        message: String,
    },
    #[error("worker {worker_id} could not be started: {diagnostic}")]
    SpawnFailed {
        worker_id: String,
        diagnostic: String,
    },
    #[error("worker {worker_id} not found")]
    NotFound { worker_id: String },
    #[error("worker {worker_id} does not take input ({why})")]
    NotInputCapable { worker_id: String, why: String },
    #[error("store error: {0}")]
    Store(String),
}

/// What a create amounts to against the current state.
#[derive(Clone, Debug)]
pub enum CreateCheck {
    /// The same idempotency key and request were seen before: answer with that worker.
    Replay(Box<Worker>),
    /// Go ahead: the bundle is synced and holds the profile.
    Fresh,
}

/// Checks idempotency, bundle identity and profile containment.
pub fn check_create(
    workers: &WorkerState,
    bundles: &BundleState,
    req: &CreateRequest,
    fingerprint: &str,
) -> Result<CreateCheck, WorkerError> {
    if let Some(key) = &req.idempotency_key
        && let Some(existing) = workers.by_idempotency_key(req.created_by.as_deref(), key)
    {
        // A replay answers with the worker only when it is this caller's and its own record
        // holds this request: the fingerprint is worked out again from what the record says
        // (profile, bundle, initial input, name), never taken from its `request_fingerprint`,
        // which the agent could write to squat another client's key with its own input.
        let stored = CreateRequest {
            profile: existing.profile.clone(),
            config_bundle: existing.config_bundle.clone(),
            initial_input: workers.initial_input(&existing.id),
            display_name: existing.display_name.clone(),
            idempotency_key: None,
            created_by: None,
        }
        .fingerprint();
        if stored == fingerprint && existing.created_by == req.created_by {
            return Ok(CreateCheck::Replay(Box::new(existing.clone())));
        }
        return Err(WorkerError::IdempotencyConflict {
            key: key.clone(),
            worker_id: existing.id.clone(),
        });
    }
    let synced = bundles.check(&req.config_bundle)?;
    if !synced.summary.profiles.contains(&req.profile) {
        return Err(WorkerError::ProfileNotInBundle {
            profile: req.profile.clone(),
            bundle_id: req.config_bundle.id.clone(),
        });
    }
    Ok(CreateCheck::Fresh)
}

/// The worker, if it exists and takes input right now.
pub fn check_input<'a>(
    workers: &'a WorkerState,
    worker_id: &str,
) -> Result<&'a Worker, WorkerError> {
    let w = workers
        .get(worker_id)
        .ok_or_else(|| WorkerError::NotFound {
            worker_id: worker_id.to_string(),
        })?;
    if w.status != WorkerStatus::Running {
        return Err(WorkerError::NotInputCapable {
            worker_id: worker_id.to_string(),
            why: match w.status {
                WorkerStatus::PendingApproval => format!(
                    "it is pending approval of its start operation {}",
                    w.operation_id.as_deref().unwrap_or("(not yet submitted)")
                ),
                WorkerStatus::Failed => "it is failed".to_string(),
                _ => "it is stopped".to_string(),
            },
        });
    }
    if !w.input_capable {
        return Err(WorkerError::NotInputCapable {
            worker_id: worker_id.to_string(),
            why: "its profile takes input only at creation".to_string(),
        });
    }
    if w.stop_requested {
        return Err(WorkerError::NotInputCapable {
            worker_id: worker_id.to_string(),
            why: "a stop was requested".to_string(),
        });
    }
    Ok(w)
}
