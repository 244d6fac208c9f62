//! The decoder loop every family's block plugs into ([`Graph::blocks`]); the pre-norm decoder
//! around a family's token mixer and MLP ([`pre_norm_decoder`]), with the Llama-like decoder
//! nine families build through and its weights; and the end of every decoder: the next
//! block's input when the stack stops early, the final norm and its hooks.

use siphon_hlo::Value;

use super::{ForwardProgram, ForwardSpec, Graph};
use crate::arch::Gain;
use crate::config::{ModelConfig, ParamClass, ParamInfo};
use crate::error::ModelError;
use crate::hooks::{HookKind, HookPoint};
use crate::layers::attention::self_attention;
use crate::layers::norm::Norm;

/// The pre-norm decoder several families share around their own token mixer and MLP:
/// embeddings, then per block `x += mixer(norm(x))`, `x += mlp(norm(x))` with every
/// residual and norm hook, then the final norm. `tables` builds what the block's mixer reads
/// before its first norm (RoPE tables, a mask); `mixer` records its own hooks and
/// `hook_attn_out` where it is attention; `mlp` records its insides; the loop records
/// `hook_mlp_out`. Norms apply their gain as `gain` says.
pub(crate) fn pre_norm_decoder<T>(
    config: &ModelConfig,
    spec: &ForwardSpec,
    gain: Gain,
    tables: impl Fn(&mut Graph<'_>, usize) -> Result<T, ModelError>,
    mixer: impl Fn(&mut Graph<'_>, Value, usize, T) -> Result<Value, ModelError>,
    mlp: impl Fn(&mut Graph<'_>, Value, usize) -> Result<Value, ModelError>,
) -> Result<ForwardProgram, ModelError> {
    use HookKind::*;
    let mut g = Graph::new(config, spec)?;
    let x = g.embed("model.embed_tokens.weight")?;
    g.hook(HookPoint::model(Embed), x);
    // Each block ends with `h + m`: hook_resid_mid plus hook_mlp_out.
    g.mlp_joins_resid_mid = true;
    let x = g.blocks(x, |g, x, layer| {
        let at = |kind| HookPoint::block(layer, kind);
        let p = |name: &str| format!("model.layers.{layer}.{name}");
        let tables = tables(g, layer)?;
        let ln1 = g.rms_norm_with(x, &p("input_layernorm.weight"), gain)?;
        g.hook_norm(&ln1, at(Ln1Scale), at(Ln1Normalized), at(Ln1Out))?;
        let mixed = mixer(g, ln1.out, layer, tables)?;
        let h = g.b.add(x, mixed)?;
        g.hook(at(ResidMid), h);
        let ln2 = g.rms_norm_with(h, &p("post_attention_layernorm.weight"), gain)?;
        g.hook_norm(&ln2, at(Ln2Scale), at(Ln2Normalized), at(MlpIn))?;
        let m = mlp(g, ln2.out, layer)?;
        let m = g.steer(at(MlpOut), m)?;
        g.hook(at(MlpOut), m);
        let out = g.b.add(h, m)?;
        Ok(out)
    })?;
    g.finish_decoder(x)
}

/// The decoder of Llama and the families built like it (Qwen2/3, Mistral, Phi-3, SmolLM3,
/// the Qwen3-MoE, Mixtral and OLMoE mixtures): [`pre_norm_decoder`] around the shared
/// self-attention (per-layer RoPE and mask; q/k biases and norms as the config says) and a
/// dense or routed MLP.
pub(crate) fn self_attention_decoder(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    pre_norm_decoder(
        config,
        spec,
        Gain::Plain,
        |g, layer| Ok((g.layer_rope(layer)?, g.layer_mask(layer)?)),
        |g, n, layer, ((cos, sin), mask)| {
            let attn = self_attention(g, n, layer, Gain::Plain, cos, sin, mask)?;
            let attn = g.steer(HookPoint::block(layer, HookKind::AttnOut), attn)?;
            g.hook(HookPoint::block(layer, HookKind::AttnOut), attn);
            Ok(attn)
        },
        |g, n, layer| if config.moe.is_some() { g.moe_mlp(n, layer) } else { g.dense_mlp(n, layer) },
    )
}

/// The weights of the decoder Llama, Qwen2, Mistral, Qwen3 and Gemma share, in Hugging Face's
/// names: the q/k/v biases when `qkv_bias`, the q/k norms when `qk_norm`, and
/// `extra_norms` after `post_attention_layernorm` in each block (Gemma's feed-forward norms).
pub(crate) fn decoder_params(
    c: &ModelConfig,
    n_layers: usize,
    with_lm_head: bool,
    extra_norms: &[&str],
) -> Vec<ParamInfo> {
    use ParamClass::*;
    let h = c.hidden_size;
    let q = c.attention.n_heads * c.attention.head_dim;
    let kv = c.attention.n_kv_heads * c.attention.head_dim;
    let i = c.intermediate_size;
    let mut out = vec![ParamInfo::new("model.embed_tokens.weight", &[c.vocab_size, h], Embedding, None)];
    for l in 0..n_layers {
        let mut block = Vec::new();
        let mut p = |suffix: &str, shape: &[usize], class| {
            block.push(ParamInfo::new(format!("model.layers.{l}.{suffix}"), shape, class, Some(l)));
        };
        p("input_layernorm.weight", &[h], Norm);
        p("self_attn.q_proj.weight", &[q, h], AttnQ);
        p("self_attn.k_proj.weight", &[kv, h], AttnK);
        p("self_attn.v_proj.weight", &[kv, h], AttnV);
        if c.attention.qkv_bias {
            p("self_attn.q_proj.bias", &[q], QBias);
            p("self_attn.k_proj.bias", &[kv], KBias);
            p("self_attn.v_proj.bias", &[kv], VBias);
        }
        if c.attention.qk_norm {
            // Per head, or over the whole projection (OLMoE).
            let (qn, kn) =
                if c.attention.qk_norm_whole { (q, kv) } else { (c.attention.head_dim, c.attention.head_dim) };
            p("self_attn.q_norm.weight", &[qn], Norm);
            p("self_attn.k_norm.weight", &[kn], Norm);
        }
        p("self_attn.o_proj.weight", &[h, q], AttnO);
        p("post_attention_layernorm.weight", &[h], Norm);
        for norm in extra_norms {
            p(&format!("{norm}.weight"), &[h], Norm);
        }
        if c.moe.is_none() {
            p("mlp.gate_proj.weight", &[i, h], MlpGate);
            p("mlp.up_proj.weight", &[i, h], MlpUp);
            p("mlp.down_proj.weight", &[h, i], MlpDown);
        }
        out.append(&mut block);
        out.extend(crate::layers::moe::moe_params(c, l));
    }
    out.push(ParamInfo::new("model.norm.weight", &[h], Norm, None));
    if with_lm_head && !c.tie_word_embeddings {
        out.push(ParamInfo::new("lm_head.weight", &[c.vocab_size, h], LmHead, None));
    }
    out
}

impl<'a> Graph<'a> {
    /// A block whose sublayers' outputs are normed before they join the residual stream:
    /// Gemma 2/3/4's sandwich (a norm before each sublayer too, `pre_norms`) and OLMo 2's
    /// post-norms. `attention` maps the (normed) input to the attention's projected output;
    /// then `post_attention_layernorm` and the residual add (`hook_resid_mid`); the gated MLP
    /// on the (normed) result, `beside` on its output (Gemma 4's mixture: given the residual
    /// stream and the MLP's output, it returns what is normed), `post_feedforward_layernorm`
    /// and the residual add. Norms apply their gain as `gain` says.
    pub fn post_normed_block(
        &mut self,
        x: Value,
        layer: usize,
        gain: Gain,
        pre_norms: bool,
        attention: impl FnOnce(&mut Graph<'a>, Value) -> Result<Value, ModelError>,
        beside: impl FnOnce(&mut Graph<'a>, Value, Value) -> Result<Value, ModelError>,
    ) -> Result<Value, ModelError> {
        use HookKind::*;
        let at = |kind| HookPoint::block(layer, kind);
        let norm = |name: &str| format!("model.layers.{layer}.{name}.weight");
        let input = match pre_norms {
            true => {
                let ln1 = self.rms_norm_with(x, &norm("input_layernorm"), gain)?;
                self.hook_norm(&ln1, at(Ln1Scale), at(Ln1Normalized), at(Ln1Out))?;
                ln1.out
            }
            false => x,
        };
        let proj = attention(self, input)?;
        self.hook(at(AttnProjOut), proj);
        let post = [Ln1PostScale, Ln1PostNormalized, AttnOut].map(at);
        let h = self.add_post_normed(x, proj, &norm("post_attention_layernorm"), gain, post)?;
        self.hook(at(ResidMid), h);
        let input = match pre_norms {
            true => {
                let ln2 = self.rms_norm_with(h, &norm("pre_feedforward_layernorm"), gain)?;
                self.hook_norm(&ln2, at(Ln2Scale), at(Ln2Normalized), at(MlpIn))?;
                ln2.out
            }
            false => {
                self.hook(at(MlpIn), h);
                h
            }
        };
        let out = self.block_mlp(input, &format!("model.layers.{layer}.mlp"), layer, MlpProjOut)?;
        let ffn = beside(self, h, out)?;
        let post = [Ln2PostScale, Ln2PostNormalized, MlpOut].map(at);
        // The block ends with `h` plus the normed MLP output, hook_mlp_out.
        self.mlp_joins_resid_mid = true;
        self.add_post_normed(h, ffn, &norm("post_feedforward_layernorm"), gain, post)
    }

    /// The decoder loop every family's block plugs into: for each block built,
    /// `x` is recorded as its `hook_resid_pre`, `block` computes what the block leaves in the
    /// residual stream (recording the block's own hooks), and that, pinned to the tokens'
    /// layout, is the block's `hook_resid_post` and the next block's input; a steering vector
    /// of either hook is added where it is recorded. Then, for each dictionary spliced in, the
    /// blocks after its hook a second time (and a third, with the hook zero-ablated):
    /// `super::splice`.
    pub fn blocks(
        &mut self,
        mut x: Value,
        mut block: impl FnMut(&mut Graph<'a>, Value, usize) -> Result<Value, ModelError>,
    ) -> Result<Value, ModelError> {
        for layer in 0..self.n_blocks {
            let (pre, post) =
                (HookPoint::block(layer, HookKind::ResidPre), HookPoint::block(layer, HookKind::ResidPost));
            x = self.steer(pre, x)?;
            self.hook(pre, x);
            let out = block(self, x, layer)?;
            x = self.constrain_tokens(out)?;
            x = self.steer(post, x)?;
            self.hook(post, x);
        }
        self.replay_splices(&mut block)?;
        Ok(x)
    }

    /// Ends a decoder after its blocks left the residual stream `x`: `x` is the
    /// next block's `hook_resid_pre` when that block is not built, then the final norm
    /// (`model.norm.weight`, its gain applied as the family's `final_norm` says) and its hooks
    /// when asked for — the spliced streams' final norms too — then the program
    /// ([`Graph::finish`]).
    pub fn finish_decoder(mut self, x: Value) -> Result<ForwardProgram, ModelError> {
        self.end_blocks(x)?;
        if self.with_final_norm {
            let gain = self.config.arch.family().final_norm.gain;
            let norm = self.rms_norm_with(x, "model.norm.weight", gain)?;
            self.hook_final_norm(&norm)?;
            for i in 0..self.splices.len() {
                let norm = self.rms_norm_with(self.splices[i].last, "model.norm.weight", gain)?;
                self.splices[i].hidden = Some(norm.out);
            }
        }
        self.finish()
    }

    /// Records the final norm's hooks.
    pub fn hook_final_norm(&mut self, norm: &Norm) -> Result<(), ModelError> {
        use HookKind::*;
        self.hook_norm(
            norm,
            HookPoint::model(LnFinalScale),
            HookPoint::model(LnFinalNormalized),
            HookPoint::model(LnFinalOut),
        )
    }
}
