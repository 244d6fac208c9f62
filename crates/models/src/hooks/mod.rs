//! Hook points: where in the forward pass an activation is taken, named and meant as
//! TransformerLens 4.x names and means them (values of `TransformerBridge` on raw Hugging
//! Face weights), so users keep the names they know.
//!
//! Every kind of hook is one row of [`KINDS`]: its TransformerLens name, the bridge names
//! accepted as aliases for the same tensor, whether it belongs to a block or to the model,
//! and its per-token shape. A family lists the kinds it has ([`hook_kinds`]),
//! so a name the architecture lacks is refused before anything is built.
//!
//! Names in requests may be patterns: `blocks.*.hook_resid_post` (every layer),
//! `blocks.{0..27}.ln2.hook_normalized` (an inclusive range), `blocks.{3,5}.attn.hook_z`
//! (a list) and `blocks.3.*` (every hook of block 3), see [`resolve_hooks`].

pub mod feature;
mod kinds;

use std::fmt;
use std::str::FromStr;

pub use self::feature::Feature;
pub use self::kinds::*;
use crate::config::ModelConfig;
use crate::error::ModelError;

/// When a bridge name means another kind than the row of [`KINDS`] that lists it: what the
/// block has or lacks decides which tensor the name is.
#[derive(Debug, Clone, Copy)]
enum When {
    Has(Feature),
    Lacks(Feature),
}

/// Bridge names whose tensor depends on the block's shape, tried before [`KINDS`]:
/// `(name, when, kind)`.
const STRUCTURAL_ALIASES: &[(&str, When, HookKind)] = &[
    // A block without norms before its sublayers (OLMo 2, OLMo 3): attention reads the
    // block's input.
    ("attn.hook_in", When::Lacks(Feature::PreNorms), HookKind::ResidPre),
    ("attn.q.hook_in", When::Lacks(Feature::PreNorms), HookKind::ResidPre),
    ("attn.k.hook_in", When::Lacks(Feature::PreNorms), HookKind::ResidPre),
    ("attn.v.hook_in", When::Lacks(Feature::PreNorms), HookKind::ResidPre),
    // The parallel block (GPT-NeoX): the MLP norm reads the block's input too.
    ("ln2.hook_in", When::Lacks(Feature::ResidMid), HookKind::ResidPre),
    // Gated attention: the q-norm reads the queries without their gates.
    ("attn.q_norm.hook_in", When::Has(Feature::AttnGate), HookKind::AttnQuery),
    // The q/k norms read the projections (per head, or over the whole projection in OLMo).
    ("attn.q_norm.hook_in", When::Has(Feature::QkNorm), HookKind::AttnQ),
    ("attn.k_norm.hook_in", When::Has(Feature::QkNorm), HookKind::AttnK),
    ("attn.v_norm.hook_in", When::Has(Feature::VNorm), HookKind::AttnV),
    // A mixture beside the MLP (Gemma 4): its router and first norm read the residual stream,
    // the MLP's norm its output.
    ("router.hook_in", When::Has(Feature::MixtureBeside), HookKind::ResidMid),
    ("pre_feedforward_layernorm_2.hook_in", When::Has(Feature::MixtureBeside), HookKind::ResidMid),
    ("post_feedforward_layernorm_1.hook_in", When::Has(Feature::MixtureBeside), HookKind::MlpProjOut),
    // GPT-OSS's router, named `router`.
    ("mlp.router.hook_in", When::Has(Feature::TopKRouter), HookKind::MlpIn),
    ("mlp.router.hook_out", When::Has(Feature::TopKRouter), HookKind::MlpRouterLogits),
    ("mlp.router.hook_expert_weights", When::Has(Feature::TopKRouter), HookKind::MlpExpertWeights),
    ("mlp.router.hook_expert_indices", When::Has(Feature::TopKRouter), HookKind::MlpExpertIndices),
    // Linear attention reads the attention norm's output (padding zeroed; real tokens as is).
    ("linear_attn.hook_in", When::Has(Feature::LinearAttention), HookKind::Ln1Out),
    ("linear_attn.hook_linear_attn_in", When::Has(Feature::LinearAttention), HookKind::Ln1Out),
    // A shared expert: it, its gate, the router and the routed experts read the mixture's input.
    ("mlp.shared_expert.hook_in", When::Has(Feature::SharedExpert), HookKind::MlpIn),
    ("mlp.shared_expert.gate.hook_in", When::Has(Feature::SharedExpert), HookKind::MlpIn),
    ("mlp.shared_expert.in.hook_in", When::Has(Feature::SharedExpert), HookKind::MlpIn),
    ("mlp.shared_expert_gate.hook_in", When::Has(Feature::SharedExpertGate), HookKind::MlpIn),
    ("mlp.shared_experts.hook_in", When::Has(Feature::SharedExpert), HookKind::MlpIn),
    ("mlp.shared_experts.gate.hook_in", When::Has(Feature::SharedExpert), HookKind::MlpIn),
    ("mlp.shared_experts.in.hook_in", When::Has(Feature::SharedExpert), HookKind::MlpIn),
    ("mlp.experts.hook_in", When::Has(Feature::SharedExpert), HookKind::MlpIn),
    ("mlp.experts.hook_pre", When::Has(Feature::SharedExpert), HookKind::MlpIn),
    // A mixture: the bridge names its input `mlp.hook_pre` and its output `mlp.hook_post`
    // (on a mixture's blocks only, where dense blocks precede them: DeepSeek-V3).
    ("mlp.hook_pre", When::Has(Feature::Moe), HookKind::MlpIn),
    ("mlp.hook_post", When::Has(Feature::Moe), HookKind::MlpOut),
];

/// Bridge hooks that are not a per-token activation, with the reason siphon refuses them.
const NOT_PER_TOKEN: &[(&str, &str)] = &[(
    "linear_attn.hook_ssm_state",
    "it is the linear attention's recurrent state, [nv, dk, dv] per token (dk times a value head's \
     activations; TransformerLens fires it only on its eager scan); the per-token hooks it is computed from \
     (linear_attn.hook_q, hook_k, hook_v, hook_beta, hook_log_decay) and its output \
     (linear_attn.hook_recurrence_out) are extracted",
)];

/// The bridge's name for the final norm's input: the last block's `hook_resid_post`.
const LN_FINAL_IN: &str = "ln_final.hook_in";

/// One activation the forward can return: a kind, and the block for block-scope kinds.
/// Serialized as its TransformerLens name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct HookPoint {
    /// The block, `None` for model-scope hooks.
    layer: Option<usize>,
    kind: HookKind,
}

impl HookPoint {
    /// A hook of block `layer`. Panics if `kind` is not a block hook (a programming error).
    pub fn block(layer: usize, kind: HookKind) -> HookPoint {
        assert_eq!(kind.info().scope, Scope::Block, "{kind:?} is not a block hook");
        HookPoint { layer: Some(layer), kind }
    }

    /// A model-scope hook. Panics if `kind` is a block hook (a programming error).
    pub fn model(kind: HookKind) -> HookPoint {
        assert_ne!(kind.info().scope, Scope::Block, "{kind:?} is a block hook");
        HookPoint { layer: None, kind }
    }

    /// The kind.
    pub fn kind(self) -> HookKind {
        self.kind
    }

    /// The block this hook belongs to (`None` for model-scope hooks).
    pub fn layer(self) -> Option<usize> {
        self.layer
    }

    /// How many blocks must run before this activation exists: a block's own hooks need the
    /// block (its `hook_resid_pre` only the blocks before it).
    pub fn blocks_needed(self, n_layers: usize) -> usize {
        match (self.kind.info().scope, self.layer) {
            (Scope::Input, _) => 0,
            (Scope::Output, _) => n_layers,
            (Scope::Block, Some(layer)) if self.kind == HookKind::ResidPre => layer,
            (Scope::Block, layer) => layer.map_or(0, |l| l + 1),
        }
    }

    /// The per-token shape of this hook for `config` at sequence length `seq`.
    pub fn dims(self, config: &ModelConfig, seq: usize) -> Vec<usize> {
        if let Some(dims) = config.mla.and_then(|m| m.hook_dims(self.kind, config.attention.n_heads)) {
            return dims;
        }
        self.kind.info().shape.dims(config, self.layer, seq)
    }

    /// Parses one exact name for `config`: checks the layer range and that the family has
    /// this kind of hook.
    pub fn parse(name: &str, config: &ModelConfig) -> Result<HookPoint, ModelError> {
        let hook = lookup_in(name, config)?;
        check(name, hook, config)?;
        Ok(hook)
    }
}

impl fmt::Display for HookPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.layer {
            Some(layer) => write!(f, "blocks.{layer}.{}", self.kind.info().name),
            None => f.write_str(self.kind.info().name),
        }
    }
}

impl From<HookPoint> for String {
    fn from(hook: HookPoint) -> String {
        hook.to_string()
    }
}

impl TryFrom<String> for HookPoint {
    type Error = ModelError;

    fn try_from(name: String) -> Result<HookPoint, ModelError> {
        name.parse()
    }
}

impl FromStr for HookPoint {
    type Err = ModelError;

    /// Parses an exact name (TransformerLens's or a bridge alias) without a model: no layer
    /// range or family check (see [`HookPoint::parse`]).
    fn from_str(name: &str) -> Result<HookPoint, ModelError> {
        lookup(name, None)
    }
}

/// The hook `name` means in `config`'s model: as [`lookup`] for its architecture, and the
/// bridge's `ln_final.hook_in` as the last block's `hook_resid_post`.
fn lookup_in(name: &str, config: &ModelConfig) -> Result<HookPoint, ModelError> {
    if name == LN_FINAL_IN && config.n_layers > 0 {
        return Ok(HookPoint::block(config.n_layers - 1, HookKind::ResidPost));
    }
    lookup(name, Some(config))
}

/// The hook `name` means. A name can mean different tensors in different families (Gemma's
/// `attn.hook_out` is o_proj's output, before its post-attention norm; elsewhere it is
/// `hook_attn_out`; OLMo 2's `attn.hook_in` is the block's input), so for a known `arch` the
/// [`STRUCTURAL_ALIASES`] its block's features select come first, then its own kinds, a
/// TransformerLens name before a bridge alias, and among kinds sharing an alias the earlier in
/// [`KINDS`] (forward order).
fn lookup(name: &str, config: Option<&ModelConfig>) -> Result<HookPoint, ModelError> {
    let family = config.map(hook_kinds);
    let family = family.as_deref();
    // `layer`: the block a block name is in (its features decide structural aliases).
    let known = |n: &str, layer: Option<usize>| {
        let block = layer.is_some();
        let features = config.map(|c| layer.map_or_else(|| features(c), |l| layer_features(c, l)));
        if let Some(kind) = features.and_then(|f| structural_alias(n, &f, block)) {
            return Some(kind);
        }
        let matching: Vec<&KindInfo> = KINDS
            .iter()
            .filter(|k| (k.scope == Scope::Block) == block && (k.name == n || k.aliases.contains(&n)))
            .collect();
        let best = |pool: &[&KindInfo]| pool.iter().find(|k| k.name == n).or(pool.first()).map(|k| k.kind);
        let own: Vec<&KindInfo> =
            matching.iter().copied().filter(|k| family.is_none_or(|f| f.contains(&k.kind))).collect();
        best(&own).or_else(|| best(&matching))
    };
    if let Some(kind) = known(name, None) {
        return Ok(HookPoint { layer: None, kind });
    }
    let unknown = || ModelError::Hook(format!("{name:?} is not a hook name{}", suggest(name)));
    let rest = name.strip_prefix("blocks.").ok_or_else(unknown)?;
    let (layer, suffix) = rest.split_once('.').ok_or_else(unknown)?;
    // Only plain decimal digits: `+1` or ` 1` are not layer numbers.
    if layer.is_empty() || !layer.bytes().all(|c| c.is_ascii_digit()) {
        return Err(ModelError::Hook(format!("{name:?}: the layer {layer:?} must be a number")));
    }
    let layer: usize =
        layer.parse().map_err(|_| ModelError::Hook(format!("{name:?}: the layer number is too large")))?;
    if let Some((_, why)) = NOT_PER_TOKEN.iter().find(|(n, _)| *n == suffix) {
        return Err(ModelError::Hook(format!("{name:?} is not extracted: {why}")));
    }
    let kind = known(suffix, Some(layer)).ok_or_else(|| match config {
        Some(c) if structural_alias(suffix, &features(c), true).is_some() => {
            ModelError::Hook(format!("{name:?}: block {layer} has no {suffix}, which this model's other blocks have"))
        }
        _ => unknown(),
    })?;
    Ok(HookPoint { layer: Some(layer), kind })
}

/// The kind the bridge name `name` means in a block (`block`) or outside one, among the
/// [`STRUCTURAL_ALIASES`] that `features` select.
fn structural_alias(name: &str, features: &[Feature], block: bool) -> Option<HookKind> {
    let holds = |when: &When| match *when {
        When::Has(f) => features.contains(&f),
        When::Lacks(f) => !features.contains(&f),
    };
    STRUCTURAL_ALIASES
        .iter()
        .find(|(alias, when, kind)| *alias == name && holds(when) && (kind.info().scope == Scope::Block) == block)
        .map(|(_, _, kind)| *kind)
}

/// Checks `hook` (parsed from `name`) against the model: layer range and family.
pub(crate) fn check(name: &str, hook: HookPoint, config: &ModelConfig) -> Result<(), ModelError> {
    if let Some(layer) = hook.layer.filter(|&l| l >= config.n_layers) {
        return Err(ModelError::Hook(format!(
            "{name:?}: layer {layer} is out of range (the model has {} layers, 0..={})",
            config.n_layers,
            config.n_layers.saturating_sub(1)
        )));
    }
    if !hook_kinds(config).contains(&hook.kind) {
        return Err(ModelError::Hook(format!(
            "{name:?}: the {} architecture has no {} ({})",
            config.arch,
            hook.kind.info().name,
            hook.kind.info().meaning
        )));
    }
    if let Some(layer) = hook.layer.filter(|&l| !layer_has(config, l, hook.kind)) {
        if let Some(la) = config.linear_attention.as_ref().filter(|_| hook.kind.is_token_mixer()) {
            let (what, instead) = match la.is_linear(layer) {
                true => ("a linear-attention (Gated DeltaNet) layer", "linear_attn.hook_out"),
                false => ("a full-attention layer", "hook_attn_out"),
            };
            return Err(ModelError::Hook(format!(
                "{name:?}: block {layer} is {what} and has no {}; its token mixer's output is blocks.{layer}.{instead}",
                hook.kind.info().name
            )));
        }
        let feature = hook.kind.needs();
        if let Some(moe) =
            config.moe.as_ref().filter(|_| feature.is_some_and(|f| !layer_features(config, layer).contains(&f)))
        {
            let (what, instead) = match config.is_mixture_layer(layer) {
                true => ("a mixture-of-experts block", "the routed experts' hooks (mlp.hook_expert_weights, …)"),
                false => ("a dense block", "the dense MLP's hooks (mlp.hook_pre, mlp.hook_post, …)"),
            };
            return Err(ModelError::Hook(format!(
                "{name:?}: block {layer} is {what} (the first {} blocks are dense) and has no {}; it has {instead}",
                moe.first_dense,
                hook.kind.info().name
            )));
        }
        let source = config.kv_source(layer).unwrap_or(layer);
        return Err(ModelError::Hook(format!(
            "{name:?}: block {layer} attends over block {source}'s keys and values (it computes none of its own): \
             blocks.{source}.{} holds them",
            hook.kind.info().name
        )));
    }
    Ok(())
}

/// Expands a comma-separated list of names and patterns (what `--hooks` takes) into hook
/// points for `config`, in the order given; a hook named twice (also through an alias or
/// two overlapping patterns) is an error.
///
/// Patterns: `*` in the layer position means every layer, `{a..b}` an inclusive range and
/// `{a,b,c}` a list; `*` in the hook position (`blocks.3.*`) means every block hook the
/// family has.
pub fn resolve_hooks(list: &str, config: &ModelConfig) -> Result<Vec<HookPoint>, ModelError> {
    let mut hooks: Vec<(HookPoint, String)> = Vec::new();
    for item in split_top_level(list) {
        for (hook, name) in expand(&item, config)? {
            check(&name, hook, config)?;
            if let Some((_, first)) = hooks.iter().find(|(h, _)| *h == hook) {
                let how = if *first == name { String::new() } else { format!(" (as {first:?} and {name:?})") };
                return Err(ModelError::Hook(format!("{hook} is requested twice{how}")));
            }
            hooks.push((hook, name));
        }
    }
    if hooks.is_empty() {
        return Err(ModelError::Hook(format!("no hook names in {list:?}")));
    }
    Ok(hooks.into_iter().map(|(h, _)| h).collect())
}

/// Splits on commas that are not inside `{…}`.
fn split_top_level(list: &str) -> Vec<String> {
    let (mut items, mut current, mut depth) = (Vec::new(), String::new(), 0usize);
    for c in list.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    items.push(current);
    items.into_iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
}

/// One item of a hook list: an exact name or a pattern, with the name each hook was asked
/// for by.
fn expand(item: &str, config: &ModelConfig) -> Result<Vec<(HookPoint, String)>, ModelError> {
    let family = hook_kinds(config);
    let Some(rest) = item.strip_prefix("blocks.") else {
        return Ok(vec![(lookup_in(item, config)?, item.to_string())]);
    };
    let (layers, suffix) = match rest.strip_prefix('{') {
        Some(inner) => {
            let (set, suffix) =
                inner.split_once('}').ok_or_else(|| ModelError::Hook(format!("{item:?}: '{{' without '}}'")))?;
            (set, suffix.strip_prefix('.').unwrap_or(suffix))
        }
        None => rest.split_once('.').unwrap_or((rest, "")),
    };
    let is_pattern = rest.starts_with('{') || layers == "*" || suffix == "*";
    if !is_pattern {
        return Ok(vec![(lookup_in(item, config)?, item.to_string())]);
    }
    let layer_list = parse_layer_set(item, layers, config.n_layers)?;
    let mut out = Vec::new();
    for layer in layer_list {
        // `*`: every hook this block has.
        let suffixes: Vec<&str> = if suffix == "*" {
            KINDS
                .iter()
                .filter(|k| k.scope == Scope::Block && family.contains(&k.kind) && layer_has(config, layer, k.kind))
                .map(|k| k.name)
                .collect()
        } else {
            vec![suffix]
        };
        for suffix in &suffixes {
            let name = format!("blocks.{layer}.{suffix}");
            // A name this model's other blocks have keeps its own error (naming the block).
            let elsewhere = structural_alias(suffix, &features(config), true).is_some();
            let hook = lookup(&name, Some(config)).map_err(|e| match elsewhere {
                true => e,
                false => ModelError::Hook(format!(
                    "{item:?}: {:?} is not a hook name{}",
                    format!("blocks.{{i}}.{suffix}"),
                    suggest(&name)
                )),
            })?;
            out.push((hook, name));
        }
    }
    Ok(out)
}

/// `*`, `{a..b}`'s `a..b`, `{a,b}`'s `a,b`, or a plain number.
fn parse_layer_set(item: &str, set: &str, n_layers: usize) -> Result<Vec<usize>, ModelError> {
    let bad = |why: String| ModelError::Hook(format!("{item:?}: {why}"));
    let number = |s: &str| -> Result<usize, ModelError> {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad(format!("{s:?} is not a layer number")));
        }
        s.parse().map_err(|_| bad(format!("{s:?} is too large")))
    };
    let out_of_range = |layer: usize| {
        bad(format!(
            "layer {layer} is out of range (the model has {n_layers} layers, 0..={})",
            n_layers.saturating_sub(1)
        ))
    };
    if set == "*" {
        return Ok((0..n_layers).collect());
    }
    let layers: Vec<usize> = if let Some((a, b)) = set.split_once("..") {
        let (a, b) = (number(a)?, number(b)?);
        if a > b {
            return Err(bad(format!("the range {a}..{b} is empty")));
        }
        // Bounded by the model before the list is made: `{0..999999999999}` names no more.
        if b >= n_layers {
            return Err(out_of_range(b));
        }
        (a..=b).collect()
    } else {
        set.split(',').map(number).collect::<Result<_, _>>()?
    };
    match layers.iter().find(|&&l| l >= n_layers) {
        Some(&layer) => Err(out_of_range(layer)),
        None => Ok(layers),
    }
}

/// `" (did you mean …?)"` with up to three known names closest to `name`, or nothing.
fn suggest(name: &str) -> String {
    // Compare with the layer written as in `name`, so only the hook part counts.
    let layer = name.strip_prefix("blocks.").and_then(|r| r.split_once('.')).map(|(l, _)| l);
    let mut candidates: Vec<String> = Vec::new();
    for k in KINDS {
        for n in std::iter::once(&k.name).chain(k.aliases) {
            candidates.push(match (k.scope, layer) {
                (Scope::Block, Some(l)) => format!("blocks.{l}.{n}"),
                (Scope::Block, None) => format!("blocks.0.{n}"),
                _ => n.to_string(),
            });
        }
    }
    let mut scored: Vec<(usize, String)> = candidates.into_iter().map(|c| (edit_distance(name, &c), c)).collect();
    scored.sort();
    let limit = (name.len() / 2).max(3);
    let best: Vec<String> =
        scored.into_iter().filter(|(d, _)| *d <= limit).take(3).map(|(_, c)| format!("{c:?}")).collect();
    if best.is_empty() { String::new() } else { format!(" (did you mean {}?)", best.join(", ")) }
}

/// Levenshtein distance over bytes.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut row = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            row[j + 1] = (prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(row[j] + 1);
        }
        prev = row;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;

    fn config() -> ModelConfig {
        ModelConfig {
            arch: crate::llama::ARCH,
            vocab_size: 32,
            hidden_size: 16,
            intermediate_size: 24,
            n_layers: 4,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 128,
            tie_word_embeddings: true,
            attention: crate::config::Attention {
                n_heads: 4,
                n_kv_heads: 2,
                head_dim: 4,
                qkv_bias: false,
                ..Default::default()
            },
            rope: crate::config::Rope { theta: 10000.0, ..Default::default() },
            ..ModelConfig::default()
        }
    }

    /// The test config as a model of `arch`, with per-layer inputs for the families that may
    /// have them.
    fn of(arch: crate::config::Arch) -> ModelConfig {
        let per_layer_input = Some(crate::config::PerLayerInput { width: 4, vocab_size: 32 });
        ModelConfig { arch, per_layer_input, ..config() }
    }

    #[test]
    fn names_and_aliases_round_trip() {
        let c = config();
        let family = hook_kinds(&c);
        for k in KINDS.iter().filter(|k| family.contains(&k.kind)) {
            let hook = match k.scope {
                Scope::Block => HookPoint::block(2, k.kind),
                _ => HookPoint::model(k.kind),
            };
            assert_eq!(HookPoint::parse(&hook.to_string(), &c).unwrap(), hook);
            for alias in k.aliases {
                // A bridge name two kinds of the family share goes to the earlier row
                // (`mlp.in.hook_out`: the up projection of a gated MLP, a plain MLP's input).
                let earlier = KINDS
                    .iter()
                    .take_while(|e| e.kind != k.kind)
                    .any(|e| family.contains(&e.kind) && e.aliases.contains(alias));
                if earlier {
                    continue;
                }
                let name = if k.scope == Scope::Block { format!("blocks.2.{alias}") } else { alias.to_string() };
                assert_eq!(HookPoint::parse(&name, &c).unwrap(), hook, "{name}");
            }
        }
        assert_eq!(HookPoint::block(5, HookKind::ResidPost).to_string(), "blocks.5.hook_resid_post");
        assert_eq!(HookPoint::model(HookKind::LnFinalNormalized).to_string(), "ln_final.hook_normalized");
    }

    #[test]
    fn names_are_unambiguous_in_every_family() {
        let mut seen = std::collections::HashSet::new();
        for k in KINDS {
            assert!(seen.insert((k.scope == Scope::Block, k.name)), "{} is the name of two kinds", k.name);
        }
        for arch in crate::family::FAMILIES.iter().map(|f| crate::arch::Arch::of(f)) {
            let c = of(arch);
            let family = hook_kinds(&c);
            for k in KINDS.iter().filter(|k| family.contains(&k.kind)) {
                for n in std::iter::once(&k.name).chain(k.aliases) {
                    let name = if k.scope == Scope::Block { format!("blocks.0.{n}") } else { n.to_string() };
                    let got = lookup(&name, Some(&c)).unwrap().kind;
                    assert!(family.contains(&got), "{arch}: {name} resolves to {got:?}, not one of its hooks");
                    if *n == k.name {
                        assert_eq!(got, k.kind, "{arch}: {name}");
                    }
                }
            }
        }
        // A bridge name two kinds share goes to the earlier in forward order: Gemma's
        // projections before their post-norms.
        let kind = |name: &str, arch: &str| lookup(name, Some(&of(arch.parse().unwrap()))).unwrap().kind();
        assert_eq!(kind("blocks.0.attn.o.hook_out", "gemma2"), HookKind::AttnProjOut);
        assert_eq!(kind("blocks.0.mlp.out.hook_out", "gemma2"), HookKind::MlpProjOut);
        assert_eq!(kind("blocks.0.ln2_post.hook_out", "gemma2"), HookKind::MlpOut);
        assert_eq!(kind("blocks.0.attn.o.hook_out", "llama"), HookKind::AttnOut);
        // Gemma's attn.hook_out is o_proj's output; elsewhere the attention output.
        assert_eq!(
            (kind("blocks.0.attn.hook_out", "gemma2"), kind("blocks.0.attn.hook_out", "llama")),
            (HookKind::AttnProjOut, HookKind::AttnOut)
        );
        // Names whose tensor the block's shape decides.
        assert_eq!(
            (kind("blocks.0.attn.hook_in", "olmo2"), kind("blocks.0.attn.hook_in", "llama")),
            (HookKind::ResidPre, HookKind::Ln1Out)
        );
        assert_eq!(
            (kind("blocks.0.ln2.hook_in", "gpt_neox"), kind("blocks.0.ln2.hook_in", "llama")),
            (HookKind::ResidPre, HookKind::ResidMid)
        );
        assert_eq!(kind("blocks.0.attn.q_norm.hook_in", "qwen3"), HookKind::AttnQ);
        assert_eq!(
            (kind("blocks.0.mlp.hook_pre", "mixtral"), kind("blocks.0.mlp.hook_post", "qwen3_moe")),
            (HookKind::MlpIn, HookKind::MlpOut)
        );
        assert_eq!(kind("blocks.0.mlp.hook_pre", "llama"), HookKind::MlpPre);
        // Where the block has no q/k norm the name is no hook of the family.
        let c = config();
        assert!(HookPoint::parse("blocks.0.attn.q_norm.hook_in", &c).is_err());
        // ln_final.hook_in: the last block's output.
        assert_eq!(
            HookPoint::parse("ln_final.hook_in", &c).unwrap(),
            HookPoint::block(c.n_layers - 1, HookKind::ResidPost)
        );
        let err = resolve_hooks("ln_final.hook_in,blocks.*.hook_resid_post", &c).unwrap_err().to_string();
        assert!(err.contains("requested twice"), "{err}");
    }

    #[test]
    fn bad_names_are_named_with_suggestions() {
        let c = config();
        let err = HookPoint::parse("blocks.1.hook_resid_psot", &c).unwrap_err().to_string();
        assert!(err.contains("did you mean \"blocks.1.hook_resid_post\""), "{err}");
        let err = HookPoint::parse("blocks.1.ln2.hook_normalised", &c).unwrap_err().to_string();
        assert!(err.contains("\"blocks.1.ln2.hook_normalized\""), "{err}");
        let err = HookPoint::parse("ln_final.hook_normalised", &c).unwrap_err().to_string();
        assert!(err.contains("\"ln_final.hook_normalized\""), "{err}");
        for name in ["blocks.x.hook_resid_pre", "blocks..hook_mlp_out", "blocks.+1.hook_mlp_out", "ln_final"] {
            let err = HookPoint::parse(name, &c).unwrap_err().to_string();
            assert!(err.contains(name), "{err}");
        }
        let err = HookPoint::parse("blocks.4.hook_resid_post", &c).unwrap_err().to_string();
        assert!(err.contains("layer 4 is out of range") && err.contains("4 layers"), "{err}");
    }

    #[test]
    fn a_hook_the_family_lacks_names_the_architecture() {
        let err = HookPoint::parse("hook_pos_embed", &config()).unwrap_err().to_string();
        assert!(err.contains("llama architecture has no hook_pos_embed"), "{err}");
    }

    #[test]
    fn patterns_expand_in_order() {
        let c = config();
        let names =
            |list: &str| -> Vec<String> { resolve_hooks(list, &c).unwrap().iter().map(ToString::to_string).collect() };
        assert_eq!(
            names("blocks.*.hook_resid_post"),
            (0..4).map(|i| format!("blocks.{i}.hook_resid_post")).collect::<Vec<_>>()
        );
        assert_eq!(
            names("blocks.{1..2}.ln2.hook_normalized"),
            ["blocks.1.ln2.hook_normalized", "blocks.2.ln2.hook_normalized"]
        );
        assert_eq!(
            names("blocks.{0,3}.attn.hook_z, ln_final.hook_out"),
            ["blocks.0.attn.hook_z", "blocks.3.attn.hook_z", "ln_final.hook_out"]
        );
        let all = resolve_hooks("blocks.3.*", &c).unwrap();
        // Every block hook Llama has: not the q/k norms of Qwen3.
        assert_eq!(all.len(), 22);
        assert!(!all.iter().any(|h| h.kind() == HookKind::AttnQNormed));
        assert!(all.iter().all(|h| h.layer() == Some(3)));
        // Aliases resolve to the TransformerLens name.
        assert_eq!(names("blocks.1.hook_out"), ["blocks.1.hook_resid_post"]);
    }

    #[test]
    fn bad_lists_are_errors() {
        let c = config();
        let err = resolve_hooks("blocks.1.hook_out, blocks.1.hook_resid_post", &c).unwrap_err().to_string();
        assert!(err.contains("requested twice") && err.contains("blocks.1.hook_out"), "{err}");
        let err = resolve_hooks("blocks.*.hook_resid_post, blocks.2.hook_resid_post", &c).unwrap_err().to_string();
        assert!(err.contains("blocks.2.hook_resid_post is requested twice"), "{err}");
        for (list, want) in [
            ("blocks.{0..9}.hook_mlp_out", "layer 9 is out of range"),
            // Refused from its end, before the range is made (it once allocated 8 TB).
            ("blocks.{0..999999999999}.hook_resid_post", "layer 999999999999 is out of range"),
            ("blocks.{3..18446744073709551615}.hook_resid_post", "layer 18446744073709551615 is out of range"),
            ("blocks.{3..1}.hook_mlp_out", "empty"),
            ("blocks.{0..2.hook_mlp_out", "without"),
            ("blocks.*.hook_mlp_ot", "did you mean"),
            ("blocks.{a}.hook_mlp_out", "not a layer number"),
            (" , ", "no hook names"),
        ] {
            let err = resolve_hooks(list, &c).unwrap_err().to_string();
            assert!(err.contains(want), "{list}: {err}");
        }
    }

    #[test]
    fn blocks_needed_follows_hook_semantics() {
        let n = 4;
        assert_eq!(HookPoint::model(HookKind::Embed).blocks_needed(n), 0);
        assert_eq!(HookPoint::block(0, HookKind::ResidPre).blocks_needed(n), 0);
        assert_eq!(HookPoint::block(2, HookKind::ResidPre).blocks_needed(n), 2);
        assert_eq!(HookPoint::block(2, HookKind::Ln1Scale).blocks_needed(n), 3);
        assert_eq!(HookPoint::block(3, HookKind::ResidPost).blocks_needed(n), 4);
        assert_eq!(HookPoint::model(HookKind::LnFinalNormalized).blocks_needed(n), 4);
    }

    #[test]
    fn readme_table_lists_every_hook() {
        let readme = include_str!("../../../../README.md");
        for k in KINDS {
            let name = match k.scope {
                Scope::Block => format!("`blocks.{{i}}.{}`", k.name),
                _ => format!("`{}`", k.name),
            };
            let row = readme
                .lines()
                .find(|l| l.starts_with(&format!("| {name} |")))
                .unwrap_or_else(|| panic!("README's hook table has no row for {name}"));
            for alias in k.aliases {
                assert!(row.contains(&format!("`{alias}`")), "README row {name} lacks alias {alias}");
            }
            let shape = match k.shape {
                HookShape::Model => "[d_model]",
                HookShape::Mlp => "[d_mlp]",
                HookShape::Scale => "[1]",
                HookShape::QHeads => "[n_heads, d_head]",
                HookShape::KvHeads => "[n_kv_heads, d_head]",
                HookShape::QHeadScale => "[n_heads, 1]",
                HookShape::KvHeadScale => "[n_kv_heads, 1]",
                HookShape::Experts => "[n_experts]",
                HookShape::TopK => "[top_k]",
                HookShape::QNorm => "[n_heads, d_head]",
                HookShape::KvNorm => "[n_kv_heads, d_head]",
                HookShape::Pattern => "[n_heads, seq]",
                HookShape::PerLayer => "[d_per_layer]",
                HookShape::QProj => "[n_heads, d_head]",
                HookShape::QWidth => "[n_heads·d_head]",
                HookShape::LinKeyHeads => "[nk, dk]",
                HookShape::LinValueHeads => "[nv, dv]",
                HookShape::LinHeads => "[nv]",
                HookShape::SharedMlp => "[d_shared]",
                HookShape::QLatent => "[q_lora_rank]",
                HookShape::KvLatent => "[kv_lora_rank]",
                HookShape::KvLatentRope => "[kv_lora_rank + d_rope]",
                HookShape::MlaQueries => "[n_heads·(d_nope + d_rope)]",
                HookShape::MlaKeysValues => "[n_heads·(d_nope + d_v)]",
            };
            assert!(row.contains(&format!("`{shape}`")), "README row {name} should say {shape}");
        }
    }

    #[test]
    fn shapes_follow_the_config() {
        let c = config();
        let dims = |k: HookKind| HookPoint::block(0, k).dims(&c, 7);
        assert_eq!(dims(HookKind::ResidMid), [16]);
        assert_eq!(dims(HookKind::MlpPost), [24]);
        assert_eq!(dims(HookKind::Ln2Scale), [1]);
        assert_eq!(dims(HookKind::AttnZ), [4, 4]);
        assert_eq!(dims(HookKind::AttnK), [2, 4]);
        assert_eq!(dims(HookKind::AttnPattern), [4, 7]);
        // LayerShape that differ by layer (Gemma 4's global layers), and the per-layer width.
        let plain = crate::config::LayerShape { head_dim: 4, n_kv_heads: 2, intermediate_size: 24 };
        let wide = crate::config::LayerShape { head_dim: 8, n_kv_heads: 1, intermediate_size: 48 };
        let mut c = of(crate::gemma4::ARCH);
        let shapes = [plain, wide, wide, wide];
        c.layers = c.layers.with(4, |layer, spec| spec.shape = Some(shapes[layer]));
        let at = |layer, k: HookKind| HookPoint::block(layer, k).dims(&c, 7);
        assert_eq!(
            (at(0, HookKind::AttnK), at(1, HookKind::AttnK), at(1, HookKind::AttnQ)),
            (vec![2, 4], vec![1, 8], vec![4, 8])
        );
        assert_eq!(
            (at(0, HookKind::MlpPost), at(3, HookKind::MlpPost), at(2, HookKind::PleGate)),
            (vec![24], vec![48], vec![4])
        );
        // A block that attends over another's keys and values has none of its own hooks.
        c.layers = c.layers.with(4, |layer, spec| spec.kv_source = [None, None, Some(0), Some(1)][layer]);
        assert!(
            !layer_hook_kinds(&c, 2).contains(&HookKind::AttnK) && layer_hook_kinds(&c, 2).contains(&HookKind::AttnQ)
        );
        let err = HookPoint::parse("blocks.3.attn.hook_v", &c).unwrap_err().to_string();
        assert!(err.contains("block 1's keys and values") && err.contains("blocks.1.attn.hook_v"), "{err}");
        let hooks = resolve_hooks("blocks.*.*", &c).unwrap();
        assert!(
            hooks.contains(&HookPoint::block(0, HookKind::AttnK))
                && !hooks.contains(&HookPoint::block(2, HookKind::AttnK))
        );
    }
}
