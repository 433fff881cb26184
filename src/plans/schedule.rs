//! Which lanes start next, by mechanism: a pure function of the plan and each lane's run, as
//! the runner itself observed them.

use std::collections::HashMap;

use super::spec::LaunchSpec;
use super::state::LaneRun;
use crate::patterns::runtime::Mechanism;

/// Each lane's run and worker.
pub type LaneRuns = HashMap<String, (LaneRun, Option<String>)>;

/// Which waiting lanes start now (or become blocked), by mechanism: at most `max_parallel`
/// running at once; a lane with dependencies only after every one of them succeeded, and
/// blocked as soon as one did not.
pub fn schedule(mechanism: Mechanism, spec: &LaunchSpec, runs: &LaneRuns) -> Vec<(usize, LaneRun)> {
    let run_of = |id: &str| runs.get(id).map(|r| r.0).unwrap_or_default();
    let mut running = spec
        .lanes
        .iter()
        .filter(|l| run_of(&l.lane_id) == LaneRun::Running)
        .count();
    let cap = match mechanism {
        Mechanism::Direct | Mechanism::Continuation => 1,
        _ => spec.max_parallel.max(1) as usize,
    };
    let mut out = Vec::new();
    for (i, lane) in spec.lanes.iter().enumerate() {
        if run_of(&lane.lane_id) != LaneRun::Waiting {
            continue;
        }
        let deps: Vec<LaneRun> = lane.depends_on.iter().map(|d| run_of(d)).collect();
        if deps
            .iter()
            .any(|d| d.is_final() && *d != LaneRun::Succeeded)
        {
            out.push((i, LaneRun::Blocked));
            continue;
        }
        if deps.iter().any(|d| *d != LaneRun::Succeeded) || running >= cap {
            continue;
        }
        running += 1;
        out.push((i, LaneRun::Running));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plans::spec::LaneSpec;
    use serde_json::json;

    fn lane(id: &str, deps: &[&str]) -> LaneSpec {
        LaneSpec {
            lane_id: id.into(),
            role: "builder".into(),
            scope: vec![],
            profile: serde_json::from_value(
                json!({"selector": {"kind": "named", "value": "p"}, "command": ["true"]}),
            )
            .unwrap(),
            argv: vec!["true".into()],
            depends_on: deps.iter().map(|d| d.to_string()).collect(),
            prompt: String::new(),
            expectations: vec![],
        }
    }

    fn spec(lanes: Vec<LaneSpec>, max_parallel: u32) -> LaunchSpec {
        LaunchSpec {
            plan_id: "pl_t".into(),
            selection_digest: String::new(),
            objective: String::new(),
            pattern: String::new(),
            overlays: vec![],
            mechanism: String::new(),
            max_parallel,
            config_bundle: crate::bundles::BundleRef {
                id: "b".into(),
                digest: "d".into(),
            },
            declarations: vec![],
            secrets: vec![],
            lanes,
        }
    }

    fn runs(v: &[(&str, LaneRun)]) -> LaneRuns {
        v.iter()
            .map(|(id, r)| (id.to_string(), (*r, None)))
            .collect()
    }

    #[test]
    fn ephemeral_lanes_fill_free_slots_only() {
        let s = spec(vec![lane("a", &[]), lane("b", &[]), lane("c", &[])], 2);
        let r = runs(&[
            ("a", LaneRun::Running),
            ("b", LaneRun::Waiting),
            ("c", LaneRun::Waiting),
        ]);
        assert_eq!(
            schedule(Mechanism::EphemeralWorkers, &s, &r),
            vec![(1, LaneRun::Running)]
        );
        let r = runs(&[
            ("a", LaneRun::Running),
            ("b", LaneRun::Running),
            ("c", LaneRun::Waiting),
        ]);
        assert!(schedule(Mechanism::EphemeralWorkers, &s, &r).is_empty());
    }

    #[test]
    fn graph_tasks_wait_for_success_and_block_on_anything_else() {
        let s = spec(
            vec![lane("a", &[]), lane("b", &["a"]), lane("c", &["b"])],
            3,
        );
        let r = runs(&[
            ("a", LaneRun::Running),
            ("b", LaneRun::Waiting),
            ("c", LaneRun::Waiting),
        ]);
        assert!(schedule(Mechanism::TaskGraph, &s, &r).is_empty());
        let r = runs(&[
            ("a", LaneRun::Succeeded),
            ("b", LaneRun::Waiting),
            ("c", LaneRun::Waiting),
        ]);
        assert_eq!(
            schedule(Mechanism::TaskGraph, &s, &r),
            vec![(1, LaneRun::Running)]
        );
        for end in [LaneRun::Failed, LaneRun::Stopped, LaneRun::Blocked] {
            let r = runs(&[
                ("a", LaneRun::Succeeded),
                ("b", end),
                ("c", LaneRun::Waiting),
            ]);
            assert_eq!(
                schedule(Mechanism::TaskGraph, &s, &r),
                vec![(2, LaneRun::Blocked)]
            );
        }
    }

    #[test]
    fn a_continuation_runs_one_step_at_a_time() {
        let s = spec(vec![lane("a", &[]), lane("b", &["a"])], 1);
        let r = runs(&[("a", LaneRun::Waiting), ("b", LaneRun::Waiting)]);
        assert_eq!(
            schedule(Mechanism::Continuation, &s, &r),
            vec![(0, LaneRun::Running)]
        );
    }
}
