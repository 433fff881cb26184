//! How much one operator approval of a plan may grant: what the currently trusted policy has a
//! fresh request for that plan ask for. Preparing a decision, recording one and using a window
//! for another plan all bound the signed scope by it. A stored request (an approval record's
//! mode and requested limits, a plan's `authorization`) is never evidence of it: the agent can
//! write both.

use super::decision::DecisionPayload;
use super::policy::{Decision, DecisionEffect, GrantMode, GrantPolicy};

/// Most uses a window approval may carry.
pub const MAX_GRANT_USES: u32 = 25;

/// The widest approval the policy lets an operator sign for one plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantBound {
    pub mode: GrantMode,
    pub duration_seconds: u64,
    pub max_uses: u32,
}

/// What an approval grants, as signed or about to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope {
    pub mode: GrantMode,
    pub duration_ms: u64,
    pub max_uses: u32,
}

impl Scope {
    /// What a signed decision grants.
    pub fn signed(p: &DecisionPayload) -> Scope {
        Scope {
            mode: p.mode,
            duration_ms: p.expires_at_ms.unwrap_or(0).saturating_sub(p.decided_at_ms),
            max_uses: p.max_uses,
        }
    }
}

/// Whether a window of scope `s` may cover a further plan the policy decided `d` on (without
/// grants): always when the policy alone allows the plan, else only within what it grants one
/// approval of the plan. A policy narrowed since the window was signed narrows what it covers.
pub fn window_covers(
    d: &Decision,
    requires_approval: bool,
    approval_ttl_seconds: u64,
    s: Scope,
) -> Result<(), String> {
    if d.effect == DecisionEffect::Allow && !requires_approval {
        return Ok(());
    }
    let bound = GrantBound::of_decision(d, approval_ttl_seconds).map_err(|e| e.to_string())?;
    let excess = bound.excess(s);
    if excess.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "it grants more than the trusted policy grants one approval of this plan now ({})",
            excess.join(", ")
        ))
    }
}

/// Why the policy lets no approval of a plan be signed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoGrant {
    #[error("a deny rule of the trusted policy covers this plan ({0})")]
    Denied(String),
    #[error("{0}")]
    BadRule(&'static str),
}

impl GrantBound {
    /// What a request under `gp` asks for: the rule's default duration (at most the
    /// operation's approval ttl) and uses, once the rule's own limits are checked.
    pub fn of_rule(gp: &GrantPolicy, approval_ttl_seconds: u64) -> Result<GrantBound, NoGrant> {
        if gp.default_minutes > gp.max_minutes {
            return Err(NoGrant::BadRule(
                "the request rule's default duration exceeds its maximum",
            ));
        }
        match gp.mode {
            GrantMode::Execution if gp.default_max_uses != 1 || gp.max_uses != Some(1) => {
                return Err(NoGrant::BadRule(
                    "an execution approval authorises exactly one use",
                ));
            }
            GrantMode::Window
                if gp.max_uses.is_some_and(|m| gp.default_max_uses > m)
                    || gp.default_max_uses > MAX_GRANT_USES =>
            {
                return Err(NoGrant::BadRule(
                    "the request rule's default uses exceed its limit",
                ));
            }
            _ => {}
        }
        Ok(GrantBound {
            mode: gp.mode,
            duration_seconds: (u64::from(gp.default_minutes) * 60).min(approval_ttl_seconds),
            max_uses: gp.default_max_uses,
        })
    }

    /// The bound for a plan the policy decided `d` on, without active grants (as
    /// `operations/submit` decides, catalog-required approval included). A request rule brings
    /// its own limits; a plan the policy allows or does not cover may still be approved by the
    /// operator, once, with the limits of a workspace without a policy.
    pub fn of_decision(d: &Decision, approval_ttl_seconds: u64) -> Result<GrantBound, NoGrant> {
        let gp = match d.effect {
            DecisionEffect::Deny => return Err(NoGrant::Denied(d.rule_ids.join(", "))),
            DecisionEffect::Request => d
                .grant_policy
                .clone()
                .unwrap_or_else(GrantPolicy::default_for_missing_policy),
            DecisionEffect::Allow | DecisionEffect::NoMatch => {
                GrantPolicy::default_for_missing_policy()
            }
        };
        GrantBound::of_rule(&gp, approval_ttl_seconds)
    }

    /// Each way `s` reaches past this bound, in words naming the field (empty: within it).
    pub fn excess(&self, s: Scope) -> Vec<String> {
        let mut out = vec![];
        if s.mode == GrantMode::Window && self.mode == GrantMode::Execution {
            out.push(
                "mode window (the policy grants one execution of exactly this plan)".to_string(),
            );
        }
        if s.max_uses > self.max_uses {
            out.push(format!(
                "max_uses {} (the policy grants at most {})",
                s.max_uses, self.max_uses
            ));
        }
        if s.duration_ms > self.duration_seconds.saturating_mul(1000) {
            out.push(format!(
                "duration {} s (the policy grants at most {} s)",
                s.duration_ms.div_ceil(1000),
                self.duration_seconds
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(mode: GrantMode, default_max_uses: u32, max_uses: Option<u32>) -> GrantPolicy {
        GrantPolicy {
            mode,
            default_minutes: 5,
            max_minutes: 60,
            request_ttl_minutes: 10,
            default_max_uses,
            max_uses,
        }
    }

    fn decided(effect: DecisionEffect, gp: Option<GrantPolicy>) -> Decision {
        Decision {
            effect,
            reason: String::new(),
            rule_ids: vec!["r".into()],
            grant_id: None,
            grant_policy: gp,
        }
    }

    #[test]
    fn the_bound_is_what_a_fresh_request_asks_for() {
        let window = rule(GrantMode::Window, 2, Some(3));
        let b = GrantBound::of_decision(&decided(DecisionEffect::Request, Some(window)), 600);
        let want = GrantBound {
            mode: GrantMode::Window,
            duration_seconds: 300,
            max_uses: 2,
        };
        assert_eq!(b, Ok(want));
        // The operation's approval ttl caps the rule's duration.
        let short = GrantBound::of_rule(&rule(GrantMode::Window, 2, Some(3)), 60).unwrap();
        assert_eq!(short.duration_seconds, 60);
        // Allowed, uncovered or unruled plans get one execution for 10 minutes at most.
        let one = GrantBound {
            mode: GrantMode::Execution,
            duration_seconds: 600,
            max_uses: 1,
        };
        for effect in [DecisionEffect::Allow, DecisionEffect::NoMatch] {
            assert_eq!(
                GrantBound::of_decision(&decided(effect, None), 3600),
                Ok(one)
            );
        }
        assert_eq!(
            GrantBound::of_decision(&decided(DecisionEffect::Request, None), 3600),
            Ok(one)
        );
        assert_eq!(
            GrantBound::of_decision(&decided(DecisionEffect::Deny, None), 600),
            Err(NoGrant::Denied("r".into()))
        );
        let bad = rule(GrantMode::Execution, 2, Some(2));
        assert!(matches!(
            GrantBound::of_rule(&bad, 600),
            Err(NoGrant::BadRule(_))
        ));
        let too_many = rule(GrantMode::Window, MAX_GRANT_USES + 1, None);
        assert!(GrantBound::of_rule(&too_many, 600).is_err());
    }

    #[test]
    fn excess_names_each_field_past_the_bound_and_nothing_within_it() {
        let b = GrantBound {
            mode: GrantMode::Execution,
            duration_seconds: 300,
            max_uses: 1,
        };
        let within = Scope {
            mode: GrantMode::Execution,
            duration_ms: 300_000,
            max_uses: 1,
        };
        assert!(b.excess(within).is_empty());
        let forged = Scope {
            mode: GrantMode::Window,
            duration_ms: 86_400_000,
            max_uses: 50,
        };
        let e = b.excess(forged).join("; ");
        for field in ["mode window", "max_uses 50", "duration 86400 s"] {
            assert!(e.contains(field), "{e}");
        }
        assert_eq!(
            b.excess(Scope {
                duration_ms: 300_001,
                ..within
            })
            .len(),
            1
        );
        // A window bound covers an execution.
        let w = GrantBound {
            mode: GrantMode::Window,
            ..b
        };
        assert!(w.excess(within).is_empty());
    }
}
