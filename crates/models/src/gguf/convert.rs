//! GGUF → Hugging Face: tensor names, config and the q/k row order, the way transformers
//! does it when it loads a checkpoint with `gguf_file=` (`modeling_gguf_pytorch_utils.py`
//! and `integrations/ggml.py`).
//!
//! llama.cpp's converter permutes the rows of `q_proj`/`k_proj` of llama models so that each
//! head's rotary pairs are interleaved (GPT-J style RoPE); transformers undoes that on load
//! (`_reverse_permute_weights`), and so does [`hf_row_of`]: siphon's forward uses HF's
//! half-split RoPE, so the weights must be in HF's order. Qwen2 GGUFs are not permuted.

use super::{GgufFile, GgufValue};
use crate::error::ModelError;
use crate::hf_config::HfConfig;

/// The GGUF architectures siphon converts.
const SUPPORTED_ARCHS: &[&str] =
    &["llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "olmo2", "gpt2", "gptneox"];

/// How one GGUF tensor becomes one Hugging Face tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// Hugging Face's name.
    pub hf: String,
    /// How rows are reordered.
    pub order: RowOrder,
    /// Expert `e` of `n` when the GGUF tensor stacks a mixture's experts (`ffn_*_exps`):
    /// the HF tensor is the `e`-th of `n` equal row blocks.
    pub expert: Option<(usize, usize)>,
    /// The HF tensor is stored `[in, out]` (GPT-2's Conv1D), llama.cpp's `[out, in]`
    /// transposed.
    pub transpose: bool,
    /// llama.cpp stores Gemma's norm gains as `1 + w`; HF's are `w`.
    pub minus_one: bool,
}

/// Hugging Face's names for a tensor of a GGUF file of `arch` (several for a stacked
/// mixture's experts, one per expert), or none for tensors the HF model does not have (e.g.
/// `rope_freqs.weight`, which transformers also drops).
pub fn hf_names(arch: &str, gguf_name: &str, n_heads: usize, n_kv_heads: usize, n_experts: usize) -> Vec<Mapping> {
    let map = |hf: String| Mapping {
        order: row_order(arch, gguf_name, n_heads, n_kv_heads),
        expert: None,
        transpose: arch == "gpt2"
            && gguf_name.ends_with(".weight")
            && [".attn_qkv.", ".attn_output.", ".ffn_up.", ".ffn_down."].iter().any(|m| gguf_name.contains(m)),
        minus_one: matches!(arch, "gemma2" | "gemma3") && gguf_name.ends_with("norm.weight"),
        hf,
    };
    let (model, layers) = match arch {
        "gpt2" => ("transformer", "transformer.h"),
        "gptneox" => ("gpt_neox", "gpt_neox.layers"),
        _ => ("model", "model.layers"),
    };
    let fixed = match (arch, gguf_name) {
        ("gpt2", "token_embd.weight") => Some("transformer.wte.weight".to_string()),
        ("gpt2", "position_embd.weight") => Some("transformer.wpe.weight".to_string()),
        ("gpt2", "output_norm.weight" | "output_norm.bias") => {
            Some(gguf_name.replace("output_norm", "transformer.ln_f"))
        }
        ("gptneox", "token_embd.weight") => Some("gpt_neox.embed_in.weight".to_string()),
        ("gptneox", "output_norm.weight" | "output_norm.bias") => {
            Some(gguf_name.replace("output_norm", "gpt_neox.final_layer_norm"))
        }
        ("gptneox", "output.weight") => Some("embed_out.weight".to_string()),
        (_, "token_embd.weight") => Some(format!("{model}.embed_tokens.weight")),
        (_, "output_norm.weight") => Some(format!("{model}.norm.weight")),
        (_, "output.weight") => Some("lm_head.weight".to_string()),
        _ => None,
    };
    if let Some(name) = fixed {
        return vec![map(name)];
    }
    let Some(rest) = gguf_name.strip_prefix("blk.") else { return Vec::new() };
    let Some((layer, rest)) = rest.split_once('.') else { return Vec::new() };
    let Ok(layer) = layer.parse::<usize>() else { return Vec::new() };
    let Some((module, kind)) = rest.rsplit_once('.') else { return Vec::new() };
    if kind != "weight" && kind != "bias" {
        return Vec::new();
    }
    // A llama file with experts is a Mixtral (llama.cpp converts Mixtral as llama).
    let mixtral = arch == "llama" && n_experts > 0;
    if let Some(proj) = module.strip_prefix("ffn_").and_then(|m| m.strip_suffix("_exps")) {
        let proj = match (mixtral, proj) {
            (false, "gate") => "mlp.experts.{e}.gate_proj",
            (false, "up") => "mlp.experts.{e}.up_proj",
            (false, "down") => "mlp.experts.{e}.down_proj",
            (true, "gate") => "block_sparse_moe.experts.{e}.w1",
            (true, "up") => "block_sparse_moe.experts.{e}.w3",
            (true, "down") => "block_sparse_moe.experts.{e}.w2",
            _ => return Vec::new(),
        };
        return (0..n_experts)
            .map(|e| Mapping {
                expert: Some((e, n_experts)),
                ..map(format!("{layers}.{layer}.{}.{kind}", proj.replace("{e}", &e.to_string())))
            })
            .collect();
    }
    if mixtral && module == "ffn_gate_inp" {
        return vec![map(format!("{layers}.{layer}.block_sparse_moe.gate.{kind}"))];
    }
    let hf_module = match (arch, module) {
        ("gpt2", "attn_norm") => "ln_1",
        ("gpt2", "attn_qkv") => "attn.c_attn",
        ("gpt2", "attn_output") => "attn.c_proj",
        ("gpt2", "ffn_norm") => "ln_2",
        ("gpt2", "ffn_up") => "mlp.c_fc",
        ("gpt2", "ffn_down") => "mlp.c_proj",
        ("gptneox", "attn_qkv") => "attention.query_key_value",
        ("gptneox", "attn_output") => "attention.dense",
        ("gptneox", "ffn_up") => "mlp.dense_h_to_4h",
        ("gptneox", "ffn_down") => "mlp.dense_4h_to_h",
        ("phi3", "attn_qkv") => "self_attn.qkv_proj",
        ("phi3", "ffn_up") => "mlp.gate_up_proj",
        ("gemma2" | "gemma3", "ffn_norm") => "pre_feedforward_layernorm",
        ("gemma2" | "gemma3" | "olmo2", "post_attention_norm") => "post_attention_layernorm",
        ("gemma2" | "gemma3" | "olmo2", "post_ffw_norm") => "post_feedforward_layernorm",
        (_, "attn_norm") => "input_layernorm",
        (_, "attn_q") => "self_attn.q_proj",
        (_, "attn_k") => "self_attn.k_proj",
        (_, "attn_v") => "self_attn.v_proj",
        (_, "attn_q_norm") => "self_attn.q_norm",
        (_, "attn_k_norm") => "self_attn.k_norm",
        (_, "attn_output") => "self_attn.o_proj",
        (_, "ffn_norm") => "post_attention_layernorm",
        (_, "ffn_gate_inp") => "mlp.gate",
        (_, "ffn_gate") => "mlp.gate_proj",
        (_, "ffn_up") => "mlp.up_proj",
        (_, "ffn_down") => "mlp.down_proj",
        _ => return Vec::new(),
    };
    vec![map(format!("{layers}.{layer}.{hf_module}.{kind}"))]
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
    /// GPT-NeoX's fused qkv: llama.cpp stores the rows `[3, heads, d]` (q of every head, then
    /// k, then v), Hugging Face `[heads, 3, d]`.
    PerHeadQkv {
        /// Heads.
        n_heads: usize,
    },
}

/// The row order of `gguf_name` in a file of `arch` with the given head counts.
pub fn row_order(arch: &str, gguf_name: &str, n_heads: usize, n_kv_heads: usize) -> RowOrder {
    if arch == "gptneox" && gguf_name.contains(".attn_qkv.") {
        return RowOrder::PerHeadQkv { n_heads };
    }
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
        RowOrder::PerHeadQkv { n_heads } => {
            let d = n_rows / n_heads / 3;
            let (head, r) = (hf_row / (3 * d), hf_row % (3 * d));
            let (part, i) = (r / d, r % d);
            part * n_heads * d + head * d + i
        }
    }
}

/// The architecture named by `general.architecture`, if siphon converts it.
pub fn architecture(file: &GgufFile) -> Result<String, ModelError> {
    let arch = file.get("general.architecture").and_then(GgufValue::as_str).ok_or_else(|| ModelError::Corrupt {
        path: file.path().to_path_buf(),
        detail: "GGUF metadata lacks general.architecture".into(),
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
    let int = |k: &str| metadata(file, &arch, k, "an integer", |v| v.as_u64().map(|n| n as usize));
    // A float goes into JSON, which has no NaN or infinity.
    let float = |k: &str| metadata(file, &arch, k, "a finite number", |v| v.as_f64().filter(|x| x.is_finite()));
    let flag = |k: &str| metadata(file, &arch, k, "a boolean", GgufValue::as_bool);
    let token_id =
        |k: &str| file.get(&format!("tokenizer.ggml.{k}")).and_then(GgufValue::as_u64).map(serde_json::Value::from);
    // transformers takes vocab_size from the metadata when present, else from the
    // tokenizer's token list; the embedding table's row count is the final authority.
    let vocab_size = match int("vocab_size")? {
        Some(n) => Some(n),
        None => file
            .tensor("token_embd.weight")
            .map(|t| t.shape()[0])
            .or_else(|| file.get("tokenizer.ggml.tokens").and_then(GgufValue::as_array).map(<[_]>::len)),
    };
    let rope_scaling = match metadata(file, &arch, "rope.scaling.type", "a string", GgufValue::as_str)? {
        None | Some("none") => None,
        Some(kind) => {
            let mut scaling = serde_json::json!({ "type": kind });
            if let Some(factor) = float("rope.scaling.factor")? {
                scaling["factor"] = factor.into();
            }
            Some(scaling)
        }
    };
    if arch == "phi3" && file.tensor("rope_factors_long.weight").is_some() {
        return Err(ModelError::UnsupportedArch(format!(
            "{}: a phi3 GGUF with LongRoPE factors (rope_factors_long/short): use the Hugging Face checkpoint",
            file.path().display()
        )));
    }
    if arch == "olmo2" && key("attention.sliding_window").is_some() {
        // llama.cpp writes OLMo 3 as olmo2 with a window; which layers slide and each kind's
        // RoPE are llama.cpp's conventions, not the file's, so siphon does not guess them.
        return Err(ModelError::UnsupportedArch(format!(
            "{}: an olmo2 GGUF with a sliding window (llama.cpp's form of OLMo 3): use the Hugging Face checkpoint",
            file.path().display()
        )));
    }
    let hidden = int("embedding_length")?;
    let heads = int("attention.head_count")?;
    let layers = int("block_count")?;
    let head_dim = match arch.as_str() {
        // transformers maps rope.dimension_count to head_dim for llama only; the families
        // whose head_dim is not hidden / heads record attention.key_length.
        "llama" => int("rope.dimension_count")?,
        "qwen3" | "qwen3moe" | "gemma2" | "gemma3" | "olmo2" => int("attention.key_length")?,
        _ => None,
    };
    // Partial rotary (GPT-NeoX, Phi-3): rope.dimension_count of each head.
    let rotary_fraction = match (arch.as_str(), int("rope.dimension_count")?, hidden.zip(heads)) {
        ("gptneox" | "phi3", Some(rotary), Some((h, n))) if n > 0 => Some(rotary as f64 / (h / n) as f64),
        _ => None,
    };
    let mut config = HfConfig {
        architectures: None,
        model_type: Some(match arch.as_str() {
            "qwen3moe" => "qwen3_moe".into(),
            "gptneox" => "gpt_neox".into(),
            "gemma3" => "gemma3_text".into(),
            "llama" if key("expert_count").is_some() => "mixtral".into(),
            _ => arch.clone(),
        }),
        vocab_size,
        hidden_size: hidden,
        intermediate_size: int("feed_forward_length")?,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: int("attention.head_count_kv")?,
        head_dim,
        rms_norm_eps: float("attention.layer_norm_rms_epsilon")?,
        rope_theta: float("rope.freq_base")?,
        rope_scaling,
        rope_parameters: None,
        max_position_embeddings: int("context_length")?,
        // transformers ties the embeddings exactly when the file has no output.weight.
        tie_word_embeddings: Some(file.tensor("output.weight").is_none()),
        attention_bias: Some(file.tensor("blk.0.attn_q.bias").or(file.tensor("blk.0.attn_qkv.bias")).is_some()),
        hidden_act: Some(if arch == "gptneox" { "gelu" } else { "silu" }.into()),
        bos_token_id: token_id("bos_token_id"),
        eos_token_id: token_id("eos_token_id"),
        pad_token_id: token_id("padding_token_id"),
        torch_dtype: None,
        // llama.cpp writes a window only for the families that have one; a llama file that
        // carries one is refused like a llama config.json with a window.
        sliding_window: int("attention.sliding_window")?.map(serde_json::Value::from),
        partial_rotary_factor: rotary_fraction,
        ..HfConfig::default()
    };
    // Keys only one family reads go where config.json's unknown keys go.
    let mut set = |k: &str, v: Option<serde_json::Value>| {
        if let Some(v) = v {
            config.extra.insert(k.to_string(), v);
        }
    };
    match arch.as_str() {
        "gpt2" | "gptneox" => {
            let eps = float("attention.layer_norm_epsilon")?.map(serde_json::Value::from);
            set("layer_norm_epsilon", eps.clone());
            set("layer_norm_eps", eps);
            set("n_inner", int("feed_forward_length")?.map(serde_json::Value::from));
            set("use_parallel_residual", flag("use_parallel_residual")?.map(serde_json::Value::from));
        }
        "qwen3moe" => {
            set("moe_intermediate_size", int("expert_feed_forward_length")?.map(serde_json::Value::from));
            config.num_experts = int("expert_count")?;
            config.num_experts_per_tok = int("expert_used_count")?;
            // llama.cpp renormalises Qwen3-MoE's top-k weights unless the file says otherwise,
            // as the released checkpoints' configs do (norm_topk_prob true); transformers' GGUF
            // loader leaves Qwen3MoeConfig's default (false), which changes every MoE output.
            config.norm_topk_prob = Some(flag("expert_weights_norm")?.unwrap_or(true));
        }
        "gemma2" | "gemma3" => {
            // Absent: each config's default (Gemma 2 caps at 50, Gemma 3 not at all), as llama.cpp.
            set("attn_logit_softcapping", float("attn_logit_softcapping")?.map(serde_json::Value::from));
            // The file does not record query_pre_attn_scalar; llama.cpp scales by head_dim,
            // except for the 27B models (Gemma 2: 46 layers, Gemma 3: 62), which use
            // hidden / heads — as their configs do.
            let big = if arch == "gemma2" { 46 } else { 62 };
            let scalar = match (layers, hidden, heads, head_dim) {
                (Some(l), Some(h), Some(n), _) if l == big && n > 0 => Some((h / n) as f64),
                (_, _, _, Some(d)) => Some(d as f64),
                _ => None,
            };
            set("query_pre_attn_scalar", scalar.map(serde_json::Value::from));
        }
        "llama" if key("expert_count").is_some() => {
            config.num_local_experts = int("expert_count")?;
            config.num_experts_per_tok = int("expert_used_count")?;
        }
        _ => {}
    }
    Ok(config)
}

/// The metadata value `{arch}.{k}` as `read` reads it: absent, or `what` (a value of another
/// type is refused, naming the key, rather than taken as absent).
fn metadata<'f, T>(
    file: &'f GgufFile,
    arch: &str,
    k: &str,
    what: &str,
    read: impl Fn(&'f GgufValue) -> Option<T>,
) -> Result<Option<T>, ModelError> {
    match file.get(&format!("{arch}.{k}")) {
        None => Ok(None),
        Some(v) => read(v).map(Some).ok_or_else(|| ModelError::Corrupt {
            path: file.path().to_path_buf(),
            detail: format!("GGUF metadata {arch}.{k} is {v:?}, expected {what}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_like_transformers() {
        let hf_name = |arch: &str, name: &str| {
            hf_names(arch, name, 4, 2, 3).into_iter().map(|m| m.hf).collect::<Vec<_>>().join(" ")
        };
        assert_eq!(hf_name("llama", "token_embd.weight"), "model.embed_tokens.weight");
        assert_eq!(hf_name("llama", "blk.11.attn_q.weight"), "model.layers.11.self_attn.q_proj.weight");
        assert_eq!(hf_name("qwen2", "blk.0.attn_k.bias"), "model.layers.0.self_attn.k_proj.bias");
        assert_eq!(hf_name("llama", "blk.3.ffn_down.weight"), "model.layers.3.mlp.down_proj.weight");
        assert_eq!(hf_name("llama", "blk.3.ffn_norm.weight"), "model.layers.3.post_attention_layernorm.weight");
        assert_eq!(hf_name("llama", "output.weight"), "lm_head.weight");
        assert_eq!(hf_name("llama", "rope_freqs.weight"), "");
        assert_eq!(hf_name("llama", "blk.x.attn_q.weight"), "");
        // Per family: Gemma's feed-forward norms, GPT-2's and GPT-NeoX's own names, a
        // mixture's stacked experts (one HF tensor per expert).
        assert_eq!(hf_name("gemma2", "blk.1.ffn_norm.weight"), "model.layers.1.pre_feedforward_layernorm.weight");
        assert_eq!(hf_name("gpt2", "blk.0.attn_qkv.bias"), "transformer.h.0.attn.c_attn.bias");
        assert_eq!(hf_name("gptneox", "output.weight"), "embed_out.weight");
        assert_eq!(
            hf_name("qwen3moe", "blk.2.ffn_up_exps.weight"),
            "model.layers.2.mlp.experts.0.up_proj.weight model.layers.2.mlp.experts.1.up_proj.weight model.layers.2.mlp.experts.2.up_proj.weight"
        );
        let gpt2 = hf_names("gpt2", "blk.0.ffn_up.weight", 4, 4, 0);
        assert!(gpt2[0].transpose && !hf_names("gpt2", "blk.0.ffn_up.bias", 4, 4, 0)[0].transpose);
        assert!(hf_names("gemma2", "blk.0.post_ffw_norm.weight", 4, 4, 0)[0].minus_one);
    }

    #[test]
    fn per_head_qkv_undoes_llama_cpp_regrouping() {
        // llama.cpp: rows [heads, 3, d] -> [3, heads, d].
        let (heads, d) = (2, 3);
        let n = 3 * heads * d;
        for hf_row in 0..n {
            let (h, part, i) = (hf_row / (3 * d), hf_row % (3 * d) / d, hf_row % d);
            assert_eq!(hf_row_of(RowOrder::PerHeadQkv { n_heads: heads }, n, hf_row), part * heads * d + h * d + i);
        }
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
