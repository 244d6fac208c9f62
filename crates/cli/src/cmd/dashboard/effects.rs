//! What a dictionary's decoder rows say without any activation, computed by XLA on the CPU
//! plugin in chunks of rows and written as the effects file `siphon.dashboard` reads
//! (`python/siphon/dashboard/_effects.py` names every tensor):
//!
//! - **nearest latents**: each latent's `n` others of largest cosine between decoder rows;
//! - **neuron alignment**, SAEDashboard's first feature table: the largest entries of the
//!   unit decoder row, and each one's share of the row's L1 norm;
//! - **logit effects**, as SAEDashboard computes them (`sae_vis_runner.py`): the row made a
//!   unit vector (SAEDashboard folds the decoder norms first, `fold_W_dec_norm`), times the
//!   unembedding in TransformerLens's convention ([`siphon_models::Unembedding`]: the final
//!   norm's gain folded in, centred over the vocabulary); the `k` largest and `k` most negative
//!   tokens, and the histogram of the logits over the whole vocabulary (SAEDashboard's
//!   `LogitsHistogramData`: `torch.histc` bins between the row's smallest and largest, counted
//!   here as torch counts them, in f32). Only for a dictionary whose decoder writes to the
//!   residual stream's basis (SAEDashboard's `to_resid_direction` passes those rows as they
//!   are); a dictionary on `hook_z` or inside the MLP would need `W_O` or `W_out` first and is
//!   passed over, said in the log, rather than computed some other way.

use anyhow::{Context, bail};
use safetensors::{Dtype, tensor::TensorView};
use siphon_hlo::{Builder, DType, TensorType, Value};
use siphon_models::dictionary::Tensor;
use siphon_runtime::{Client, CompileOptions, HostArray};

/// Rows of the decoder multiplied at once.
const CHUNK: usize = 1024;
/// Rows of the decoder whose logits come back to the host at once (`[rows, vocab]` f32).
const LOGIT_ROWS: usize = 128;

/// The tensors of one column's effects file, by name.
#[derive(Default)]
pub(super) struct ColumnEffects {
    tensors: Vec<(&'static str, Dtype, Vec<usize>, Vec<u8>)>,
}

impl ColumnEffects {
    fn add_i32(&mut self, name: &'static str, shape: Vec<usize>, values: &[i32]) {
        self.tensors.push((name, Dtype::I32, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect()));
    }

    fn add_f32(&mut self, name: &'static str, shape: Vec<usize>, values: &[f32]) {
        self.tensors.push((name, Dtype::F32, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect()));
    }

    /// Whether nothing was computed.
    pub(super) fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Writes the file.
    pub(super) fn write(&self, path: &std::path::Path) -> anyhow::Result<()> {
        let views = self
            .tensors
            .iter()
            .map(|(name, dtype, shape, bytes)| Ok((*name, TensorView::new(*dtype, shape.clone(), bytes)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        safetensors::serialize_to_file(views, None, path).with_context(|| format!("writing {}", path.display()))
    }
}

/// The decoder `[d_sae, d]` with each row divided by its norm (a zero row stays zero).
pub(super) fn unit_rows(w_dec: &Tensor) -> anyhow::Result<(Vec<f32>, usize, usize)> {
    let [latents, d] = w_dec.shape[..] else { bail!("W_dec is {:?}, not [d_sae, d]", w_dec.shape) };
    let mut unit = w_dec.values.clone();
    for row in unit.chunks_exact_mut(d) {
        let norm = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt();
        row.iter_mut().for_each(|v| *v = if norm > 0.0 { (f64::from(*v) / norm) as f32 } else { 0.0 });
    }
    Ok((unit, latents, d))
}

/// Whether a dictionary reading `hook` has decoder rows in the residual stream's basis, as
/// SAEDashboard's `to_resid_direction` takes them unchanged: the residual stream, the blocks'
/// outputs and the norms' outputs that the next layer reads.
pub(super) fn writes_residual_basis(hook: &str) -> bool {
    let last = hook.rsplit('.').next().unwrap_or(hook);
    let in_block =
        ["hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out", "hook_mlp_in"];
    in_block.contains(&last)
        || ["ln1.hook_normalized", "ln2.hook_normalized", "ln_final.hook_normalized", "mlp.hook_in"]
            .iter()
            .any(|suffix| hook.ends_with(suffix))
}

/// Each latent's `n` nearest others by the cosine of its `unit` decoder row (`[latents, d]`),
/// largest first, the latent itself left out: `neighbours_ids` and `neighbours_cosine`.
pub(super) fn neighbours(
    client: &Client,
    out: &mut ColumnEffects,
    unit: &[f32],
    (latents, d): (usize, usize),
    n: usize,
) -> anyhow::Result<()> {
    let n = n.min(latents.saturating_sub(1));
    if n == 0 {
        return Ok(());
    }
    let (mut ids, mut cosines) = (Vec::with_capacity(latents * n), Vec::with_capacity(latents * n));
    let products = |b: &mut Builder, cosine| -> anyhow::Result<Vec<Value>> {
        let (values, indices) = b.top_k(cosine, n + 1)?;
        Ok(vec![values, indices])
    };
    by_chunks(client, unit, d, CHUNK, unit, products, |start, end, result| {
        let values = result[0].to_f32();
        let found = i32s(&result[1]);
        for r in 0..end - start {
            // The latent itself (cosine 1) is left out, wherever the top-k put it.
            let latent = (start + r) as i32;
            for i in (r * (n + 1)..(r + 1) * (n + 1)).filter(|&i| found[i] != latent).take(n) {
                ids.push(found[i]);
                cosines.push(values[i]);
            }
        }
        Ok(())
    })?;
    out.add_i32("neighbours_ids", vec![latents, n], &ids);
    out.add_f32("neighbours_cosine", vec![latents, n], &cosines);
    Ok(())
}

/// Each latent's `n` largest entries of its `unit` decoder row (`[latents, d]`), largest
/// first, as SAEDashboard's neuron alignment table takes them (`add_neuron_alignment_data`:
/// `topk` of the folded row): `alignment_ids`, `alignment_values`, and each one's share of the
/// row's L1 norm, `|value| / Σ|row|` (`alignment_l1`; 0 for a zero row).
pub(super) fn alignment(out: &mut ColumnEffects, unit: &[f32], (latents, d): (usize, usize), n: usize) {
    let n = n.min(d);
    if n == 0 || latents == 0 {
        return;
    }
    let (mut ids, mut values, mut shares) =
        (Vec::with_capacity(latents * n), Vec::with_capacity(latents * n), Vec::with_capacity(latents * n));
    let mut order: Vec<usize> = (0..d).collect();
    for row in unit.chunks_exact(d) {
        order.iter_mut().enumerate().for_each(|(i, o)| *o = i);
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        let l1: f32 = row.iter().map(|v| v.abs()).sum();
        for &i in &order[..n] {
            ids.push(i as i32);
            values.push(row[i]);
            shares.push(if l1 > 0.0 { row[i].abs() / l1 } else { 0.0 });
        }
    }
    out.add_i32("alignment_ids", vec![latents, n], &ids);
    out.add_f32("alignment_values", vec![latents, n], &values);
    out.add_f32("alignment_l1", vec![latents, n], &shares);
}

/// The unembedding in TransformerLens's convention, `[vocab, d]` (rows by token): `unembed`
/// `[vocab, d]` times the final norm's `gain` `[d]` per column where it is folded, each column
/// then less its mean over the vocabulary where `centred` (`center_unembed`).
pub(super) fn folded_unembedding(unembed: &[f32], gain: Option<&[f32]>, d: usize, centred: bool) -> Vec<f32> {
    let vocab = unembed.len() / d.max(1);
    let mut out = unembed.to_vec();
    if let Some(gain) = gain {
        out.chunks_exact_mut(d).for_each(|row| row.iter_mut().zip(gain).for_each(|(u, g)| *u *= g));
    }
    if centred {
        let mut mean = vec![0f64; d];
        for row in out.chunks_exact(d) {
            mean.iter_mut().zip(row).for_each(|(m, &v)| *m += f64::from(v));
        }
        mean.iter_mut().for_each(|m| *m /= vocab.max(1) as f64);
        for row in out.chunks_exact_mut(d) {
            row.iter_mut().zip(&mean).for_each(|(v, &m)| *v = (f64::from(*v) - m) as f32);
        }
    }
    out
}

/// Each latent's logit effects through `w_u` (`[vocab, d]`, [`folded_unembedding`]): the `k`
/// largest (`logits_top_ids`/`_values`), the `k` most negative (`logits_bottom_ids`/`_values`,
/// most negative first) and the histogram of all `vocab` of them in `bins` bins
/// (`logits_hist_heights` i32 `[latents, bins]`, `logits_hist_range` f32 `[latents, 2]`: the
/// smallest and largest logit, the bins' ends).
pub(super) fn logits(
    client: &Client,
    out: &mut ColumnEffects,
    unit: &[f32],
    (latents, d): (usize, usize),
    w_u: &[f32],
    k: usize,
    bins: usize,
) -> anyhow::Result<()> {
    let vocab = w_u.len() / d.max(1);
    let k = k.min(vocab);
    if k == 0 || latents == 0 {
        return Ok(());
    }
    let mut top_values = Vec::with_capacity(latents * k);
    let mut top_found = Vec::with_capacity(latents * k);
    let mut bottom_values = Vec::with_capacity(latents * k);
    let mut bottom_found = Vec::with_capacity(latents * k);
    let mut heights = Vec::with_capacity(latents * bins);
    let mut range = Vec::with_capacity(latents * 2);
    let products = |b: &mut Builder, logits| -> anyhow::Result<Vec<Value>> {
        let (top, top_ids) = b.top_k(logits, k)?;
        let negated = b.neg(logits)?;
        let (bottom, bottom_ids) = b.top_k(negated, k)?;
        Ok(vec![logits, top, top_ids, bottom, bottom_ids])
    };
    by_chunks(client, unit, d, LOGIT_ROWS, w_u, products, |start, end, result| {
        let values = result[0].to_f32();
        let taken = (end - start) * k;
        top_values.extend_from_slice(&result[1].to_f32()[..taken]);
        top_found.extend_from_slice(&i32s(&result[2])[..taken]);
        bottom_values.extend(result[3].to_f32()[..taken].iter().map(|v| -v));
        bottom_found.extend_from_slice(&i32s(&result[4])[..taken]);
        for row in values.chunks_exact(vocab).take(end - start) {
            let (lo, hi, counts) = histc(row, bins);
            heights.extend(counts.iter().map(|&c| c as i32));
            range.extend([lo, hi]);
        }
        Ok(())
    })?;
    out.add_i32("logits_top_ids", vec![latents, k], &top_found);
    out.add_f32("logits_top_values", vec![latents, k], &top_values);
    out.add_i32("logits_bottom_ids", vec![latents, k], &bottom_found);
    out.add_f32("logits_bottom_values", vec![latents, k], &bottom_values);
    out.add_i32("logits_hist_heights", vec![latents, bins], &heights);
    out.add_f32("logits_hist_range", vec![latents, 2], &range);
    Ok(())
}

/// `torch.histc(values, bins)` as torch's CPU kernel counts it: `bins` equal bins between the
/// smallest and largest value (both widened by 1 when they are equal), a value's bin
/// `⌊(v − lo) · bins / (hi − lo)⌋` in f32, the largest value in the last bin. Hands back
/// `(lo, hi, counts)` with the values' own smallest and largest.
pub(super) fn histc(values: &[f32], bins: usize) -> (f32, f32, Vec<u32>) {
    let mut counts = vec![0u32; bins];
    let (mut min, mut max) = (f32::INFINITY, f32::NEG_INFINITY);
    for &v in values {
        min = min.min(v);
        max = max.max(v);
    }
    if values.is_empty() || bins == 0 || !min.is_finite() || !max.is_finite() {
        return (0.0, 0.0, counts);
    }
    let (lo, hi) = if min == max { (min - 1.0, max + 1.0) } else { (min, max) };
    for &v in values {
        let at = ((v - lo) * bins as f32 / (hi - lo)) as usize;
        counts[at.min(bins - 1)] += 1;
    }
    (min, max, counts)
}

/// The products of every chunk of `chunk` rows of `rows` (`[_, d]`, the last chunk
/// padded with zeros) with every row of `other` (`[_, d]`, uploaded once): a program whose
/// outputs `outputs` builds from the `[chunk, other rows]` product, compiled once
/// and run per chunk; `each` takes the chunk's first and end row and the outputs on the host.
fn by_chunks(
    client: &Client,
    rows: &[f32],
    d: usize,
    chunk: usize,
    other: &[f32],
    outputs: impl FnOnce(&mut Builder, Value) -> anyhow::Result<Vec<Value>>,
    mut each: impl FnMut(usize, usize, Vec<HostArray>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let latents = rows.len() / d.max(1);
    let chunk = chunk.min(latents);
    let others = other.len() / d.max(1);
    let mut b = Builder::new("decoder_rows");
    let block = b.arg(TensorType::new(DType::F32, &[chunk, d]), None)?;
    let all = b.arg(TensorType::new(DType::F32, &[others, d]), None)?;
    let product = b.matmul_t(block, all)?;
    let outputs = outputs(&mut b, product)?;
    let exe = client.compile(&b.finish(&outputs)?, &CompileOptions::single_device(None))?;
    let device = exe.device_ids()[0];
    let all = client.upload(&HostArray::from_slice(&[others, d], other)?, device)?;
    for start in (0..latents).step_by(chunk.max(1)) {
        let end = (start + chunk).min(latents);
        let block = client.upload(&HostArray::from_slice(&[chunk, d], &padded(rows, start, end, chunk, d))?, device)?;
        let result = exe.execute(&[vec![&block, &all]])?;
        let host = result[0].iter().map(|b| b.to_host()).collect::<Result<Vec<_>, _>>()?;
        each(start, end, host)?;
    }
    Ok(())
}

/// Rows `start..end` of `rows` (`[_, d]`) padded with zeros to `chunk` rows.
fn padded(rows: &[f32], start: usize, end: usize, chunk: usize, d: usize) -> Vec<f32> {
    let mut block = vec![0f32; chunk * d];
    block[..(end - start) * d].copy_from_slice(&rows[start * d..end * d]);
    block
}

/// A host array of i32 as values.
fn i32s(array: &HostArray) -> Vec<i32> {
    array.bytes().chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histc_counts_as_torch_does() {
        // torch.histc(torch.tensor([0., 1., 2., 3., 4.]), bins=4) == [1, 1, 1, 2]
        assert_eq!(histc(&[0.0, 1.0, 2.0, 3.0, 4.0], 4), (0.0, 4.0, vec![1, 1, 1, 2]));
        // One value: the range is widened by one each side, the value in the middle bin.
        assert_eq!(histc(&[2.0, 2.0], 4), (2.0, 2.0, vec![0, 0, 2, 0]));
        assert_eq!(histc(&[], 3), (0.0, 0.0, vec![0, 0, 0]));
    }

    #[test]
    fn the_alignment_is_the_largest_entries_and_their_share_of_l1() {
        let mut out = ColumnEffects::default();
        alignment(&mut out, &[0.5, -0.25, 0.25, 0.0, 0.0, 0.0], (2, 3), 2);
        let tensor = |name: &str| out.tensors.iter().find(|t| t.0 == name).map(|t| t.3.clone()).unwrap();
        let f32s =
            |b: Vec<u8>| b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<_>>();
        let i32s =
            |b: Vec<u8>| b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<_>>();
        // Ties go to the lower index; a zero row has zero shares.
        assert_eq!(i32s(tensor("alignment_ids")), vec![0, 2, 0, 1]);
        assert_eq!(f32s(tensor("alignment_values")), vec![0.5, 0.25, 0.0, 0.0]);
        assert_eq!(f32s(tensor("alignment_l1")), vec![0.5, 0.25, 0.0, 0.0]);
    }

    #[test]
    fn the_unembedding_is_folded_and_centred() {
        // vocab 2, d 2: rows [1, 2] and [3, 6], gain [2, 0.5]: [2, 1] and [6, 3], centred
        // per column over the two tokens.
        assert_eq!(folded_unembedding(&[1.0, 2.0, 3.0, 6.0], Some(&[2.0, 0.5]), 2, true), vec![-2.0, -1.0, 2.0, 1.0]);
        assert_eq!(folded_unembedding(&[1.0, 2.0, 3.0, 6.0], Some(&[2.0, 0.5]), 2, false), vec![2.0, 1.0, 6.0, 3.0]);
        assert_eq!(folded_unembedding(&[1.0, 2.0, 3.0, 6.0], None, 2, false), vec![1.0, 2.0, 3.0, 6.0]);
    }

    #[test]
    fn residual_basis_hooks_are_those_saedashboard_passes_unchanged() {
        for hook in [
            "blocks.3.hook_resid_post",
            "blocks.0.hook_mlp_out",
            "blocks.2.ln2.hook_normalized",
            "blocks.1.mlp.hook_in",
        ] {
            assert!(writes_residual_basis(hook), "{hook}");
        }
        for hook in [
            "blocks.3.attn.hook_z",
            "blocks.1.mlp.hook_post",
            "blocks.1.ln1_post.hook_normalized",
            "blocks.0.mlp.hook_pre",
        ] {
            assert!(!writes_residual_basis(hook), "{hook}");
        }
    }
}
