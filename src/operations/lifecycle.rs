//! The eight operation states and the only moves allowed between them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OpState {
    Pending,
    Approved,
    Executing,
    Succeeded,
    Failed,
    Denied,
    Expired,
    Canceled,
}

impl OpState {
    pub const ALL: [OpState; 8] = [
        OpState::Pending,
        OpState::Approved,
        OpState::Executing,
        OpState::Succeeded,
        OpState::Failed,
        OpState::Denied,
        OpState::Expired,
        OpState::Canceled,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            OpState::Succeeded
                | OpState::Failed
                | OpState::Denied
                | OpState::Expired
                | OpState::Canceled
        )
    }

    /// Whether `self -> to` is one of the permitted transitions.
    pub fn can_move_to(self, to: OpState) -> bool {
        use OpState::*;
        match self {
            Pending => matches!(to, Approved | Denied | Expired | Canceled | Failed),
            Approved => matches!(to, Executing | Expired | Canceled | Failed),
            Executing => matches!(to, Succeeded | Failed),
            Succeeded | Failed | Denied | Expired | Canceled => false,
        }
    }

    /// States a freshly created operation may start in: `pending` (approval path),
    /// `approved` (static allow) or directly terminal when refused at submit.
    pub fn valid_initial(self) -> bool {
        matches!(
            self,
            OpState::Pending | OpState::Approved | OpState::Denied | OpState::Failed
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OpState::Pending => "pending",
            OpState::Approved => "approved",
            OpState::Executing => "executing",
            OpState::Succeeded => "succeeded",
            OpState::Failed => "failed",
            OpState::Denied => "denied",
            OpState::Expired => "expired",
            OpState::Canceled => "canceled",
        }
    }

    pub fn parse(s: &str) -> Option<OpState> {
        OpState::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

impl std::fmt::Display for OpState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Stable machine codes carried in `error.code` of an operation or in RPC error data.
pub mod codes {
    pub const INVALID_REQUEST: &str = "invalid_request";
    pub const NOT_FOUND: &str = "not_found";
    pub const IDEMPOTENCY_CONFLICT: &str = "idempotency_conflict";
    pub const NOT_CANCELABLE: &str = "operation_not_cancelable";
    pub const STORE_UNAVAILABLE: &str = "operation_store_unavailable";
    pub const NOT_REGISTERED: &str = "operation_not_registered";
    pub const INPUT_INVALID: &str = "operation_input_invalid";
    pub const POLICY_DENIED: &str = "operation_policy_denied";
    pub const APPROVAL_REQUEST_FAILED: &str = "approval_request_failed";
    pub const PLAN_INVALID: &str = "operation_plan_invalid";
    pub const APPROVAL_DENIED: &str = "operation_approval_denied";
    pub const APPROVAL_EXPIRED: &str = "operation_approval_expired";
    pub const CANCELED: &str = "operation_canceled";
    pub const INVALID_STORED: &str = "invalid_stored_operation";
    pub const APPROVAL_INVALID: &str = "approval_invalid";
    pub const APPROVAL_UNAVAILABLE: &str = "approval_unavailable";
    pub const STORE_ROLLED_BACK: &str = "store_rolled_back";
    pub const APPROVAL_RESERVATION_MISSING: &str = "approval_reservation_missing";
    pub const UPSTREAM_UNKNOWN: &str = "upstream_result_unknown";
    pub const PRECONDITION_FAILED: &str = "operation_precondition_failed";
    pub const RECONCILIATION_FAILED: &str = "operation_reconciliation_failed";
    pub const REVISION_CONFLICT: &str = "revision_conflict";
    /// The plan is not the one the operator was shown (its digest changed).
    pub const PLAN_CHANGED: &str = "plan_changed";
    pub const CONSTRAINT_EXCEEDED: &str = "constraint_exceeded";
    /// An approval would grant more than the trusted policy grants for its plan.
    pub const EXCEEDS_POLICY: &str = "approval_exceeds_policy";
    pub const APPROVAL_NOT_PENDING: &str = "approval_not_pending";
    pub const AUTHENTICATION_FAILED: &str = "authentication_failed";
    pub const PROVIDER_UNAVAILABLE: &str = "provider_unavailable";
    pub const POLICY_CHANGING: &str = "policy_changing";
    /// A record without this machine's seal (see [`crate::operations::seal`]) was asked to
    /// stand for a client's request.
    pub const REQUEST_UNVERIFIED: &str = "request_unverified";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_table_matches_the_lifecycle() {
        use OpState::*;
        let allowed = [
            (Pending, Approved),
            (Pending, Denied),
            (Pending, Expired),
            (Pending, Canceled),
            (Pending, Failed),
            (Approved, Executing),
            (Approved, Expired),
            (Approved, Canceled),
            (Approved, Failed),
            (Executing, Succeeded),
            (Executing, Failed),
        ];
        for from in OpState::ALL {
            for to in OpState::ALL {
                assert_eq!(
                    from.can_move_to(to),
                    allowed.contains(&(from, to)),
                    "{from} -> {to}"
                );
            }
        }
    }

    #[test]
    fn terminal_states_are_exactly_five_and_names_round_trip() {
        let terminal: Vec<_> = OpState::ALL.iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(terminal.len(), 5);
        for s in OpState::ALL {
            assert_eq!(OpState::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        assert!(!OpState::Executing.valid_initial());
        assert!(!OpState::Succeeded.valid_initial());
    }
}
