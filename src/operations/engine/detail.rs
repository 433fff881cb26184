//! `approvals/get`'s detail: the plan re-derived from its text, then
//! [`crate::operations::detail`] renders it.

use super::super::detail::{ApprovalDetail, detail};
use super::*;

impl OperationRuntime {
    /// The detail of an approval whose operation's plan still verifies; `None` otherwise (the
    /// view's `plan_problem` says why).
    pub(super) async fn detail_of(&self, approval_id: &str) -> Option<ApprovalDetail> {
        let (a, op) = self.ws.read(|s| {
            let a = s.operations.approvals.get(approval_id)?.clone();
            let op = s.operations.get(&a.operation_id).cloned()?;
            Some((a, op))
        })?;
        let now = crate::util::now_ms();
        let d = self.rederive(&op, now, false).await.ok()?;
        Some(detail(self.ws.root(), &a, &d.plan, now))
    }
}
