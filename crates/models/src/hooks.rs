//! Hook points: where in the forward pass an activation is taken, named as TransformerLens
//! names them, so users keep the names they know.
//!
//! | name                          | value (Hugging Face terms)                          |
//! |-------------------------------|-----------------------------------------------------|
//! | `blocks.{i}.hook_resid_pre`   | input of decoder layer `i` (`hidden_states[i]`)     |
//! | `blocks.{i}.hook_attn_out`    | output of layer `i`'s `o_proj`                      |
//! | `blocks.{i}.hook_mlp_out`     | output of layer `i`'s `down_proj`                   |
//! | `blocks.{i}.hook_resid_post`  | output of decoder layer `i`                         |
//! | `ln_final.hook_normalized`    | final RMSNorm output (`hidden_states[n_layers]`)    |

use std::fmt;
use std::str::FromStr;

use crate::ModelError;

/// One activation the forward can return, shaped `[batch, seq, hidden]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HookPoint {
    /// Residual stream entering block `i`.
    ResidPre(usize),
    /// Attention output (after `o_proj`) of block `i`.
    AttnOut(usize),
    /// MLP output (after `down_proj`) of block `i`.
    MlpOut(usize),
    /// Residual stream leaving block `i`.
    ResidPost(usize),
    /// Output of the final norm.
    LnFinal,
}

impl HookPoint {
    /// Parses a TransformerLens name and checks its layer against `n_layers`.
    pub fn parse(name: &str, n_layers: usize) -> Result<HookPoint, ModelError> {
        let hook: HookPoint = name.parse()?;
        if let Some(layer) = hook.layer().filter(|&l| l >= n_layers) {
            return Err(ModelError::Hook(format!(
                "{name:?}: layer {layer} is out of range (the model has {n_layers} layers, 0..={})",
                n_layers.saturating_sub(1)
            )));
        }
        Ok(hook)
    }

    /// Parses a comma-separated list (as `--hooks` takes it), checking layers; repeated
    /// names are an error.
    pub fn parse_list(names: &str, n_layers: usize) -> Result<Vec<HookPoint>, ModelError> {
        let mut hooks = Vec::new();
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let hook = HookPoint::parse(name, n_layers)?;
            if hooks.contains(&hook) {
                return Err(ModelError::Hook(format!("{name:?} is requested twice")));
            }
            hooks.push(hook);
        }
        if hooks.is_empty() {
            return Err(ModelError::Hook(format!("no hook names in {names:?}")));
        }
        Ok(hooks)
    }

    /// The block this hook belongs to (`None` for `ln_final`).
    pub fn layer(self) -> Option<usize> {
        match self {
            HookPoint::ResidPre(i)
            | HookPoint::AttnOut(i)
            | HookPoint::MlpOut(i)
            | HookPoint::ResidPost(i) => Some(i),
            HookPoint::LnFinal => None,
        }
    }

    /// How many blocks must run before this activation exists.
    pub fn blocks_needed(self, n_layers: usize) -> usize {
        match self {
            HookPoint::ResidPre(i) => i,
            HookPoint::AttnOut(i) | HookPoint::MlpOut(i) | HookPoint::ResidPost(i) => i + 1,
            HookPoint::LnFinal => n_layers,
        }
    }
}

impl fmt::Display for HookPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HookPoint::ResidPre(i) => write!(f, "blocks.{i}.hook_resid_pre"),
            HookPoint::AttnOut(i) => write!(f, "blocks.{i}.hook_attn_out"),
            HookPoint::MlpOut(i) => write!(f, "blocks.{i}.hook_mlp_out"),
            HookPoint::ResidPost(i) => write!(f, "blocks.{i}.hook_resid_post"),
            HookPoint::LnFinal => f.write_str("ln_final.hook_normalized"),
        }
    }
}

impl FromStr for HookPoint {
    type Err = ModelError;

    /// Parses a name without a layer-range check (see [`HookPoint::parse`]).
    fn from_str(name: &str) -> Result<HookPoint, ModelError> {
        const KNOWN: &str = "blocks.{i}.hook_resid_pre, blocks.{i}.hook_resid_post, \
             blocks.{i}.hook_attn_out, blocks.{i}.hook_mlp_out, ln_final.hook_normalized";
        let bad = |why: &str| ModelError::Hook(format!("{name:?}: {why} (known hooks: {KNOWN})"));
        if name == "ln_final.hook_normalized" {
            return Ok(HookPoint::LnFinal);
        }
        let rest = name.strip_prefix("blocks.").ok_or_else(|| bad("unknown hook name"))?;
        let (layer, hook) = rest.split_once('.').ok_or_else(|| bad("unknown hook name"))?;
        // Only plain decimal digits: `+1` or ` 1` are not layer numbers.
        if layer.is_empty() || !layer.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad("the layer must be a number"));
        }
        let layer: usize = layer.parse().map_err(|_| bad("the layer number is too large"))?;
        match hook {
            "hook_resid_pre" => Ok(HookPoint::ResidPre(layer)),
            "hook_resid_post" => Ok(HookPoint::ResidPost(layer)),
            "hook_attn_out" => Ok(HookPoint::AttnOut(layer)),
            "hook_mlp_out" => Ok(HookPoint::MlpOut(layer)),
            _ => Err(bad("unknown hook name")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for hook in [
            HookPoint::ResidPre(0),
            HookPoint::AttnOut(3),
            HookPoint::MlpOut(11),
            HookPoint::ResidPost(27),
            HookPoint::LnFinal,
        ] {
            assert_eq!(HookPoint::parse(&hook.to_string(), 28).unwrap(), hook);
        }
        assert_eq!(HookPoint::ResidPost(5).to_string(), "blocks.5.hook_resid_post");
    }

    #[test]
    fn bad_names_are_named() {
        for name in ["blocks.x.hook_resid_pre", "blocks.1.hook_resid", "ln_final", "blocks..hook_mlp_out", "blocks.+1.hook_mlp_out"] {
            let err = HookPoint::parse(name, 4).unwrap_err().to_string();
            assert!(err.contains(name), "{err}");
        }
        let err = HookPoint::parse("blocks.4.hook_resid_post", 4).unwrap_err().to_string();
        assert!(err.contains("layer 4 is out of range") && err.contains("4 layers"), "{err}");
    }

    #[test]
    fn lists_parse_and_reject_repeats() {
        let hooks = HookPoint::parse_list("blocks.0.hook_resid_pre, ln_final.hook_normalized", 2).unwrap();
        assert_eq!(hooks, vec![HookPoint::ResidPre(0), HookPoint::LnFinal]);
        assert!(HookPoint::parse_list("blocks.0.hook_mlp_out,blocks.0.hook_mlp_out", 2).is_err());
        assert!(HookPoint::parse_list(" , ", 2).is_err());
    }

    #[test]
    fn blocks_needed_follows_hook_semantics() {
        assert_eq!(HookPoint::ResidPre(0).blocks_needed(4), 0);
        assert_eq!(HookPoint::ResidPre(2).blocks_needed(4), 2);
        assert_eq!(HookPoint::AttnOut(2).blocks_needed(4), 3);
        assert_eq!(HookPoint::ResidPost(3).blocks_needed(4), 4);
        assert_eq!(HookPoint::LnFinal.blocks_needed(4), 4);
    }
}
