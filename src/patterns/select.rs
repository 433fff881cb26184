//! The decision: explicit override notes, explicit rules, weighted scores with tie-breaks and
//! the close-score rule, and the twin-inspection overlay.

use std::borrow::Cow;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use super::policy::Policy;
use super::request::PatternRequest;
use super::signals::{Adjustments, Dimensions, TextSignals};
use super::vocab::{Dimension, Pattern};

const PREFIX_PATTERN: &str = "pattern:";
const PREFIX_REQUESTED_BY: &str = "pattern_override_requested_by:";
const PREFIX_REASON: &str = "pattern_override_reason:";

/// Structured directives found in the notes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directives {
    /// The raw (trimmed) value of the last `pattern:` note, if any.
    pub pattern: Option<String>,
    pub requested_by: String,
    pub reason: String,
}

/// Split notes into directives and the notes that join the keyword blob. A prefix only counts
/// at the very start of the note, so a leading space turns a directive into a plain note.
pub fn parse_directives(notes: &[String]) -> (Directives, Vec<&str>) {
    let mut directives = Directives::default();
    let mut blob_notes = Vec::with_capacity(notes.len());
    for note in notes {
        let value = |prefix: &str| -> Option<String> {
            let head = note.get(..prefix.len())?;
            head.eq_ignore_ascii_case(prefix)
                .then(|| note[prefix.len()..].trim().to_owned())
        };
        if let Some(v) = value(PREFIX_PATTERN) {
            directives.pattern = Some(v);
        } else if let Some(v) = value(PREFIX_REQUESTED_BY) {
            directives.requested_by = v;
        } else if let Some(v) = value(PREFIX_REASON) {
            directives.reason = v;
        } else {
            blob_notes.push(note.as_str());
        }
    }
    (directives, blob_notes)
}

/// Scores of the six base patterns, serialised in base order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scores(pub [i64; 6]);

impl Scores {
    pub fn compute(dims: &Dimensions, adj: &Adjustments, policy: &Policy) -> Scores {
        let mut out = [0i64; 6];
        for (slot, p) in out.iter_mut().zip(Pattern::BASE) {
            let weighted: i64 = Dimension::ALL
                .iter()
                .map(|&d| policy.weight(p, d) * dims.get(d))
                .sum();
            *slot = weighted + adj.get(p);
        }
        Scores(out)
    }

    pub fn get(&self, p: Pattern) -> i64 {
        Pattern::BASE
            .iter()
            .position(|&b| b == p)
            .map_or(0, |i| self.0[i])
    }

    /// Base patterns by score, highest first; ties by wire spelling in code-point order.
    pub fn ranking(&self) -> [(Pattern, i64); 6] {
        let mut ranked: [(Pattern, i64); 6] =
            std::array::from_fn(|i| (Pattern::BASE[i], self.0[i]));
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.as_str().cmp(b.0.as_str())));
        ranked
    }
}

impl Serialize for Scores {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(6))?;
        for (p, v) in Pattern::BASE.iter().zip(self.0) {
            map.serialize_entry(p.as_str(), &v)?;
        }
        map.end()
    }
}

/// How the pattern was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SelectionSource {
    PolicyScoring,
    PolicyFallback,
    PolicyScoringCloseScorePreferSimpler,
    ValidatedExplicitStructuredOverride,
}

impl SelectionSource {
    /// The wire spelling (as serde writes it).
    pub const fn as_str(self) -> &'static str {
        match self {
            SelectionSource::PolicyScoring => "policy_scoring",
            SelectionSource::PolicyFallback => "policy_fallback",
            SelectionSource::PolicyScoringCloseScorePreferSimpler => {
                "policy_scoring_close_score_prefer_simpler"
            }
            SelectionSource::ValidatedExplicitStructuredOverride => {
                "validated_explicit_structured_override"
            }
        }
    }
}

/// The `selection` object of a plan.
#[derive(Debug, Clone, Serialize)]
pub struct Selection {
    pub selected_pattern: Pattern,
    pub overlays: Vec<Pattern>,
    pub reason: Cow<'static, str>,
    pub dimensions: Dimensions,
    pub matched_signals: Vec<String>,
    pub scores: Scores,
    pub score_adjustments: Adjustments,
    pub selection_source: SelectionSource,
    pub selector_version: String,
    #[serde(rename = "override")]
    pub override_pattern: String,
    pub override_requested_by: String,
    pub override_reason: String,
    pub invalid_override_reason: String,
}

/// Decide the pattern for an analysed request.
pub fn decide(
    req: &PatternRequest,
    directives: &Directives,
    text: &TextSignals,
    dims: Dimensions,
    policy: &Policy,
) -> Selection {
    let adjustments = text.adjustments(policy);
    let scores = Scores::compute(&dims, &adjustments, policy);

    let mut invalid_override_reason = String::new();
    let valid_override = match directives.pattern.as_deref() {
        None | Some("") => None,
        Some(raw) => {
            let normalized = raw.trim().to_lowercase();
            let parsed = Pattern::parse_override(&normalized);
            if parsed.is_none() {
                invalid_override_reason = format!(
                    "Ignored the override {raw:?}: it is not one of the known worker patterns."
                );
            }
            parsed
        }
    };

    let (selected, source) = if let Some(p) = valid_override {
        (p, SelectionSource::ValidatedExplicitStructuredOverride)
    } else if req.recovery && req.risk() == "critical" {
        (Pattern::BridgeLane, SelectionSource::PolicyScoring)
    } else if req.recovery {
        (Pattern::RecoveryLane, SelectionSource::PolicyScoring)
    } else if dims.get(Dimension::Uncertainty) >= 3 {
        (Pattern::BlueprintFanout, SelectionSource::PolicyScoring)
    } else {
        by_score(&scores, policy)
    };

    let reason = match valid_override {
        Some(p) => Cow::Owned(format!(
            "An explicit, validated override note selected {}.",
            p.as_str()
        )),
        None => Cow::Borrowed(reason_for(selected)),
    };
    let overlays = if req.review_required && selected != Pattern::TwinInspection {
        vec![Pattern::TwinInspection]
    } else {
        Vec::new()
    };

    Selection {
        selected_pattern: selected,
        overlays,
        reason,
        dimensions: dims,
        matched_signals: text.matched.clone(),
        scores,
        score_adjustments: adjustments,
        selection_source: source,
        selector_version: policy.selector_version.clone(),
        override_pattern: valid_override
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default(),
        override_requested_by: directives.requested_by.clone(),
        override_reason: directives.reason.clone(),
        invalid_override_reason,
    }
}

fn by_score(scores: &Scores, policy: &Policy) -> (Pattern, SelectionSource) {
    let ranked = scores.ranking();
    let (best, best_score) = ranked[0];
    let (runner_up, runner_score) = ranked[1];
    let source = if best_score > 0 {
        SelectionSource::PolicyScoring
    } else {
        SelectionSource::PolicyFallback
    };
    let close = policy.close_score_patterns.contains(&best)
        && policy.close_score_patterns.contains(&runner_up)
        && (0..=policy.close_score_margin).contains(&(best_score - runner_score));
    if close {
        let rank = |p: Pattern| policy.simpler_pattern_order.iter().position(|&q| q == p);
        let simpler = if rank(runner_up) < rank(best) {
            runner_up
        } else {
            best
        };
        if simpler != best {
            return (
                simpler,
                SelectionSource::PolicyScoringCloseScorePreferSimpler,
            );
        }
    }
    (best, source)
}

fn reason_for(p: Pattern) -> &'static str {
    match p {
        Pattern::BridgeLane => {
            "Critical recovery or a landing on the canonical line calls for one tightly controlled bridge lane."
        }
        Pattern::RecoveryLane => {
            "Failed, blocked or stale work is best repaired in one narrow recovery lane."
        }
        Pattern::BlueprintFanout => {
            "The task asks for variants, alternatives or curation, so designs are explored side by side and then curated."
        }
        Pattern::PhasedAssembly => {
            "The depth of the dependencies points to ordered waves that unlock one another."
        }
        Pattern::ModuleSwarm => {
            "Several scopes or separable modules can be built in parallel lanes."
        }
        Pattern::Sequential | Pattern::TwinInspection => {
            "One bounded workpiece gains little from parallel lanes, so it is built in a single lane."
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_are_case_insensitive_and_need_the_prefix_at_the_start() {
        let notes: Vec<String> = [
            "Pattern:  Module-Swarm  ",
            " pattern:sequential",
            "pattern_override_reason: why",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        let (d, blob) = parse_directives(&notes);
        assert_eq!(d.pattern.as_deref(), Some("Module-Swarm"));
        assert_eq!(d.reason, "why");
        assert_eq!(blob, vec![" pattern:sequential"]);
    }

    #[test]
    fn ties_break_by_code_point_order() {
        let s = Scores([4, 0, 0, 0, 4, 4]);
        assert_eq!(s.ranking()[0].0, Pattern::BridgeLane);
    }

    #[test]
    fn close_scores_prefer_the_simpler_pattern() {
        let p = Policy::builtin();
        // module-swarm 10, phased-assembly 9: phased is simpler and within the margin.
        let s = Scores([0, 10, 9, 0, 0, 0]);
        assert_eq!(
            by_score(&s, &p),
            (
                Pattern::PhasedAssembly,
                SelectionSource::PolicyScoringCloseScorePreferSimpler
            )
        );
        // bridge_lane as runner-up is outside the simple set: no change.
        let s = Scores([10, 0, 0, 0, 0, 9]);
        assert_eq!(
            by_score(&s, &p),
            (Pattern::Sequential, SelectionSource::PolicyScoring)
        );
        // Everything at or below zero falls back.
        let s = Scores([0, -1, -1, -1, -1, -1]);
        assert_eq!(by_score(&s, &p).1, SelectionSource::PolicyFallback);
    }
}
