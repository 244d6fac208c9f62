//! Chosen rows (`--positions`): which rows of each document a run stores instead of every
//! token — its last or first kept token, its last N, the mean of its kept tokens, the token
//! after each occurrence of a marker — as the weights the forward sums each row's tokens
//! with (`[batch, rows, seq]`: one-hot picks a token, `1/n` over `n` tokens averages them) and
//! the bookkeeping of each chosen row. Pure: the device does the sums.
//!
//! The unit is a document's run of tokens in its row; with `per_turn` (a run of conversations
//! keeping some roles), each turn of a kept role: a maximal run of its tokens of one role. A
//! document that does not lie whole in its row (cut off at a padded row's end, or split over
//! rows) gives no row: its last token, or its mean, would not be the document's; such
//! documents are listed in [`Selection::cut`].

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::stream::Batch;

/// Which rows of each document (or turn) are stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Positions {
    /// Its first kept token.
    First,
    /// Its last kept token.
    Last,
    /// Its last N kept tokens (all of them when it has fewer).
    LastN(usize),
    /// The mean of its kept tokens, in f32 on the device.
    Mean,
    /// The kept token right after each occurrence of this text's tokens.
    After(String),
}

impl FromStr for Positions {
    type Err = String;
    fn from_str(s: &str) -> Result<Positions, String> {
        Ok(match s {
            "first" => Positions::First,
            "last" => Positions::Last,
            "mean" => Positions::Mean,
            _ if s.starts_with("last:") => {
                let n = &s["last:".len()..];
                match n.parse::<usize>() {
                    Ok(0) => return Err("last:0 chooses no token (last:N takes N ≥ 1)".into()),
                    Ok(n) => Positions::LastN(n),
                    Err(_) => return Err(format!("last:{n}: N is not a whole number")),
                }
            }
            _ if s.starts_with("after:") => match &s["after:".len()..] {
                "" => return Err("after: names no marker text (after:TEXT)".into()),
                marker => Positions::After(marker.to_string()),
            },
            other => {
                return Err(format!("{other:?} is not one of all, first, last, last:N, mean, after:TEXT"));
            }
        })
    }
}

impl Positions {
    /// Whether a chosen row pools several tokens (its first position and count are stored).
    pub fn pools(&self) -> bool {
        matches!(self, Positions::Mean)
    }
}

/// A batch's chosen rows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selection {
    /// Chosen rows a sequence: the most any sequence has, rounded up to a power of two (at
    /// most the sequence's length), so that few shapes are compiled. Rows past a sequence's
    /// own are unused (`used` 0, weights 0).
    pub rows: usize,
    /// `[batch, rows, seq]`: each chosen row's weight of each token.
    pub weights: Vec<f32>,
    /// `[batch, rows]`: the token of each chosen row (a pooled row's last).
    pub tokens: Vec<u32>,
    /// `[batch, rows]`: its document ([`crate::doc_id`]), -1 where unused.
    pub doc: Vec<i64>,
    /// `[batch, rows]`: its position in the document (a pooled row's last), -1 where unused.
    pub position: Vec<i32>,
    /// `[batch, rows]`: a pooled row's first position (the position where one token).
    pub first: Vec<i32>,
    /// `[batch, rows]`: the tokens it sums (1 where one token, 0 where unused).
    pub count: Vec<i32>,
    /// `[batch, rows]`: its token's role byte.
    pub role: Vec<u8>,
    /// `[batch, rows]`: 1 for a chosen row, 0 for an unused one.
    pub used: Vec<u8>,
    /// Documents of the batch that give no row because the marker never occurs in them
    /// (`Positions::After`).
    pub without_marker: Vec<i64>,
    /// Documents of the batch that give no row because they do not lie whole in their row.
    pub cut: Vec<i64>,
}

/// One chosen row of a sequence: the (token index in the sequence, weight) it sums.
type Chosen = Vec<(usize, f32)>;

/// The rows `how` chooses in `batch`, at least `at_least` a sequence (several batches of one
/// step share a shape); `marker` is [`Positions::After`]'s text as token ids.
pub fn choose(batch: &Batch, how: &Positions, marker: &[u32], per_turn: bool, at_least: usize) -> Selection {
    let seq = batch.seq_len;
    let mut per_sequence: Vec<Vec<Chosen>> = Vec::with_capacity(batch.len());
    let (mut without_marker, mut cut) = (Vec::new(), Vec::new());
    for i in 0..batch.len() {
        let at = |t: usize| i * seq + t;
        let mut chosen = Vec::new();
        for doc in documents(batch, i) {
            // Whole: it starts in this row and does not run off its end.
            let starts_here = batch.doc_pos[at(doc.start)] == 0;
            let runs_off = doc.last_in_row && batch.cut[i] == 1;
            if !starts_here || runs_off {
                cut.push(batch.doc[at(doc.start)]);
                continue;
            }
            if let Positions::After(_) = how {
                let found = after_marker(batch, i, &doc, marker);
                if found.is_empty() {
                    without_marker.push(batch.doc[at(doc.start)]);
                }
                chosen.extend(found.into_iter().map(|t| vec![(t, 1.0)]));
                continue;
            }
            for span in spans(batch, i, &doc, per_turn) {
                let kept: Vec<usize> = span.filter(|&t| batch.exclude[at(t)] == 0).collect();
                let Some((&first, &last)) = kept.first().zip(kept.last()) else { continue };
                match how {
                    Positions::First => chosen.push(vec![(first, 1.0)]),
                    Positions::Last => chosen.push(vec![(last, 1.0)]),
                    Positions::LastN(n) => {
                        chosen.extend(kept[kept.len().saturating_sub(*n)..].iter().map(|&t| vec![(t, 1.0)]))
                    }
                    Positions::Mean => {
                        let w = 1.0 / kept.len() as f32;
                        chosen.push(kept.iter().map(|&t| (t, w)).collect());
                    }
                    Positions::After(_) => unreachable!("handled above"),
                }
            }
        }
        per_sequence.push(chosen);
    }
    let most = per_sequence.iter().map(Vec::len).max().unwrap_or(0);
    // Each chosen row ends at a token of its own, so `most` is at most `seq`.
    let rows = most.max(1).next_power_of_two().min(seq).max(at_least);
    let mut s = Selection {
        rows,
        weights: vec![0.0; batch.len() * rows * seq],
        tokens: vec![0; batch.len() * rows],
        doc: vec![crate::NO_DOC; batch.len() * rows],
        position: vec![-1; batch.len() * rows],
        first: vec![-1; batch.len() * rows],
        count: vec![0; batch.len() * rows],
        role: vec![0; batch.len() * rows],
        used: vec![0; batch.len() * rows],
        without_marker,
        cut,
    };
    for (i, chosen) in per_sequence.iter().enumerate() {
        for (r, row) in chosen.iter().enumerate() {
            let k = i * rows + r;
            for &(t, w) in row {
                s.weights[k * seq + t] = w;
            }
            let (first, last) = (row[0].0, row[row.len() - 1].0);
            s.tokens[k] = batch.tokens[i * seq + last];
            s.doc[k] = batch.doc[i * seq + last];
            s.position[k] = batch.doc_pos[i * seq + last];
            s.first[k] = batch.doc_pos[i * seq + first];
            s.count[k] = row.len() as i32;
            s.role[k] = batch.role[i * seq + last];
            s.used[k] = 1;
        }
    }
    s
}

/// The rows `how` chooses in each member's batch of one step (`None` where a member has no
/// batch), every selection with the same rows a sequence — the most any member needs — as
/// the step's one program takes them.
pub fn choose_together(
    batches: &[Option<&Batch>],
    how: &Positions,
    marker: &[u32],
    per_turn: bool,
) -> Vec<Option<Selection>> {
    let choose = |b: &Batch, at_least| choose(b, how, marker, per_turn, at_least);
    let mut chosen: Vec<Option<Selection>> = batches.iter().map(|b| b.map(|b| choose(b, 1))).collect();
    let rows = chosen.iter().flatten().map(|c| c.rows).max().unwrap_or(1);
    // Chosen again only where another member's batch needs more rows a sequence.
    for (c, b) in chosen.iter_mut().zip(batches) {
        if let (Some(c), Some(b)) = (c, b)
            && c.rows < rows
        {
            *c = choose(b, rows);
        }
    }
    chosen
}

/// A document's run of tokens in a sequence: `start..end`.
struct DocRun {
    start: usize,
    end: usize,
    /// Whether no other document follows it in the row.
    last_in_row: bool,
}

/// The runs of documents in sequence `i`, in order (padding and inserted tokens skipped).
fn documents(batch: &Batch, i: usize) -> Vec<DocRun> {
    let seq = batch.seq_len;
    let doc = &batch.doc[i * seq..(i + 1) * seq];
    let mut runs: Vec<DocRun> = Vec::new();
    let mut t = 0;
    while t < seq {
        if doc[t] == crate::NO_DOC {
            t += 1;
            continue;
        }
        let start = t;
        while t < seq && doc[t] == doc[start] {
            t += 1;
        }
        runs.push(DocRun { start, end: t, last_in_row: false });
    }
    if let Some(last) = runs.last_mut() {
        last.last_in_row = true;
    }
    runs
}

/// The units of `doc` rows are chosen in: the document, or each turn (a maximal run of one
/// role's tokens) where `per_turn`.
fn spans(batch: &Batch, i: usize, doc: &DocRun, per_turn: bool) -> Vec<std::ops::Range<usize>> {
    if !per_turn {
        return std::iter::once(doc.start..doc.end).collect();
    }
    let role = &batch.role[i * batch.seq_len..(i + 1) * batch.seq_len];
    let mut spans = Vec::new();
    let mut start = doc.start;
    for t in doc.start + 1..=doc.end {
        if t == doc.end || role[t] != role[start] {
            spans.push(start..t);
            start = t;
        }
    }
    spans
}

/// The kept tokens right after each occurrence of `marker` in `doc`.
fn after_marker(batch: &Batch, i: usize, doc: &DocRun, marker: &[u32]) -> Vec<usize> {
    let seq = batch.seq_len;
    let tokens = &batch.tokens[i * seq..(i + 1) * seq];
    if marker.is_empty() {
        return Vec::new();
    }
    (doc.start..doc.end.saturating_sub(marker.len()))
        .filter(|&t| tokens[t..t + marker.len()] == *marker)
        .map(|t| t + marker.len())
        .filter(|&t| batch.exclude[i * seq + t] == 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::{Position, SeqId};

    /// A token: (id, doc, doc_pos, exclude, role).
    type Token = (u32, i64, i32, u8, u8);

    /// A batch of `rows` of tokens, `cut` per row.
    fn batch(rows: &[Vec<Token>], cut: &[u8]) -> Batch {
        let seq = rows[0].len();
        let pick = |f: &dyn Fn(&Token) -> i64| -> Vec<i64> { rows.iter().flatten().map(f).collect() };
        Batch {
            index: 0,
            seq_len: seq,
            ids: (0..rows.len()).map(|i| SeqId { unit: 0, index: i as u32 }).collect(),
            tokens: pick(&|t| i64::from(t.0)).into_iter().map(|v| v as u32).collect(),
            attention_mask: pick(&|t| i64::from(t.1 >= 0)).into_iter().map(|v| v as u8).collect(),
            exclude: pick(&|t| i64::from(t.3)).into_iter().map(|v| v as u8).collect(),
            doc: pick(&|t| t.1),
            doc_pos: pick(&|t| i64::from(t.2)).into_iter().map(|v| v as i32).collect(),
            role: pick(&|t| i64::from(t.4)).into_iter().map(|v| v as u8).collect(),
            cut: cut.to_vec(),
            position: Position { batches: 1, sequences: rows.len() as u64, ..Default::default() },
        }
    }

    const PAD: Token = (0, -1, -1, 1, 0);

    /// Two isolated documents in row 0 (BOS excluded), a cut one in row 1.
    fn two_rows() -> Batch {
        let row0 = vec![(1, 7, 0, 1, 0), (10, 7, 1, 0, 0), (11, 7, 2, 0, 0), (1, 8, 0, 1, 0), (20, 8, 1, 0, 0), PAD];
        let row1 = vec![
            (1, 9, 0, 1, 0),
            (30, 9, 1, 0, 0),
            (31, 9, 2, 0, 0),
            (32, 9, 3, 0, 0),
            (33, 9, 4, 0, 0),
            (34, 9, 5, 0, 0),
        ];
        batch(&[row0, row1], &[0, 1])
    }

    #[test]
    fn last_first_and_mean_rows_of_whole_documents() {
        let b = two_rows();
        let s = choose(&b, &Positions::Last, &[], false, 1);
        assert_eq!((s.rows, s.used.clone()), (2, vec![1, 1, 0, 0]));
        assert_eq!(
            (s.doc[..2].to_vec(), s.position[..2].to_vec(), s.tokens[..2].to_vec()),
            (vec![7, 8], vec![2, 1], vec![11, 20])
        );
        assert_eq!(s.weights[..6], [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
        assert_eq!(s.cut, [9]);
        let s = choose(&b, &Positions::First, &[], false, 1);
        assert_eq!(s.position[..2], [1, 1]);
        let s = choose(&b, &Positions::Mean, &[], false, 1);
        assert_eq!(
            (s.first[..2].to_vec(), s.position[..2].to_vec(), s.count[..2].to_vec()),
            (vec![1, 1], vec![2, 1], vec![2, 1])
        );
        assert_eq!(s.weights[..6], [0.0, 0.5, 0.5, 0.0, 0.0, 0.0]);
        let s = choose(&b, &Positions::LastN(5), &[], false, 1);
        assert_eq!((s.rows, s.doc[..4].to_vec()), (4, vec![7, 7, 8, -1]));
    }

    #[test]
    fn after_a_marker_and_documents_without_it() {
        let b = two_rows();
        let s = choose(&b, &Positions::After("x".into()), &[10], false, 1);
        assert_eq!((s.rows, s.tokens[0], s.position[0]), (1, 11, 2));
        assert_eq!((s.without_marker.clone(), s.cut.clone()), (vec![8], vec![9]));
        // A marker at a document's end has no token after it.
        let s = choose(&b, &Positions::After("x".into()), &[20], false, 1);
        assert_eq!(s.without_marker, [7, 8]);
    }

    #[test]
    fn turns_of_a_conversation_each_give_a_row() {
        // user (1) then assistant (2), twice; the template token between excluded.
        let row = vec![(5, 3, 0, 0, 1), (6, 3, 1, 0, 2), (7, 3, 2, 0, 2), (8, 3, 3, 1, 0), (9, 3, 4, 0, 2), PAD];
        let b = batch(&[row], &[0]);
        let s = choose(&b, &Positions::Last, &[], true, 1);
        assert_eq!(s.position[..3], [0, 2, 4]);
        let s = choose(&b, &Positions::Last, &[], false, 1);
        assert_eq!(s.position[..1], [4]);
    }

    #[test]
    fn members_of_one_step_share_the_most_rows_any_needs() {
        let two_docs = two_rows();
        let row = vec![(5, 4, 0, 0, 0), (6, 4, 1, 0, 0), (7, 4, 2, 0, 0), (8, 4, 3, 0, 0), (9, 4, 4, 0, 0), PAD];
        let one_doc = batch(&[row], &[0]);
        let how = Positions::Last;
        // Alone, the first needs 2 rows a sequence (documents 7 and 8 share its row 0), the
        // second 1.
        assert_eq!((choose(&two_docs, &how, &[], false, 1).rows, choose(&one_doc, &how, &[], false, 1).rows), (2, 1));
        let together = choose_together(&[Some(&one_doc), None, Some(&two_docs)], &how, &[], false);
        assert!(together[1].is_none());
        let (a, c) = (together[0].as_ref().unwrap(), together[2].as_ref().unwrap());
        assert_eq!((a.rows, c.rows), (2, 2));
        assert_eq!(*a, choose(&one_doc, &how, &[], false, 2));
        assert_eq!((a.position.clone(), a.used.clone()), (vec![4, -1], vec![1, 0]));
        assert_eq!(choose_together(&[None, None], &how, &[], false), vec![None, None]);
    }

    #[test]
    fn bad_positions_are_named() {
        assert!("last:0".parse::<Positions>().unwrap_err().contains("last:0"));
        assert!("after:".parse::<Positions>().unwrap_err().contains("after:"));
        assert!("middle".parse::<Positions>().unwrap_err().contains("middle"));
        assert_eq!("last:3".parse::<Positions>(), Ok(Positions::LastN(3)));
        assert_eq!("after:Answer:".parse::<Positions>(), Ok(Positions::After("Answer:".into())));
    }
}
