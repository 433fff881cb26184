//! The closed vocabularies: patterns, dimensions and lane roles, with their wire spellings.

use serde::{Serialize, Serializer};

/// The seven worker patterns. `TwinInspection` is normally an overlay; it is a base only when an
/// explicit override names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pattern {
    Sequential,
    ModuleSwarm,
    PhasedAssembly,
    BlueprintFanout,
    RecoveryLane,
    BridgeLane,
    TwinInspection,
}

impl Pattern {
    /// The six base patterns in the order scores are listed.
    pub const BASE: [Pattern; 6] = [
        Pattern::Sequential,
        Pattern::ModuleSwarm,
        Pattern::PhasedAssembly,
        Pattern::BlueprintFanout,
        Pattern::RecoveryLane,
        Pattern::BridgeLane,
    ];

    pub const ALL: [Pattern; 7] = [
        Pattern::Sequential,
        Pattern::ModuleSwarm,
        Pattern::PhasedAssembly,
        Pattern::BlueprintFanout,
        Pattern::RecoveryLane,
        Pattern::BridgeLane,
        Pattern::TwinInspection,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Pattern::Sequential => "sequential",
            Pattern::ModuleSwarm => "module-swarm",
            Pattern::PhasedAssembly => "phased-assembly",
            Pattern::BlueprintFanout => "blueprint-fanout",
            Pattern::RecoveryLane => "recovery-lane",
            // The reference spells this one with an underscore; kept for compatibility.
            Pattern::BridgeLane => "bridge_lane",
            Pattern::TwinInspection => "twin-inspection",
        }
    }

    /// Exact wire spelling only.
    pub fn parse(value: &str) -> Option<Pattern> {
        Pattern::ALL.into_iter().find(|p| p.as_str() == value)
    }

    /// Wire spelling or one of the legacy aliases accepted in override notes.
    pub fn parse_override(value: &str) -> Option<Pattern> {
        match value {
            "relay-line" => Some(Pattern::Sequential),
            "bridge-lane" => Some(Pattern::BridgeLane),
            other => Pattern::parse(other),
        }
    }

    pub const fn index(self) -> usize {
        self as usize
    }

    pub fn is_base(self) -> bool {
        self != Pattern::TwinInspection
    }
}

impl Serialize for Pattern {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The six selection dimensions, each scored 0..=3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dimension {
    Uncertainty,
    DependencyDepth,
    Separability,
    Singularity,
    Verification,
    MergeRisk,
}

impl Dimension {
    pub const ALL: [Dimension; 6] = [
        Dimension::Uncertainty,
        Dimension::DependencyDepth,
        Dimension::Separability,
        Dimension::Singularity,
        Dimension::Verification,
        Dimension::MergeRisk,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Dimension::Uncertainty => "uncertainty_of_solution",
            Dimension::DependencyDepth => "dependency_depth",
            Dimension::Separability => "module_separability",
            Dimension::Singularity => "workpiece_singularity",
            Dimension::Verification => "verification_criticality",
            Dimension::MergeRisk => "merge_conflict_risk",
        }
    }

    pub fn parse(value: &str) -> Option<Dimension> {
        Dimension::ALL.into_iter().find(|d| d.as_str() == value)
    }

    pub const fn index(self) -> usize {
        self as usize
    }
}

/// The roles a lane can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LaneRole {
    Builder,
    Integrator,
    VariantDesigner,
    Curator,
    PhaseWorker,
    RecoveryWorker,
    Reviewer,
}

impl LaneRole {
    pub const ALL: [LaneRole; 7] = [
        LaneRole::Builder,
        LaneRole::Integrator,
        LaneRole::VariantDesigner,
        LaneRole::Curator,
        LaneRole::PhaseWorker,
        LaneRole::RecoveryWorker,
        LaneRole::Reviewer,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            LaneRole::Builder => "builder",
            LaneRole::Integrator => "integrator",
            LaneRole::VariantDesigner => "variant-designer",
            LaneRole::Curator => "curator",
            LaneRole::PhaseWorker => "phase-worker",
            LaneRole::RecoveryWorker => "recovery-worker",
            LaneRole::Reviewer => "reviewer",
        }
    }

    pub fn parse(value: &str) -> Option<LaneRole> {
        LaneRole::ALL.into_iter().find(|r| r.as_str() == value)
    }

    pub const fn index(self) -> usize {
        self as usize
    }

    /// What a worker in this role is expected to hand back (used by the renderers).
    pub const fn expected_output(self) -> &'static str {
        match self {
            LaneRole::Builder => {
                "the changed files, a short account of the implementation, and validation evidence"
            }
            LaneRole::Integrator => {
                "the merged result, the scopes it touched, and the integration risks still open"
            }
            LaneRole::VariantDesigner => "one alternative approach together with its trade-offs",
            LaneRole::Curator => "a ranked comparison of the variants and a recommendation",
            LaneRole::PhaseWorker => {
                "evidence that the phase is complete, plus handoff notes for the work that depends on it"
            }
            LaneRole::RecoveryWorker => "the root cause, a narrow repair diff, and how to resume",
            LaneRole::Reviewer => {
                "an independent verdict, any regressions found, and a check of the proof"
            }
        }
    }
}

impl Serialize for LaneRole {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}
