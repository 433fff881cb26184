//! What the request text says: the keyword blob, keyword hits, matched signals and the six
//! selection dimensions.
//!
//! Every keyword test is a plain substring test on the lower-cased blob (no word boundaries,
//! matches may span fields), exactly like the reference: "latest" contains "test".

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use super::policy::{PhraseHits, Phrases, Policy};
use super::request::PatternRequest;
use super::vocab::{Dimension, Pattern};

/// The analysed text of a request.
#[derive(Debug, Clone)]
pub struct TextSignals {
    /// objective, scopes, dependencies and non-directive notes, lower-cased, space-joined.
    pub blob: String,
    /// Number of distinct keywords of each pattern found in the blob, by [`Pattern::index`].
    pub hits: [usize; 7],
    /// Every keyword found, de-duplicated and sorted by code point.
    pub matched: Vec<String>,
    /// Which policy phrases occur in the blob.
    pub phrases: PhraseHits,
}

impl TextSignals {
    pub fn analyze(req: &PatternRequest, blob_notes: &[&str], policy: &Policy) -> TextSignals {
        let blob = build_blob(req, blob_notes);
        let phrases = policy.phrase_index.scan(&blob);
        let mut hits = [0usize; 7];
        let mut matched: Vec<String> = Vec::new();
        for p in Pattern::ALL {
            for kw in policy.keywords(p).found(&phrases) {
                hits[p.index()] += 1;
                matched.push(kw.clone());
            }
        }
        matched.sort_unstable();
        matched.dedup();
        TextSignals {
            blob,
            hits,
            matched,
            phrases,
        }
    }

    pub fn hit(&self, p: Pattern) -> bool {
        self.hits[p.index()] > 0
    }

    /// True when the blob contains any of `phrases`.
    pub fn any(&self, phrases: &Phrases) -> bool {
        phrases.any(&self.phrases)
    }

    /// Keyword bonus per pattern (`min(hits, cap)`), for the patterns with at least one hit.
    pub fn adjustments(&self, policy: &Policy) -> Adjustments {
        let mut values = [None; 7];
        for p in Pattern::ALL {
            if self.hits[p.index()] > 0 {
                values[p.index()] = Some((self.hits[p.index()] as i64).min(policy.adjustment_cap));
            }
        }
        Adjustments(values)
    }
}

fn build_blob(req: &PatternRequest, blob_notes: &[&str]) -> String {
    let mut raw = String::with_capacity(
        req.objective.len()
            + req.scopes.iter().map(|s| s.len() + 1).sum::<usize>()
            + req.dependencies.iter().map(|s| s.len() + 1).sum::<usize>()
            + blob_notes.iter().map(|s| s.len() + 1).sum::<usize>()
            + 3,
    );
    raw.push_str(&req.objective);
    // Each part contributes its separator even when empty, as in the reference.
    for part in [&req.scopes[..], &req.dependencies[..]] {
        raw.push(' ');
        push_joined(&mut raw, part.iter().map(String::as_str));
    }
    raw.push(' ');
    push_joined(&mut raw, blob_notes.iter().copied());
    if raw.is_ascii() {
        raw.make_ascii_lowercase();
        raw
    } else {
        raw.to_lowercase()
    }
}

fn push_joined<'a>(out: &mut String, items: impl Iterator<Item = &'a str>) {
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(item);
    }
}

/// Keyword adjustments; serialised as a map of the patterns that had hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adjustments(pub [Option<i64>; 7]);

impl Adjustments {
    pub fn get(&self, p: Pattern) -> i64 {
        self.0[p.index()].unwrap_or(0)
    }
}

impl Serialize for Adjustments {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let count = self.0.iter().filter(|v| v.is_some()).count();
        let mut map = s.serialize_map(Some(count))?;
        // Keyword-list order, as the reference emits it.
        for p in KEYWORD_ORDER {
            if let Some(v) = self.0[p.index()] {
                map.serialize_entry(p.as_str(), &v)?;
            }
        }
        map.end()
    }
}

/// The order of the keyword lists, in which adjustments are written.
pub const KEYWORD_ORDER: [Pattern; 7] = [
    Pattern::BlueprintFanout,
    Pattern::PhasedAssembly,
    Pattern::ModuleSwarm,
    Pattern::RecoveryLane,
    Pattern::BridgeLane,
    Pattern::TwinInspection,
    Pattern::Sequential,
];

/// The six dimensions, each 0..=3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dimensions(pub [i64; 6]);

impl Dimensions {
    pub fn get(&self, d: Dimension) -> i64 {
        self.0[d.index()]
    }

    fn set(&mut self, d: Dimension, v: i64) {
        self.0[d.index()] = v;
    }

    /// Apply the ordered rules; a later rule may overwrite an earlier one.
    pub fn compute(req: &PatternRequest, text: &TextSignals, policy: &Policy) -> Dimensions {
        use Dimension::*;
        let mut d = Dimensions::default();
        let risk = req.risk();
        d.set(Singularity, 1);
        d.set(Verification, if req.review_required { 1 } else { 0 });

        if req.variants_requested > 1 || text.hit(Pattern::BlueprintFanout) {
            d.set(Uncertainty, 3);
        }
        if !req.dependencies.is_empty() || text.hit(Pattern::PhasedAssembly) {
            let depth = if req.dependencies.is_empty() {
                3
            } else {
                (req.dependencies.len() as i64).clamp(1, 3)
            };
            d.set(DependencyDepth, depth);
        }
        if req.scopes.len() > 1 || text.hit(Pattern::ModuleSwarm) {
            d.set(Separability, 3);
            d.set(Singularity, 0);
        }
        if req.review_required || req.tests_required || text.hit(Pattern::TwinInspection) {
            d.set(Verification, 3);
        }
        let s = &policy.signals;
        if !text.any(&s.merge_conflict_negation) && text.any(&s.merge_conflict) {
            d.set(MergeRisk, 3);
        } else if d.get(Separability) >= 2 && !text.any(&s.separability_disjoint) {
            d.set(MergeRisk, 1);
        }
        if req.recovery || text.hit(Pattern::RecoveryLane) {
            d.set(Singularity, 3);
            d.set(Separability, d.get(Separability).min(1));
            d.set(MergeRisk, d.get(MergeRisk).max(2));
        }
        if risk == "high" || risk == "critical" || text.hit(Pattern::BridgeLane) {
            let high = risk == "high";
            d.set(
                Verification,
                d.get(Verification).max(if high { 2 } else { 3 }),
            );
            d.set(MergeRisk, d.get(MergeRisk).max(if high { 1 } else { 2 }));
        }
        d
    }
}

impl Serialize for Dimensions {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(6))?;
        for d in Dimension::ALL {
            map.serialize_entry(d.as_str(), &self.0[d.index()])?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn analyze(req: &PatternRequest) -> TextSignals {
        let notes: Vec<&str> = req.notes.iter().map(String::as_str).collect();
        TextSignals::analyze(req, &notes, &Policy::builtin())
    }

    #[test]
    fn blob_joins_parts_with_separators_even_when_empty() {
        let mut req = PatternRequest::new("Fix It");
        req.notes = vec!["Note".into()];
        assert_eq!(analyze(&req).blob, "fix it   note");
    }

    #[test]
    fn substring_matching_crosses_words_and_fields() {
        let mut req = PatternRequest::new("the latest decode");
        req.scopes = vec!["module-01".into()];
        let t = analyze(&req);
        assert!(t.matched.contains(&"test".to_owned()));
        assert!(t.matched.contains(&"module".to_owned()));
        assert!(t.hit(Pattern::ModuleSwarm));
    }

    #[test]
    fn adjustments_cap_at_two_and_count_alternative_twice() {
        let req = PatternRequest::new("compare alternatives");
        let t = analyze(&req);
        assert_eq!(t.hits[Pattern::BlueprintFanout.index()], 3);
        assert_eq!(
            t.adjustments(&Policy::builtin())
                .get(Pattern::BlueprintFanout),
            2
        );
    }

    #[test]
    fn one_dependency_gives_depth_one_even_with_phase_words() {
        let mut req = PatternRequest::new("ordered phase rollout");
        req.dependencies = vec!["db".into()];
        let p = Policy::builtin();
        let d = Dimensions::compute(&req, &analyze(&req), &p);
        assert_eq!(d.get(Dimension::DependencyDepth), 1);
    }
}
