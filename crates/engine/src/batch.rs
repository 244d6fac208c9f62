//! What goes in and comes out of a run: a [`Batch`] of token rows with its mask and
//! positions, the [`Activations`] of its hooks and its dictionaries' latents.

use siphon_models::{HookPoint, Latents};
use siphon_runtime::HostArray;

use crate::error::EngineError;

/// A batch of equal-length token rows, its attention mask and position ids.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub(crate) batch: usize,
    pub(crate) seq: usize,
    pub(crate) input_ids: Vec<i32>,
    pub(crate) attention_mask: Vec<i32>,
    pub(crate) position_ids: Vec<i32>,
    pub(crate) next_ids: Vec<i32>,
    /// Chosen rows: how many a sequence, and their weights row-major `[batch, rows, seq]`
    /// (`siphon_models::ForwardSpec::select`).
    pub(crate) select: Option<(usize, Vec<f32>)>,
    /// Each row's uniform in `[0, 1)`, where a decoding step draws its next token
    /// (`siphon_models::ForwardSpec::sampling`).
    pub(crate) uniforms: Option<Vec<f32>>,
}

impl Batch {
    /// Rows of token ids (all the same length) and an optional 0/1 mask of the same shape
    /// (all ones when `None`). Position ids are `cumsum(mask) - 1`, clamped at 0.
    pub fn new(ids: Vec<Vec<u32>>, mask: Option<Vec<Vec<u8>>>) -> Result<Batch, EngineError> {
        let batch = ids.len();
        let seq = ids.first().map_or(0, Vec::len);
        if batch == 0 || seq == 0 {
            return Err(EngineError::Batch("the batch is empty".into()));
        }
        if let Some(row) = ids.iter().position(|r| r.len() != seq) {
            return Err(EngineError::Batch(format!(
                "row {row} has {} tokens, row 0 has {seq}: rows must have equal length",
                ids[row].len()
            )));
        }
        let mask = match mask {
            None => vec![1i32; batch * seq],
            Some(m) => {
                if m.len() != batch || m.iter().any(|r| r.len() != seq) {
                    return Err(EngineError::Batch(format!("the attention mask must be {batch}x{seq} like the ids")));
                }
                let mut flat = Vec::with_capacity(batch * seq);
                for (r, row) in m.iter().enumerate() {
                    for &v in row {
                        if v > 1 {
                            return Err(EngineError::Batch(format!("attention mask row {r} holds {v}; only 0 and 1")));
                        }
                        flat.push(i32::from(v));
                    }
                }
                flat
            }
        };
        let mut input_ids = Vec::with_capacity(batch * seq);
        for row in &ids {
            for &t in row {
                input_ids.push(i32::try_from(t).map_err(|_| EngineError::Batch(format!("token id {t} exceeds i32")))?);
            }
        }
        let position_ids = positions_from_mask(&mask, seq);
        let next_ids = next_in_row(&input_ids, &mask, seq);
        Ok(Batch { batch, seq, input_ids, attention_mask: mask, position_ids, next_ids, select: None, uniforms: None })
    }

    /// Replaces each token's next token (row-major `[batch, seq]`, −1 where a token has none:
    /// the last of a document packed with others) for the next-token outputs; by default the
    /// row's next real token ([`next_in_row`]).
    pub fn with_next_ids(mut self, next_ids: Vec<i32>) -> Result<Batch, EngineError> {
        if next_ids.len() != self.batch * self.seq {
            return Err(EngineError::Batch(format!(
                "{} next token ids for a {}x{} batch",
                next_ids.len(),
                self.batch,
                self.seq
            )));
        }
        if let Some(t) = next_ids.iter().find(|&&t| t < -1) {
            return Err(EngineError::Batch(format!("next token id {t} (-1 is none)")));
        }
        self.next_ids = next_ids;
        Ok(self)
    }

    /// Row-major `[batch, seq]`: each token's next token, −1 where it has none.
    pub fn next_ids(&self) -> &[i32] {
        &self.next_ids
    }

    /// Each row's uniform in `[0, 1)` for a decoding step that draws its next token.
    pub fn with_uniforms(mut self, uniforms: Vec<f32>) -> Result<Batch, EngineError> {
        if uniforms.len() != self.batch {
            return Err(EngineError::Batch(format!("{} uniforms for {} rows", uniforms.len(), self.batch)));
        }
        if let Some(u) = uniforms.iter().find(|u| !(0.0..1.0).contains(*u)) {
            return Err(EngineError::Batch(format!("uniform {u} is outside [0, 1)")));
        }
        self.uniforms = Some(uniforms);
        Ok(self)
    }

    /// Replaces the computed position ids (row-major `[batch, seq]`).
    pub fn with_position_ids(mut self, position_ids: Vec<i32>) -> Result<Batch, EngineError> {
        if position_ids.len() != self.batch * self.seq {
            return Err(EngineError::Batch(format!(
                "{} position ids for a {}x{} batch",
                position_ids.len(),
                self.batch,
                self.seq
            )));
        }
        if let Some(p) = position_ids.iter().find(|&&p| p < 0) {
            return Err(EngineError::Batch(format!("negative position id {p}")));
        }
        self.position_ids = position_ids;
        Ok(self)
    }

    /// Chosen rows: the run returns `rows` rows a sequence per hook instead of one per token,
    /// row `r` of sequence `i` the sum of its tokens' values weighted by
    /// `weights[(i * rows + r) * seq + t]` (row-major `[batch, rows, seq]`, finite): one-hot
    /// picks a token, `1/n` over `n` tokens averages them.
    pub fn with_selection(mut self, rows: usize, weights: Vec<f32>) -> Result<Batch, EngineError> {
        if rows == 0 || weights.len() != self.batch * rows * self.seq {
            return Err(EngineError::Batch(format!(
                "{} selection weights for {rows} rows of a {}x{} batch",
                weights.len(),
                self.batch,
                self.seq
            )));
        }
        if let Some(w) = weights.iter().find(|w| !w.is_finite()) {
            return Err(EngineError::Batch(format!("selection weight {w} is not finite")));
        }
        self.select = Some((rows, weights));
        Ok(self)
    }

    /// Chosen rows a sequence, when the batch has a selection.
    pub fn chosen_rows(&self) -> Option<usize> {
        self.select.as_ref().map(|(rows, _)| *rows)
    }

    /// Rows.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Tokens per row.
    pub fn seq(&self) -> usize {
        self.seq
    }

    /// Row-major `[batch, seq]` attention mask.
    pub fn attention_mask(&self) -> &[i32] {
        &self.attention_mask
    }

    /// Row-major `[batch, seq]` position ids.
    pub fn position_ids(&self) -> &[i32] {
        &self.position_ids
    }

    /// Row-major `[batch, seq]` token ids.
    pub fn input_ids(&self) -> &[i32] {
        &self.input_ids
    }
}

/// Each real token's next token in its row (`ids[p + 1]` where both are real), −1 where
/// there is none: a row's last real token, and padding.
pub fn next_in_row(ids: &[i32], mask: &[i32], seq: usize) -> Vec<i32> {
    let mut out = vec![-1; ids.len()];
    for (p, next) in out.iter_mut().enumerate() {
        let last_in_row = (p + 1).is_multiple_of(seq.max(1));
        if !last_in_row && mask[p] == 1 && mask[p + 1] == 1 {
            *next = ids[p + 1];
        }
    }
    out
}

/// `cumsum(mask) - 1` per row, clamped at 0 (HF's convention for padded batches).
pub fn positions_from_mask(mask: &[i32], seq: usize) -> Vec<i32> {
    let mut out = Vec::with_capacity(mask.len());
    for row in mask.chunks(seq.max(1)) {
        let mut sum = 0i32;
        for &m in row {
            sum += m;
            out.push((sum - 1).max(0));
        }
    }
    out
}

/// The requested activations of one batch, in hook order, each `[batch, seq, hidden]`.
#[derive(Debug, Clone)]
pub struct Activations {
    /// (hook, array) in the order the hooks were requested.
    pub hooks: Vec<(HookPoint, HostArray)>,
    /// Each dictionary's latents, in [`EngineOptions::dictionaries`](crate::EngineOptions::dictionaries)' order.
    pub latents: Vec<Latents<HostArray>>,
    /// The next-token outputs by name (`output.nll`, …; [`EngineOptions::next_token`](crate::EngineOptions::next_token)), each
    /// `[batch, seq, …]`: f32, the top-k's ids i32.
    pub next_token: Vec<(String, HostArray)>,
}

impl Activations {
    /// The array of one hook.
    pub fn get(&self, hook: HookPoint) -> Option<&HostArray> {
        self.hooks.iter().find(|(h, _)| *h == hook).map(|(_, a)| a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tokens_next_is_the_rows_next_real_token() {
        let (ids, seq) = ([5, 6, 7, 0, 0, 0, 8, 9, 4], 3);
        assert_eq!(next_in_row(&ids, &[1, 1, 1, 1, 0, 0, 0, 1, 1], seq), [6, 7, -1, -1, -1, -1, -1, 4, -1]);
        let batch = Batch::new(vec![vec![1, 2], vec![3, 4]], None).unwrap();
        assert_eq!(batch.next_ids(), [2, -1, 4, -1]);
        assert!(batch.clone().with_next_ids(vec![-2, 0, 0, 0]).unwrap_err().to_string().contains("-2"));
        assert!(batch.with_next_ids(vec![0]).unwrap_err().to_string().contains("1 next token ids"));
    }

    #[test]
    fn positions_follow_the_mask_on_either_side() {
        assert_eq!(positions_from_mask(&[1, 1, 1, 0, 0], 5), vec![0, 1, 2, 2, 2]);
        assert_eq!(positions_from_mask(&[0, 0, 1, 1, 1], 5), vec![0, 0, 0, 1, 2]);
        assert_eq!(positions_from_mask(&[1, 1, 0, 1, 1, 1], 3), vec![0, 1, 1, 0, 1, 2]);
    }

    #[test]
    fn batch_validation_names_the_problem() {
        let err = Batch::new(vec![], None).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
        let err = Batch::new(vec![vec![1, 2]], Some(vec![vec![1, 2]])).unwrap_err();
        assert!(err.to_string().contains("only 0 and 1"), "{err}");
        let b = Batch::new(vec![vec![1, 2]], None).unwrap();
        assert!(b.clone().with_position_ids(vec![0]).is_err());
        assert!(b.clone().with_position_ids(vec![0, -1]).is_err());
        assert_eq!(b.with_position_ids(vec![5, 6]).unwrap().position_ids(), &[5, 6]);
    }
}
