//! Proof expectations (what evidence finishes the work) and safety notes (what the runtime must
//! preserve). Only the number and order of lines is part of the reference contract; the
//! wording is gaffer's.

use std::borrow::Cow;

use super::policy::Policy;
use super::request::PatternRequest;
use super::signals::TextSignals;
use super::vocab::Pattern;

fn pattern_proof(p: Pattern) -> &'static [&'static str] {
    match p {
        Pattern::Sequential => &[
            "The summary states exactly what changed.",
            "Focused checks were run for any code that changed.",
        ],
        Pattern::ModuleSwarm => &[
            "Each lane owned a scope that no other lane edited.",
            "An integration pass checked the lane outputs for conflicts.",
            "Focused tests ran after the lanes were merged.",
        ],
        Pattern::BlueprintFanout => &[
            "The variants are compared side by side, on the same criteria.",
            "The curator names the chosen approach and the trade-offs that ruled out the others.",
        ],
        Pattern::PhasedAssembly => &[
            "Every wave lists the dependencies it unlocks.",
            "No downstream wave started before its prerequisites had passed.",
        ],
        Pattern::RecoveryLane => &[
            "The original failure is stated.",
            "The repair is shown to be narrow.",
            "The scope did not grow beyond the repair.",
        ],
        Pattern::BridgeLane => &[
            "The critical risk is stated before any change.",
            "The landing on the canonical line is as small as possible.",
            "Irreversible steps waited for a human or an explicit final acceptance.",
        ],
        Pattern::TwinInspection => &[
            "Someone independent of the builder reviewed or tested the evidence.",
            "The final answer carries the review verdict.",
        ],
    }
}

const TESTS_PROOF: &str =
    "The test command and its output are attached, or the reason tests were not run is given.";

fn push_unique(list: &mut Vec<Cow<'static, str>>, line: Cow<'static, str>) {
    if !list.contains(&line) {
        list.push(line);
    }
}

/// The pattern's lines, then each overlay's, then tests and scopes lines; de-duplicated.
pub fn proof_expectations(
    req: &PatternRequest,
    pattern: Pattern,
    overlays: &[Pattern],
) -> Vec<Cow<'static, str>> {
    let mut out = Vec::with_capacity(8);
    for p in std::iter::once(pattern).chain(overlays.iter().copied()) {
        for line in pattern_proof(p) {
            push_unique(&mut out, Cow::Borrowed(*line));
        }
    }
    if req.tests_required {
        push_unique(&mut out, Cow::Borrowed(TESTS_PROOF));
    }
    if !req.scopes.is_empty() {
        push_unique(
            &mut out,
            Cow::Owned(format!(
                "The summary names the scopes touched: {}.",
                req.scopes.join(", ")
            )),
        );
    }
    out
}

/// Safety notes 1-4 (roster notes are appended later by the roster mapping).
pub fn safety_notes(
    req: &PatternRequest,
    text: &TextSignals,
    policy: &Policy,
) -> Vec<Cow<'static, str>> {
    let s = &policy.signals;
    let risk = req.risk();
    let mut out = vec![
        "This is a plan, not a permission: the runtime owns execution, and the selector only picked and shaped the pattern."
            .into(),
    ];
    if text.any(&s.browser) {
        out.push(
            "Browser work belongs to a browser-capable tool in a later, explicitly approved step; the selector never drives a browser or handles credentials."
                .into(),
        );
    }
    if text.any(&s.safety_sensitive) || risk == "high" || risk == "critical" {
        out.push("Sensitive work: require an explicit review and inspect the dry run before anything executes.".into());
    }
    if text.any(&s.packaging) {
        out.push(
            "Packaging and release stay at the planning stage; publishing or pushing to a remote needs explicit human approval."
                .into(),
        );
    }
    out
}
