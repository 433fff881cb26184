//! operations: domain state folded from the journal (being built on its own branch).

use serde::{Deserialize, Serialize};

use crate::workspace::{Notice, Record};

/// Folded state of the `operation.*` records.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct OperationState {
    /// How many records of this domain were folded.
    pub records: u64,
}

impl OperationState {
    pub fn apply(&mut self, _rec: &Record, _out: &mut Vec<Notice>) {
        self.records += 1;
    }
}
