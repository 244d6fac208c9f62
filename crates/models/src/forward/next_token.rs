//! The model's next-token outputs ([`NextToken`]) from the final norm's output `h`
//! `[tokens, hidden]`: the logits a chunk of sequence positions at a time — every row's
//! positions `i·c .. (i+1)·c` through the unembedding `[vocab, hidden]` (`lm_head`, the
//! embedding when tied), the family's final soft-cap in the compute dtype as transformers
//! applies it — then, in f32, the log-softmax and what each output reads from it. A chunk's
//! logits `[batch, c, vocab]` are split as the rows and the unembedding's vocabulary are; the
//! whole `[tokens, vocab]` never exists.

use siphon_hlo::{Builder, CompareDir, DType, TensorType, Value};
use siphon_mesh::{Mesh, PartitionSpec};

use crate::config::ModelConfig;
use crate::contract::{NextToken, NextTokenInfo};
use crate::error::ModelError;

/// What the outputs read: the request, the final norm's output `[tokens, hidden]`, the
/// unembedding and how it is split, each token's next token `[batch, seq]` (for the NLL).
pub(crate) struct Request<'a> {
    pub outputs: NextToken,
    pub config: &'a ModelConfig,
    pub rows: [usize; 2],
    pub dtype: DType,
    pub mesh: &'a Mesh,
    pub sharded: bool,
    pub input_spec: &'a PartitionSpec,
    pub hidden: Value,
    pub unembedding: Value,
    pub unembedding_spec: Option<&'a PartitionSpec>,
    pub next_ids: Option<Value>,
    /// The spliced and ablated streams' final norms' outputs (`super::splice`), each with the
    /// names of its NLL and its KL divergence from the clean stream, which follow the
    /// outputs' results in this order.
    pub variants: Vec<([String; 2], Value)>,
    /// Values of each token `[tokens]` f32 computed beside the outputs (a splice's squared
    /// error), by name, after every other result.
    pub per_token: Vec<(String, Value)>,
}

/// Checks a request before anything is built: something asked for, a top-k within the
/// vocabulary, a chunk of at least one position.
pub(crate) fn check(outputs: &NextToken, config: &ModelConfig) -> Result<(), ModelError> {
    if outputs.names().is_empty() {
        return Err(ModelError::Config("the next-token outputs ask for nothing (nll, entropy or topk)".into()));
    }
    if outputs.topk > config.vocab_size {
        return Err(ModelError::Config(format!(
            "topk {} is more than the vocabulary's {} tokens",
            outputs.topk, config.vocab_size
        )));
    }
    if outputs.chunk == Some(0) {
        return Err(ModelError::Config("a logits chunk of 0 positions".into()));
    }
    Ok(())
}

/// The outputs' results, in [`NextToken::names`]' order.
pub(crate) struct Results {
    /// Each result with its split (`None` on one device).
    pub values: Vec<(Value, Option<PartitionSpec>)>,
    /// What each result is.
    pub infos: Vec<NextTokenInfo>,
}

/// The outputs' results and their descriptions.
pub(crate) fn results(b: &mut Builder, r: Request<'_>) -> Result<Results, ModelError> {
    let [bsz, s] = r.rows;
    if r.outputs.nll && r.next_ids.is_none() {
        return Err(ModelError::Config("output.nll needs each token's next token (next_ids)".into()));
    }
    let (hidden, vocab) = (r.config.hidden_size, r.config.vocab_size);
    let row_axes = r.input_spec.dims().first().cloned().unwrap_or_default();
    // The vocabulary's split, where it does not reuse an axis the rows are split over.
    let vocab_axes: Vec<String> = r
        .unembedding_spec
        .and_then(|spec| spec.dims().first().cloned())
        .filter(|axes| !axes.iter().any(|a| row_axes.contains(a)))
        .unwrap_or_default();
    let vocab_ways: usize = vocab_axes.iter().map(|a| r.mesh.axis_size(a).unwrap_or(1)).product();
    let rows_per_group = bsz / r.input_spec.ways(0, r.mesh).max(1);
    let c = r.outputs.chunk_for(s, rows_per_group, vocab, vocab_ways);
    let n = s.div_ceil(c);
    let padded = n * c;
    let k = r.outputs.topk;

    let pad = |b: &mut Builder, hidden_state: Value| -> Result<Value, siphon_hlo::HloError> {
        let h = b.reshape(hidden_state, &[bsz, s, hidden])?;
        if padded == s {
            return Ok(h);
        }
        let zeros = b.splat(0.0, TensorType::new(r.dtype, &[bsz, padded - s, hidden]))?;
        b.concatenate(&[h, zeros], 1)
    };
    let h = pad(b, r.hidden)?;
    let variant_states = r.variants.iter().map(|(_, v)| pad(b, *v)).collect::<Result<Vec<_>, _>>()?;
    let mut next = r.next_ids;
    if padded > s
        && let Some(ids) = next
    {
        let none = b.splat(-1.0, TensorType::new(DType::I32, &[bsz, padded - s]))?;
        next = Some(b.concatenate(&[ids, none], 1)?);
    }
    let f32_ty = |dims: &[usize]| TensorType::new(DType::F32, dims);
    let mut state = vec![b.scalar(0.0, DType::I32)?, h, r.unembedding];
    state.extend(next);
    let first_variant = state.len();
    state.extend(&variant_states);
    let first_out = state.len();
    if r.outputs.nll {
        state.push(b.splat(0.0, f32_ty(&[bsz, padded]))?);
    }
    if r.outputs.entropy {
        state.push(b.splat(0.0, f32_ty(&[bsz, padded]))?);
    }
    if k > 0 {
        state.push(b.splat(0.0, f32_ty(&[bsz, padded, k]))?);
        state.push(b.splat(0.0, TensorType::new(DType::I32, &[bsz, padded, k]))?);
    }
    for _ in &r.variants {
        state.push(b.splat(0.0, f32_ty(&[bsz, padded]))?);
        state.push(b.splat(0.0, f32_ty(&[bsz, padded]))?);
    }
    let variants = r.variants.len();
    let logits_spec = r.sharded.then(|| {
        let rows: Vec<&str> = row_axes.iter().map(String::as_str).collect();
        let vocab: Vec<&str> = vocab_axes.iter().map(String::as_str).collect();
        PartitionSpec::new(&[&rows, &[], &vocab])
    });
    let (outputs, softcap) = (r.outputs, r.config.final_softcap);
    let looped = b.while_loop(
        &state,
        |b, st| {
            let end = b.scalar(n as f64, DType::I32)?;
            b.compare(CompareDir::Lt, st[0], end)
        },
        |b, st| {
            let (i, w) = (st[0], st[2]);
            let zero = b.scalar(0.0, DType::I32)?;
            let width = b.scalar(c as f64, DType::I32)?;
            let start = b.mul(i, width)?;
            let full = [bsz, c, vocab];
            // The chunk of hidden state `h`'s logits less each position's largest, `z`
            // `[bsz, c, vocab]` f32, `e = exp(z)`, and per position `Σe` and `lse = log Σe`: the
            // log-probabilities are `z − lse`, never materialized (each output reads `z` or `e`).
            let distribution = |b: &mut Builder, h: Value| -> Result<[Value; 4], siphon_hlo::HloError> {
                let hc = b.dynamic_slice(h, &[zero, start, zero], &[bsz, c, hidden])?;
                let mut logits = b.matmul_t(hc, w)?;
                if let Some(cap) = softcap {
                    logits = crate::layers::attention::soft_cap(b, logits, cap)?;
                }
                let mut logits = b.convert(logits, DType::F32)?;
                if let Some(spec) = &logits_spec {
                    logits = b.sharding_constraint(logits, spec)?;
                }
                let max = b.reduce_max(logits, &[2])?;
                let max = b.broadcast_in_dim(max, &full, &[0, 1])?;
                let z = b.sub(logits, max)?;
                let e = b.exp(z)?;
                let sum = b.reduce_sum(e, &[2])?;
                let lse = b.log(sum)?;
                Ok([z, e, sum, lse])
            };
            // −log p of each position's next token (`ids` `[bsz, c]`), `lse − z[next]`; NaN
            // where it has none.
            let nll_of = |b: &mut Builder, z: Value, lse: Value, ids: Value| -> Result<Value, siphon_hlo::HloError> {
                let vocab_ids = b.iota(TensorType::new(DType::I32, &full), 2)?;
                let wanted = b.broadcast_in_dim(ids, &full, &[0, 1])?;
                let hit = b.compare(CompareDir::Eq, vocab_ids, wanted)?;
                let zeros = b.splat(0.0, f32_ty(&full))?;
                let picked = b.select(hit, z, zeros)?;
                let picked = b.reduce_sum(picked, &[2])?;
                let nll = b.sub(lse, picked)?;
                let none = b.splat(-1.0, TensorType::new(DType::I32, &[bsz, c]))?;
                let has = b.compare(CompareDir::Gt, ids, none)?;
                let nan = b.splat(f64::NAN, f32_ty(&[bsz, c]))?;
                b.select(has, nll, nan)
            };
            // `Σ p·x` over the vocabulary for `p = e / Σe`.
            let expect = |b: &mut Builder, e: Value, sum: Value, x: Value| -> Result<Value, siphon_hlo::HloError> {
                let ex = b.mul(e, x)?;
                let total = b.reduce_sum(ex, &[2])?;
                b.div(total, sum)
            };
            let [z, e, sum, lse] = distribution(b, st[1])?;
            let mut next_state = st.to_vec();
            let one = b.scalar(1.0, DType::I32)?;
            next_state[0] = b.add(i, one)?;
            let mut slot = first_out;
            let mut write = |b: &mut Builder, slot: &mut usize, value: Value| -> Result<(), siphon_hlo::HloError> {
                let rank = b.dims(value)?.len();
                let starts: Vec<Value> = [zero, start].into_iter().chain(std::iter::repeat_n(zero, rank - 2)).collect();
                next_state[*slot] = b.dynamic_update_slice(next_state[*slot], value, &starts)?;
                *slot += 1;
                Ok(())
            };
            let ids = match outputs.nll {
                true => Some(b.dynamic_slice(st[3], &[zero, start], &[bsz, c])?),
                false => None,
            };
            if let Some(ids) = ids {
                let nll = nll_of(b, z, lse, ids)?;
                write(b, &mut slot, nll)?;
            }
            if outputs.entropy {
                // H = −Σ p (z − lse) = lse − Σ p z.
                let mean_z = expect(b, e, sum, z)?;
                let entropy = b.sub(lse, mean_z)?;
                write(b, &mut slot, entropy)?;
            }
            if k > 0 {
                // The k largest of z are the k largest log-probabilities, less lse.
                let (values, ids) = b.top_k(z, k)?;
                let lse_k = b.broadcast_in_dim(lse, &[bsz, c, k], &[0, 1])?;
                let values = b.sub(values, lse_k)?;
                write(b, &mut slot, values)?;
                write(b, &mut slot, ids)?;
            }
            // Each replayed stream: its NLL and KL(clean ‖ it) = Σ p (z − z') − lse + lse'.
            for v in 0..variants {
                let [z_other, _, _, lse_other] = distribution(b, st[first_variant + v])?;
                let ids = ids.expect("a splice asks for the NLL (splice::check)");
                let nll = nll_of(b, z_other, lse_other, ids)?;
                write(b, &mut slot, nll)?;
                let gap = b.sub(z, z_other)?;
                let mean_gap = expect(b, e, sum, gap)?;
                let lse_gap = b.sub(lse_other, lse)?;
                let kl = b.add(mean_gap, lse_gap)?;
                write(b, &mut slot, kl)?;
            }
            Ok(next_state)
        },
    )?;
    let mut values = Vec::new();
    let mut infos = Vec::new();
    let variant_names = r.variants.iter().flat_map(|(names, _)| names.iter().cloned());
    let names = outputs.names().into_iter().map(str::to_string).chain(variant_names);
    for (name, &out) in names.zip(&looped[first_out..]) {
        let dims = b.dims(out)?.to_vec();
        let value = b.slice_dim(out, 1, 0, s)?;
        let shape: Vec<usize> = [bsz, s].into_iter().chain(dims[2..].iter().copied()).collect();
        let mut split = r.input_spec.dims()[..2].to_vec();
        split.resize(shape.len(), Vec::new());
        let spec = PartitionSpec::from_dims(split);
        let dtype = if name == "output.topk_ids" { DType::I32 } else { DType::F32 };
        let name = name.to_string();
        values.push((value, r.sharded.then(|| spec.clone())));
        infos.push(NextTokenInfo { name, shape, dtype, spec });
    }
    for (name, value) in r.per_token {
        let value = b.reshape(value, &[bsz, s])?;
        let spec = PartitionSpec::from_dims(r.input_spec.dims()[..2].to_vec());
        values.push((value, r.sharded.then(|| spec.clone())));
        infos.push(NextTokenInfo { name, shape: vec![bsz, s], dtype: DType::F32, spec });
    }
    Ok(Results { values, infos })
}

#[cfg(test)]
mod tests {
    use siphon_mesh::Mesh;

    use super::*;
    use crate::contract::ForwardSpec;
    use crate::forward::build_forward;
    use crate::hooks::{HookKind, HookPoint};

    fn tiny(tied: bool) -> ModelConfig {
        ModelConfig {
            arch: crate::llama::ARCH,
            vocab_size: 32,
            hidden_size: 16,
            intermediate_size: 24,
            n_layers: 2,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 128,
            tie_word_embeddings: tied,
            attention: crate::config::Attention { n_heads: 4, n_kv_heads: 2, head_dim: 4, ..Default::default() },
            rope: crate::config::Rope { theta: 10000.0, ..Default::default() },
            ..ModelConfig::default()
        }
    }

    fn all(chunk: Option<usize>) -> NextToken {
        NextToken { nll: true, entropy: true, topk: 3, chunk }
    }

    #[test]
    fn the_outputs_read_every_block_the_final_norm_and_the_unembedding() {
        let hooks = vec![HookPoint::block(0, HookKind::ResidPost)];
        let spec = ForwardSpec { next_token: Some(all(Some(2))), ..ForwardSpec::new(2, 5, hooks.clone()) };
        let p = build_forward(&tiny(false), &spec).unwrap();
        assert_eq!(p.n_blocks, 2);
        let names: Vec<&str> = p.params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names[names.len() - 2..], ["model.norm.weight", "lm_head.weight"]);
        let inputs: Vec<&str> = p.inputs.iter().map(|i| i.name).collect();
        assert_eq!(inputs, ["input_ids", "attention_mask", "position_ids", "next_ids"]);
        let results: Vec<(&str, Vec<usize>, DType)> =
            p.next_token.iter().map(|o| (o.name.as_str(), o.shape.clone(), o.dtype)).collect();
        assert_eq!(
            results,
            [
                ("output.nll", vec![2, 5], DType::F32),
                ("output.entropy", vec![2, 5], DType::F32),
                ("output.topk_logprobs", vec![2, 5, 3], DType::F32),
                ("output.topk_ids", vec![2, 5, 3], DType::I32),
            ]
        );
        // Chunks of 2 positions (of 5, padded to 6) in a loop: [2, 2, 32] logits, never [2, 5, 32].
        assert!(p.text.contains("stablehlo.while") && p.text.contains("tensor<2x2x32xf32>"));
        assert!(!p.text.contains("tensor<2x5x32xf32>") && !p.text.contains("tensor<10x32xf32>"));
        // Tied: the embedding is the unembedding, and nothing else is added; without the
        // NLL, no next_ids.
        let spec = ForwardSpec {
            next_token: Some(NextToken { entropy: true, ..NextToken::default() }),
            ..ForwardSpec::new(2, 5, hooks.clone())
        };
        let p = build_forward(&tiny(true), &spec).unwrap();
        assert!(!p.params.iter().any(|p| p.name == "lm_head.weight"));
        assert_eq!(p.inputs.len(), 3);
        // Without outputs, the program is what it was: no final norm, no loop.
        let p = build_forward(&tiny(false), &ForwardSpec::new(2, 5, hooks)).unwrap();
        assert!(!p.text.contains("stablehlo.while") && p.next_token.is_empty() && p.n_blocks == 1);
    }

    #[test]
    fn a_mesh_splits_each_chunks_vocabulary_as_the_unembedding() {
        let c = tiny(false);
        let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
        let spec =
            ForwardSpec { next_token: Some(all(None)), ..ForwardSpec::new(4, 6, vec![]) }.with_megatron_plan(&c, mesh);
        let p = build_forward(&c, &spec).unwrap();
        let constraints: Vec<&str> =
            p.text.lines().filter(|l| l.contains("x32xf32") && l.contains("sharding_constraint")).collect();
        assert!(p.text.contains(r#"[{"data"}, {}, {"model"}]"#), "the logits' constraint: {constraints:?}");
        // The default chunk holds all 6 positions of a tiny vocabulary.
        assert!(p.text.contains("tensor<4x6x32xf32>"));
        assert_eq!(p.next_token[0].spec, PartitionSpec::new(&[&["data"], &[]]));
    }

    #[test]
    fn a_request_for_nothing_or_past_the_vocabulary_is_refused() {
        let c = tiny(true);
        let build = |outputs: NextToken| {
            let spec = ForwardSpec { next_token: Some(outputs), ..ForwardSpec::new(1, 4, vec![]) };
            build_forward(&c, &spec).unwrap_err().to_string()
        };
        assert!(build(NextToken::default()).contains("ask for nothing"));
        assert!(
            build(NextToken { topk: 33, ..NextToken::default() }).contains("topk 33 is more than the vocabulary's 32")
        );
        assert!(build(NextToken { nll: true, chunk: Some(0), ..NextToken::default() }).contains("chunk of 0"));
    }

    #[test]
    fn a_chunk_holds_at_most_its_share_of_logits() {
        let outputs = NextToken { nll: true, ..NextToken::default() };
        // 262,144 tokens of vocabulary, 4 rows a data group, split 4 ways: 64 positions.
        assert_eq!(outputs.chunk_for(1024, 4, 262_144, 4), 64);
        assert_eq!(outputs.chunk_for(1024, 32, 262_144, 1), 2);
        assert_eq!(outputs.chunk_for(1024, 1024, 262_144, 1), 1, "at least one position");
        assert_eq!(outputs.chunk_for(8, 1, 256, 1), 8, "at most the row");
        assert_eq!(NextToken { chunk: Some(3), ..outputs }.chunk_for(8, 1, 256, 1), 3);
        // 42 positions fit (2^24 over 8 rows of 49,152): 128 go as 4 chunks of 32, no padding.
        assert_eq!(outputs.chunk_for(128, 8, 49_152, 1), 32);
        assert_eq!(outputs.chunk_for(130, 8, 49_152, 1), 33, "4 chunks, the last one position short");
    }
}
