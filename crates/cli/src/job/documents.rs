//! `--keep-columns`: the kept columns of the documents each batch stores rows of, read from the
//! corpus by unit (`siphon_data::Corpus::unit_fields`, the same stable record index the
//! documents' ids hold) and handed to the writer with the batch, which stores them in the shard
//! that holds the rows: resume, `verify` and the readers see them as they see the rows.

use std::collections::{BTreeSet, VecDeque};

use anyhow::Context;
use siphon_data::{Corpus, Fields, NO_DOC};

/// Units whose fields stay read (a unit's documents reach the batches together).
const UNITS_KEPT: usize = 4;

/// The kept columns' reader.
pub struct Documents {
    corpus: Corpus,
    names: Vec<String>,
    /// The units read last, each record's fields by its stable index.
    units: VecDeque<(u32, Vec<Fields>)>,
}

impl Documents {
    /// Reads `names` of `corpus`'s records (checked against it before the run).
    pub fn new(corpus: Corpus, names: Vec<String>) -> Documents {
        Documents { corpus, names, units: VecDeque::new() }
    }

    /// Each of `docs` (document ids, [`NO_DOC`] skipped) once, in order, with its kept columns
    /// as a JSON object's text.
    pub fn of(&mut self, docs: impl IntoIterator<Item = i64>) -> anyhow::Result<Vec<(i64, String)>> {
        let docs: BTreeSet<i64> = docs.into_iter().filter(|&d| d != NO_DOC).collect();
        docs.into_iter()
            .map(|doc| {
                let (unit, record) = ((doc >> 32) as u32, (doc & 0xffff_ffff) as usize);
                let fields = self.unit(unit)?.get(record).with_context(|| {
                    format!("--keep-columns: document {doc} (unit {unit}, record {record}) is not in the corpus")
                })?;
                Ok((doc, serde_json::to_string(fields)?))
            })
            .collect()
    }

    /// Unit `unit`'s records' fields, read once while it is among the last few used.
    fn unit(&mut self, unit: u32) -> anyhow::Result<&[Fields]> {
        if let Some(at) = self.units.iter().position(|(u, _)| *u == unit) {
            return Ok(&self.units[at].1);
        }
        let fields = self
            .corpus
            .unit_fields(unit, &self.names)
            .with_context(|| format!("--keep-columns: reading unit {unit}'s columns"))?;
        if self.units.len() == UNITS_KEPT {
            self.units.pop_front();
        }
        self.units.push_back((unit, fields));
        Ok(&self.units.back().expect("just pushed").1)
    }
}

/// The documents a member's batch stores rows of: its chosen rows' documents, or the documents
/// of the tokens it keeps (every real token's with `--keep-excluded`).
pub fn stored(batch: &siphon_data::Batch, chosen: Option<&siphon_data::Selection>, keep_excluded: bool) -> Vec<i64> {
    match chosen {
        Some(c) => c.doc.iter().zip(&c.used).filter(|(_, u)| **u == 1).map(|(d, _)| *d).collect(),
        None => {
            batch.doc.iter().zip(&batch.exclude).filter(|(_, e)| keep_excluded || **e == 0).map(|(d, _)| *d).collect()
        }
    }
}
