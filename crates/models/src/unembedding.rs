//! The end of a model as a direction in the residual stream reaches the logits, in
//! TransformerLens's convention (`fold_ln`, `center_unembed`, the defaults of
//! `HookedTransformer.from_pretrained` that SAEDashboard's logit tables read): the final norm's
//! gain folded into the unembedding, `W_U[:, v] = g ⊙ unembed[v]`, each row of `W_U` then
//! centred over the vocabulary — each step where the family's [`crate::arch::FinalNorm`] says
//! TransformerLens takes it. `g` is the norm's stored weight `w`, or `1 + w` where the family's
//! norm applies it so (Gemma, Qwen3-Next); a LayerNorm's bias does not reach a direction's
//! logits.

use crate::arch::Gain;
use crate::config::{ModelConfig, ParamClass};
use crate::error::ModelError;

/// Where a model's logits come from (tensor names as the loaded `Weights` find them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unembedding {
    /// The final norm's gain `[hidden]`, where it is folded into the unembedding.
    pub norm: Option<String>,
    /// Whether the norm multiplies by `1 + w` rather than by its stored `w`.
    pub unit_offset: bool,
    /// Whether each hidden dimension's row is centred over the vocabulary.
    pub centred: bool,
    /// The unembedding `[vocab, hidden]`: `lm_head.weight`, the token embedding when tied.
    pub weight: String,
}

impl ModelConfig {
    /// The final norm and unembedding of this model: the family's weights (its `params`,
    /// the final norm the gain without a block, the untied lm_head else the token embedding) and
    /// its final norm's gain form.
    pub fn unembedding(&self) -> Result<Unembedding, ModelError> {
        let params = self.params(self.n_layers, true);
        let model_wide = |class: ParamClass| params.iter().filter(move |p| p.class == class && p.layer.is_none());
        let norm = model_wide(ParamClass::Norm).next_back();
        // Tied: the token embedding, the first table (Gemma 4's per-layer input table follows it).
        let weight = model_wide(ParamClass::LmHead).next_back().or_else(|| model_wide(ParamClass::Embedding).next());
        match (norm, weight) {
            (Some(norm), Some(weight)) => {
                let end = self.arch.family().final_norm;
                Ok(Unembedding {
                    norm: end.folded.then(|| norm.name.clone()),
                    unit_offset: end.gain == Gain::UnitOffset,
                    centred: end.centred,
                    weight: weight.name.clone(),
                })
            }
            _ => Err(ModelError::UnsupportedArch(format!(
                "{}: no final norm and unembedding among its weights",
                self.arch
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::hf_config::HfConfig;

    fn config(json: &str) -> crate::config::ModelConfig {
        HfConfig::from_json(json).unwrap().into_config().unwrap()
    }

    #[test]
    fn the_unembedding_is_transformer_lenss_per_family() {
        let dims = r#""hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256"#;
        let llama = config(&format!(r#"{{"model_type": "llama", {dims}, "tie_word_embeddings": false}}"#));
        let u = llama.unembedding().unwrap();
        assert_eq!((u.norm.as_deref(), u.unit_offset, u.centred), (Some("model.norm.weight"), false, true));
        assert_eq!(u.weight, "lm_head.weight");
        let tied = config(&format!(r#"{{"model_type": "llama", {dims}, "tie_word_embeddings": true}}"#));
        assert_eq!(tied.unembedding().unwrap().weight, "model.embed_tokens.weight");
        let gemma = config(&format!(r#"{{"model_type": "gemma2", {dims}, "head_dim": 16}}"#));
        let u = gemma.unembedding().unwrap();
        // Gemma 2's final logits are soft-capped: TransformerLens leaves W_U uncentred.
        assert_eq!((u.norm.as_deref(), u.unit_offset, u.centred), (Some("model.norm.weight"), true, false));
        assert_eq!(u.weight, "model.embed_tokens.weight");
        let gemma4 = config(&format!(r#"{{"model_type": "gemma4_text", {dims}, "head_dim": 16}}"#));
        assert_eq!(gemma4.unembedding().unwrap().weight, "model.embed_tokens.weight", "not the per-layer table");
        // OLMo 2 is post-norm: TransformerLens folds no norm.
        let olmo2 = config(&format!(r#"{{"model_type": "olmo2", {dims}}}"#));
        assert_eq!(olmo2.unembedding().unwrap().norm, None);
        let gpt2 = config(
            r#"{"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 32}"#,
        );
        let u = gpt2.unembedding().unwrap();
        assert_eq!((u.norm.as_deref(), u.unit_offset), (Some("transformer.ln_f.weight"), false));
    }
}
