//! workers: domain state folded from the journal (being built on its own branch).

use serde::{Deserialize, Serialize};

use crate::workspace::{Notice, Record};

/// Folded state of the `worker.*` records.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WorkerState {
    /// How many records of this domain were folded.
    pub records: u64,
}

impl WorkerState {
    pub fn apply(&mut self, _rec: &Record, _out: &mut Vec<Notice>) {
        self.records += 1;
    }
}
