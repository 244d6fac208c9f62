//! GGUF → Hugging Face: tensor names, config and the q/k row order, the way transformers
//! does it when it loads a checkpoint with `gguf_file=` (`modeling_gguf_pytorch_utils.py`
//! and `integrations/ggml.py`).
//!
//! llama.cpp's converter permutes the rows of `q_proj`/`k_proj` of llama models so that each
//! head's rotary pairs are interleaved (GPT-J style RoPE); transformers undoes that on load
//! (`_reverse_permute_weights`), and so does [`hf_row_of`]: siphon's forward uses HF's
//! half-split RoPE, so the weights must be in HF's order. Qwen2 GGUFs are not permuted.

use super::{GgufFile, GgufValue};
use crate::{HfConfig, ModelError};

/// The GGUF architectures siphon converts.
const SUPPORTED_ARCHS: &[&str] = &["llama", "qwen2"];

/// Hugging Face's name for a llama.cpp tensor name, or `None` for tensors the HF model
/// does not have (e.g. `rope_freqs.weight`, which transformers also drops).
pub fn hf_name(gguf_name: &str) -> Option<String> {
    let fixed = match gguf_name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let hf_module = match module {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf_module}.{kind}"))
}

/// How a tensor's rows are reordered on the way to HF layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOrder {
    /// Rows are kept as stored.
    Identity,
    /// Rows undo llama.cpp's RoPE permutation with this many heads (query heads for q,
    /// key/value heads for k).
    ReversePermute {
        /// Heads the rows are grouped into.
        n_heads: usize,
    },
}

/// The row order of `gguf_name` in a file of `arch` with the given head counts.
pub fn row_order(arch: &str, gguf_name: &str, n_heads: usize, n_kv_heads: usize) -> RowOrder {
    if arch != "llama" {
        return RowOrder::Identity;
    }
    // Biases of q/k (which llama never has) would be permuted the same way.
    if gguf_name.contains(".attn_q.") {
        RowOrder::ReversePermute { n_heads }
    } else if gguf_name.contains(".attn_k.") {
        RowOrder::ReversePermute { n_heads: n_kv_heads }
    } else {
        RowOrder::Identity
    }
}

/// The GGUF row that holds HF row `hf_row` of a tensor with `n_rows` rows.
///
/// llama.cpp's `permute` reshapes rows as [heads, 2, half] and swaps the last two axes, so
/// GGUF row `h*2*half + j*2 + p` holds HF row `h*2*half + p*half + j`; transformers' reverse
/// reshapes as [heads, half, 2] and swaps back. Here the same map is applied per row index.
pub fn hf_row_of(order: RowOrder, n_rows: usize, hf_row: usize) -> usize {
    match order {
        RowOrder::Identity => hf_row,
        RowOrder::ReversePermute { n_heads } => {
            let per_head = n_rows / n_heads;
            let half = per_head / 2;
            let (head, r) = (hf_row / per_head, hf_row % per_head);
            let (p, j) = (r / half, r % half);
            head * per_head + j * 2 + p
        }
    }
}

/// The architecture named by `general.architecture`, if siphon converts it.
pub fn architecture(file: &GgufFile) -> Result<String, ModelError> {
    let arch = file.get("general.architecture").and_then(GgufValue::as_str).ok_or_else(|| {
        ModelError::Corrupt {
            path: file.path().to_path_buf(),
            detail: "GGUF metadata lacks general.architecture".into(),
        }
    })?;
    if !SUPPORTED_ARCHS.contains(&arch) {
        return Err(ModelError::UnsupportedArch(format!(
            "GGUF architecture {arch:?} in {} (supported: {})",
            file.path().display(),
            SUPPORTED_ARCHS.join(", ")
        )));
    }
    Ok(arch.to_string())
}

/// The `config.json` equivalent of the file's `{arch}.*` metadata, as transformers maps it.
pub fn hf_config(file: &GgufFile) -> Result<HfConfig, ModelError> {
    let arch = architecture(file)?;
    let key = |k: &str| file.get(&format!("{arch}.{k}"));
    let int = |k: &str| -> Result<Option<usize>, ModelError> {
        match key(k) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| ModelError::Corrupt {
                path: file.path().to_path_buf(),
                detail: format!("GGUF metadata {arch}.{k} is {v:?}, expected an integer"),
            }),
        }
    };
    let float = |k: &str| key(k).and_then(GgufValue::as_f64);
    let token_id = |k: &str| {
        file.get(&format!("tokenizer.ggml.{k}"))
            .and_then(GgufValue::as_u64)
            .map(serde_json::Value::from)
    };
    // transformers takes vocab_size from the metadata when present, else from the
    // tokenizer's token list; the embedding table's row count is the final authority.
    let vocab_size = match int("vocab_size")? {
        Some(n) => Some(n),
        None => file
            .tensor("token_embd.weight")
            .map(|t| t.shape()[0])
            .or_else(|| file.get("tokenizer.ggml.tokens").and_then(GgufValue::as_array).map(<[_]>::len)),
    };
    let rope_scaling = match key("rope.scaling.type").and_then(GgufValue::as_str) {
        None | Some("none") => None,
        Some(kind) => Some(serde_json::json!({
            "type": kind,
            "factor": float("rope.scaling.factor").unwrap_or(1.0),
        })),
    };
    Ok(HfConfig {
        architectures: None,
        model_type: Some(arch.clone()),
        vocab_size,
        hidden_size: int("embedding_length")?,
        intermediate_size: int("feed_forward_length")?,
        num_hidden_layers: int("block_count")?,
        num_attention_heads: int("attention.head_count")?,
        num_key_value_heads: int("attention.head_count_kv")?,
        head_dim: match arch.as_str() {
            // transformers maps rope.dimension_count to head_dim for llama only.
            "llama" => int("rope.dimension_count")?,
            _ => None,
        },
        rms_norm_eps: float("attention.layer_norm_rms_epsilon"),
        rope_theta: float("rope.freq_base"),
        rope_scaling,
        rope_parameters: None,
        max_position_embeddings: int("context_length")?,
        // transformers ties the embeddings exactly when the file has no output.weight.
        tie_word_embeddings: Some(file.tensor("output.weight").is_none()),
        attention_bias: Some(file.tensor("blk.0.attn_q.bias").is_some()),
        hidden_act: Some("silu".into()),
        bos_token_id: token_id("bos_token_id"),
        eos_token_id: token_id("eos_token_id"),
        pad_token_id: token_id("padding_token_id"),
        torch_dtype: None,
        // llama.cpp writes a window only for the families that have one; a llama file that
        // carries one is refused like a llama config.json with a window.
        sliding_window: int("attention.sliding_window")?.map(serde_json::Value::from),
        ..HfConfig::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_like_transformers() {
        assert_eq!(hf_name("token_embd.weight").unwrap(), "model.embed_tokens.weight");
        assert_eq!(hf_name("blk.11.attn_q.weight").unwrap(), "model.layers.11.self_attn.q_proj.weight");
        assert_eq!(hf_name("blk.0.attn_k.bias").unwrap(), "model.layers.0.self_attn.k_proj.bias");
        assert_eq!(hf_name("blk.3.ffn_down.weight").unwrap(), "model.layers.3.mlp.down_proj.weight");
        assert_eq!(hf_name("blk.3.ffn_norm.weight").unwrap(), "model.layers.3.post_attention_layernorm.weight");
        assert_eq!(hf_name("output.weight").unwrap(), "lm_head.weight");
        assert_eq!(hf_name("rope_freqs.weight"), None);
        assert_eq!(hf_name("blk.x.attn_q.weight"), None);
    }

    #[test]
    fn reverse_permute_inverts_llama_cpp_permute() {
        // llama.cpp: w.reshape(heads, 2, half, ...).swapaxes(1, 2): GGUF row
        // h*2*half + j*2 + p holds HF row h*2*half + p*half + j.
        let (heads, half) = (3, 4);
        let n = heads * 2 * half;
        let mut gguf_rows = vec![usize::MAX; n];
        for h in 0..heads {
            for j in 0..half {
                for p in 0..2 {
                    gguf_rows[h * 2 * half + j * 2 + p] = h * 2 * half + p * half + j;
                }
            }
        }
        let order = RowOrder::ReversePermute { n_heads: heads };
        for hf_row in 0..n {
            assert_eq!(gguf_rows[hf_row_of(order, n, hf_row)], hf_row);
        }
        assert_eq!(hf_row_of(RowOrder::Identity, n, 5), 5);
        assert_eq!(row_order("llama", "blk.0.attn_k.weight", 8, 2), RowOrder::ReversePermute { n_heads: 2 });
        assert_eq!(row_order("qwen2", "blk.0.attn_k.weight", 8, 2), RowOrder::Identity);
        assert_eq!(row_order("llama", "blk.0.attn_v.weight", 8, 2), RowOrder::Identity);
    }
}
