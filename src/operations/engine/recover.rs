//! Recovery and time: startup recovery (drive what is approved, reconcile executions whose
//! process is gone, never re-run them), expiry of requests and approvals, and retention.

use std::sync::Arc;

use super::super::lifecycle::{OpState, codes};
use super::super::state::{
    ApprovalChange, ApprovalEffect, KIND_PRUNED, Operation, OperationState, Pruned, UseState,
};
use super::execute::Settle;
use super::*;

impl OperationRuntime {
    /// Startup recovery and the background loop: drives approved operations, reconciles
    /// executions whose process is gone, expires overdue requests, prunes old terminal ones.
    pub fn start(
        self: &Arc<Self>,
        live_executors: impl Fn() -> Vec<String> + Send + Sync + 'static,
    ) {
        if self.autorun.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            // Woken only by what can start a drive or bring a deadline nearer: a request
            // or an approval (not by executions starting and ending).
            let mut rx = me.ws.watch(|n| {
                &*n.method == NOTICE_CHANGED
                    && matches!(n.params.str_field("state"), Some("pending" | "approved"))
            });
            me.recover(&live_executors()).await;
            me.prune().await;
            let mut last_prune = std::time::Instant::now();
            let mut next = me.ws.read(|s| next_deadline(&s.operations));
            let timer = tokio::time::sleep(Duration::ZERO);
            tokio::pin!(timer);
            loop {
                let now = crate::util::now_ms();
                let sleep = next
                    .map(|d| Duration::from_millis(d.saturating_sub(now).max(5)))
                    .unwrap_or(Duration::from_secs(3600))
                    .min(Duration::from_secs(60));
                timer.as_mut().reset(tokio::time::Instant::now() + sleep);
                // Only a deadline nearer than the timer's resets it.
                loop {
                    tokio::select! {
                        n = rx.recv() => match n {
                            Some(n) => {
                                let approved = n
                                    .params
                                    .str_field("state")
                                    .filter(|s| *s == "approved")
                                    .and_then(|_| n.params.str_field("id"));
                                // One claimed in the commit that approved it is executing by
                                // now: only one still approved needs a drive (which would
                                // find the same and stop, having cost a task).
                                let (now_next, drive) = me.ws.read(|s| {
                                    let ops = &s.operations;
                                    let still = |id: &&str| {
                                        ops.get(id).is_some_and(|op| op.state == OpState::Approved)
                                    };
                                    (next_deadline(ops), approved.filter(still))
                                });
                                if let Some(id) = drive {
                                    me.spawn_drive(id.to_string());
                                }
                                let nearer = match (now_next, next) {
                                    (Some(a), Some(b)) => a < b,
                                    (a, b) => a.is_some() && b.is_none(),
                                };
                                if nearer {
                                    next = now_next;
                                    break;
                                }
                            }
                            None => return,
                        },
                        () = &mut timer => {
                            me.expire_due().await;
                            if last_prune.elapsed() > Duration::from_secs(3600) {
                                me.prune().await;
                                last_prune = std::time::Instant::now();
                            }
                            next = me.ws.read(|s| next_deadline(&s.operations));
                            break;
                        }
                    }
                }
            }
        });
    }

    /// One recovery pass. `live_executors` are the executor ids of processes still running.
    pub async fn recover(&self, live_executors: &[String]) {
        self.expire_due().await;
        let (approved, executing): (Vec<String>, Vec<(String, Option<String>)>) =
            self.ws.read(|s| {
                let ops = &s.operations;
                let in_state = |state: OpState| {
                    ops.index
                        .by_state
                        .get(&state)
                        .into_iter()
                        .flatten()
                        .filter_map(|(_, id)| ops.get(id))
                };
                let a = in_state(OpState::Approved)
                    .map(|op| op.id.clone())
                    .collect();
                let e = in_state(OpState::Executing)
                    .map(|op| (op.id.clone(), executor_of(op)))
                    .collect();
                (a, e)
            });
        for (id, exec) in executing {
            let alive = exec
                .as_ref()
                .is_some_and(|x| *x == self.executor || live_executors.contains(x));
            if alive {
                continue;
            }
            if let Err(e) = self.reconcile_interrupted(&id).await {
                tracing::error!(operation = %id, error = %e, "recovery failed");
            }
        }
        for id in approved {
            self.drive(&id).await;
        }
    }

    /// An execution whose process died: prove the outcome by reading back, never re-run.
    pub async fn reconcile_interrupted(&self, id: &str) -> Result<(), OpError> {
        let op = self.ws.read(|s| s.operations.get(id).cloned());
        let Some(op) = op else { return Ok(()) };
        if op.state != OpState::Executing {
            return Ok(());
        }
        let derived = self.rederive(&op, crate::util::now_ms(), false).await;
        let settle = match derived {
            Ok(super::execute::Rederived { plan, adapter, .. }) => {
                let ctx = self.ctx(&op.id, &op.client_id);
                let resolved = plan.resolved();
                let s = match adapter.reconcile(&ctx, &resolved).await {
                    Ok(o) if o.proven => {
                        let missing = self.ws.read(|s| {
                            s.operations.approval_of(&op).is_some_and(|a| {
                                !matches!(a.uses.get(&op.id), Some(UseState::Reserved | UseState::Committed))
                            })
                        });
                        if missing {
                            Settle::Failed {
                                code: codes::APPROVAL_RESERVATION_MISSING.into(),
                                message: "the approval shows no reservation for this execution".into(),
                                effect: ApprovalEffect::Retain,
                            }
                        } else {
                            Settle::Succeeded(o)
                        }
                    }
                    _ => Settle::Failed {
                        code: codes::UPSTREAM_UNKNOWN.into(),
                        message: "the execution was interrupted and its outcome could not be proven after restart".into(),
                        effect: ApprovalEffect::Retain,
                    },
                };
                adapter.cleanup(&ctx, &resolved).await;
                s
            }
            Err((code, message)) => Settle::Failed {
                code: code.into(),
                message,
                effect: ApprovalEffect::Retain,
            },
        };
        self.finish(&op.id, &op.operation, op.approval_id.clone(), settle)
            .await
    }

    /// Moves pending requests and unused approvals past their deadline to `expired`.
    pub async fn expire_due(&self) {
        let now = crate::util::now_ms();
        let sealer = self.sealer();
        let r = self
            .commit(move |s: &crate::workspace::State| {
                let ops = &s.operations;
                let mut recs = vec![];
                // The deadline index holds exactly the pending requests and approved
                // operations that can expire, by when (`operations::index::deadline`).
                for op in ops.index.due(now).filter_map(|id| ops.get(id)) {
                    let a = ops.approval_of(op);
                    let own = a
                        .filter(|a| a.operation_id == op.id)
                        .map(|a| ApprovalChange {
                            approval_id: a.id.clone(),
                            effect: ApprovalEffect::Expire,
                        });
                    let t = transition(op, OpState::Expired, now)
                        .error(
                            codes::APPROVAL_EXPIRED,
                            "the approval expired before the operation ran",
                        )
                        .approval(own);
                    recs.push(transition_rec(sealer.as_deref(), op, t)?);
                }
                Ok((recs, ()))
            })
            .await;
        if let Err(e) = r {
            tracing::error!(error = %commit_err(e), "expiry sweep failed");
        }
    }

    /// Records a prune of the operations that ended before the retention period, sealed at
    /// its seq: every fold on this machine skips a prune that is not (nothing is pruned
    /// without a seal key).
    pub async fn prune(&self) {
        let before = crate::util::now_ms().saturating_sub(self.config.retention_ms);
        let Some(sealer) = self.sealer() else {
            return;
        };
        let r = self
            .commit(move |s: &crate::workspace::State| {
                // Something it would forget (what the agent ended stays, and would otherwise
                // have a useless prune recorded at every start and every hour).
                let ops = &s.operations;
                let due = (ops.terminal.iter())
                    .take_while(|(t, _)| *t < before)
                    .filter_map(|(_, id)| ops.get(id))
                    .any(|op| !sealer.keeps(op, ops.approval_of(op)));
                if !due {
                    return Ok((vec![], ()));
                }
                let pruned = Pruned {
                    before_ms: before,
                    seal: Some(sealer.seal_prune(before, s.staging_seq)),
                };
                Ok((vec![rec(KIND_PRUNED, &pruned)?], ()))
            })
            .await;
        if let Err(e) = r {
            tracing::error!(error = %commit_err(e), "retention sweep failed");
        }
    }
}

fn next_deadline(s: &OperationState) -> Option<u64> {
    s.index.next_deadline()
}

fn executor_of(op: &Operation) -> Option<String> {
    op.executor.clone()
}
