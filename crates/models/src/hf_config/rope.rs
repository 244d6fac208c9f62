//! RoPE as `config.json` states it: `rope_theta` and `partial_rotary_factor` at the top, and
//! an object (`rope_scaling`, or transformers 5's `rope_parameters`, which holds the base and
//! the fraction too) naming its `rope_type` and that type's parameters; Gemma 3's, Gemma 4's
//! and OLMo 3's `rope_parameters` keyed by layer type. Read strictly ([`RopeObject`]): every key
//! with its type checked, and a key siphon does not read for the object's type refused by name
//! (transformers 5 lists each type's keys in `modeling_rope_utils.py`, its
//! `_validate_*_rope_parameters`), so that no setting is dropped unread. The ranges the values
//! must fall in are the validated [`Rope`]'s (`config/rope.rs`).

use std::cell::RefCell;

use serde_json::{Map, Value};

use crate::arch::Arch;
use crate::config::{Rope, RopeScaling};
use crate::error::ModelError;

use super::{Defaults, HfConfig};

/// One RoPE object of `config.json`, its keys read through typed getters that note each key
/// asked for; [`RopeObject::finish`] refuses the keys present that nothing asked for.
pub(crate) struct RopeObject<'a> {
    /// Where it is, for messages (`rope_parameters`, `rope_parameters.sliding_attention`).
    at: String,
    map: &'a Map<String, Value>,
    asked: RefCell<Vec<&'static str>>,
}

impl<'a> RopeObject<'a> {
    /// The object `value` found under `at`; `None` when absent or null.
    pub(crate) fn of(at: impl Into<String>, value: Option<&'a Value>) -> Result<Option<RopeObject<'a>>, ModelError> {
        let at = at.into();
        match value.unwrap_or(&Value::Null) {
            Value::Null => Ok(None),
            Value::Object(map) => Ok(Some(RopeObject { at, map, asked: RefCell::new(Vec::new()) })),
            other => Err(ModelError::Config(format!("{at} {} is not an object", shown(other)))),
        }
    }

    /// The value of `key`, noted as read; `None` when absent or null.
    fn get(&self, key: &'static str) -> Option<&'a Value> {
        self.asked.borrow_mut().push(key);
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// An error naming `key` and its value, which is not `what`.
    fn wrong(&self, key: &str, value: &Value, what: &str) -> ModelError {
        ModelError::Config(format!("{}.{key} {} is not {what}", self.at, shown(value)))
    }

    /// The number under `key`.
    pub(crate) fn number(&self, key: &'static str) -> Result<Option<f64>, ModelError> {
        self.get(key).map(|v| v.as_f64().ok_or_else(|| self.wrong(key, v, "a number"))).transpose()
    }

    /// The number under `key`, which the type needs.
    pub(crate) fn required(&self, key: &'static str) -> Result<f64, ModelError> {
        self.number(key)?.ok_or_else(|| ModelError::Config(format!("{} lacks {key}", self.at)))
    }

    /// The non-negative integer under `key`.
    fn count(&self, key: &'static str) -> Result<Option<usize>, ModelError> {
        let count = |v: &Value| v.as_u64().and_then(|n| usize::try_from(n).ok());
        self.get(key).map(|v| count(v).ok_or_else(|| self.wrong(key, v, "a non-negative integer"))).transpose()
    }

    /// The boolean under `key`.
    fn flag(&self, key: &'static str) -> Result<Option<bool>, ModelError> {
        self.get(key).map(|v| v.as_bool().ok_or_else(|| self.wrong(key, v, "true or false"))).transpose()
    }

    /// The list of numbers under `key`, which the type needs.
    fn numbers(&self, key: &'static str) -> Result<Vec<f64>, ModelError> {
        let v = self.get(key).ok_or_else(|| ModelError::Config(format!("{} lacks {key}", self.at)))?;
        let list = v.as_array().ok_or_else(|| self.wrong(key, v, "a list of numbers"))?;
        list.iter().map(|x| x.as_f64().ok_or_else(|| self.wrong(key, x, "a number (in a list)"))).collect()
    }

    /// Notes `keys` as read: settings that change nothing siphon computes.
    fn no_effect(&self, keys: &[&'static str]) {
        self.asked.borrow_mut().extend(keys);
    }

    /// The type: `rope_type`, or the older `type`; `default` when neither is given.
    pub(crate) fn kind(&self) -> Result<&'a str, ModelError> {
        let name = |key: &'static str| {
            self.get(key).map(|v| v.as_str().ok_or_else(|| self.wrong(key, v, "a string"))).transpose()
        };
        match (name("rope_type")?, name("type")?) {
            (Some(a), Some(b)) if a != b => {
                Err(ModelError::Config(format!("{} gives rope_type {a:?} and type {b:?}", self.at)))
            }
            (kind, other) => Ok(kind.or(other).unwrap_or("default")),
        }
    }

    /// Refuses a key present that nothing read: a setting siphon does not build is never
    /// dropped.
    pub(crate) fn finish(self, kind: &str) -> Result<(), ModelError> {
        let asked = self.asked.into_inner();
        match self.map.keys().find(|key| !asked.contains(&key.as_str())) {
            None => Ok(()),
            Some(key) => {
                let mut read: Vec<&str> = Vec::new();
                for key in asked.into_iter().filter(|k| *k != "type") {
                    if !read.contains(&key) {
                        read.push(key);
                    }
                }
                Err(ModelError::UnsupportedArch(format!(
                    "{}.{key}: not a setting siphon reads for rope_type {kind:?} (it reads {})",
                    self.at,
                    read.join(", ")
                )))
            }
        }
    }
}

/// A JSON value for a message, cut short when long.
fn shown(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(60) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text,
    }
}

/// The context lengths and rotated width a scaling type's parameters are read against.
struct Context {
    /// `max_position_embeddings`.
    max_positions: usize,
    /// The top-level `original_max_position_embeddings` (Phi-3), which wins over the object's.
    original_max: Option<usize>,
    /// Dimensions of each head RoPE rotates (LongRoPE has a factor per pair).
    rotary_dim: usize,
}

impl HfConfig {
    /// The RoPE object: `rope_parameters`, else `rope_scaling` (transformers 5 reads the one
    /// like the other); both, differing, are refused.
    pub(crate) fn rope_object(&self) -> Result<Option<RopeObject<'_>>, ModelError> {
        let parameters = RopeObject::of("rope_parameters", self.rope_parameters.as_ref())?;
        match (parameters, RopeObject::of("rope_scaling", self.rope_scaling.as_ref())?) {
            (Some(p), Some(s)) if p.map != s.map => {
                Err(ModelError::Config("config.json gives both rope_parameters and rope_scaling, differing".into()))
            }
            (Some(p), _) => Ok(Some(p)),
            (None, s) => Ok(s),
        }
    }

    /// RoPE for heads `head_dim` wide: the base, rotated width and scaling of the RoPE object,
    /// else of the top-level keys, else the family's `defaults` and the whole head unscaled.
    pub(crate) fn rope(&self, arch: Arch, head_dim: usize, defaults: &Defaults) -> Result<Rope, ModelError> {
        let default_theta = defaults.rope_theta;
        let Some(object) = self.rope_object()? else {
            return self.rope_from(None, None, head_dim, default_theta, |_| Ok(None));
        };
        object.no_effect(defaults.rope_no_effect);
        if object.map.contains_key("full_attention") || object.map.contains_key("sliding_attention") {
            return Err(ModelError::UnsupportedArch(format!(
                "{} per layer type in a {arch} config (siphon reads them only where the family's modeling file does)",
                object.at
            )));
        }
        let kind = object.kind()?;
        let theta = object.number("rope_theta")?;
        // Proportional RoPE reads the fraction itself: it rotates the whole head.
        let fraction = if kind == "proportional" { None } else { object.number("partial_rotary_factor")? };
        let rope =
            self.rope_from(theta, fraction, head_dim, default_theta, |context| scaling(&object, kind, context))?;
        object.finish(kind)?;
        Ok(rope)
    }

    /// RoPE from the object's base and fraction (else the top-level ones) and its scaling,
    /// read by `scaling` against the context lengths and the rotated width.
    fn rope_from(
        &self,
        theta: Option<f64>,
        fraction: Option<f64>,
        head_dim: usize,
        default_theta: f64,
        scaling: impl FnOnce(&Context) -> Result<Option<RopeScaling>, ModelError>,
    ) -> Result<Rope, ModelError> {
        let rotary_dim = match fraction.or(self.partial_rotary_factor) {
            // Hugging Face: int(head_dim * fraction), of a fraction in (0, 1].
            Some(f) if f > 0.0 && f < 1.0 => Some((head_dim as f64 * f) as usize),
            Some(1.0) => None,
            Some(f) => return Err(ModelError::Config(format!("partial_rotary_factor {f} is not in (0, 1]"))),
            None => None,
        };
        let context = Context {
            max_positions: self.max_positions(),
            original_max: self.original_max_position_embeddings,
            rotary_dim: rotary_dim.unwrap_or(head_dim),
        };
        Ok(Rope {
            theta: theta.or(self.rope_theta).unwrap_or(default_theta),
            scaling: scaling(&context)?,
            rotary_dim,
            local_theta: None,
        })
    }

    /// The RoPE base of the sliding-window layers, which take no frequency scaling (Gemma 3,
    /// OLMo 3): from transformers ≥5's `rope_parameters` keyed by layer type, whose
    /// `full_attention` entry then stands as the model's RoPE; `local` when not given there.
    pub(crate) fn rope_by_layer_type(&mut self, arch: Arch, local: f64) -> Result<f64, ModelError> {
        let Some(Value::Object(by_type)) = &self.rope_parameters else { return Ok(local) };
        if !by_type.contains_key("full_attention") && !by_type.contains_key("sliding_attention") {
            return Ok(local);
        }
        if let Some(key) = by_type.keys().find(|k| !matches!(k.as_str(), "full_attention" | "sliding_attention")) {
            return Err(ModelError::UnsupportedArch(format!(
                "rope_parameters.{key}: {arch} reads RoPE for the layer types full_attention and sliding_attention"
            )));
        }
        let mut theta = local;
        if let Some(params) = RopeObject::of("rope_parameters.sliding_attention", by_type.get("sliding_attention"))? {
            let kind = params.kind()?;
            if kind != "default" {
                return Err(ModelError::UnsupportedArch(format!(
                    "rope_type {kind:?} on {arch}'s sliding-window layers (only default)"
                )));
            }
            theta = params.number("rope_theta")?.unwrap_or(local);
            params.finish(kind)?;
        }
        self.rope_parameters = by_type.get("full_attention").cloned();
        Ok(theta)
    }
}

/// The frequency scaling of a RoPE object of type `kind`, its parameters read as Hugging
/// Face's `_compute_*_parameters` read them; `None` for the default type.
fn scaling(o: &RopeObject<'_>, kind: &str, context: &Context) -> Result<Option<RopeScaling>, ModelError> {
    let original = |kind: &str| -> Result<usize, ModelError> {
        let inside = o.count("original_max_position_embeddings")?;
        context.original_max.or(inside).ok_or_else(|| {
            ModelError::Config(format!("{kind} scaling without original_max_position_embeddings ({})", o.at))
        })
    };
    Ok(Some(match kind {
        "default" => return Ok(None),
        "llama3" => RopeScaling::Llama3 {
            factor: o.required("factor")?,
            low_freq_factor: o.required("low_freq_factor")?,
            high_freq_factor: o.required("high_freq_factor")?,
            original_max_position_embeddings: original(kind)?,
        },
        "linear" => RopeScaling::Linear { factor: o.required("factor")? },
        "proportional" => RopeScaling::Proportional {
            fraction: o.number("partial_rotary_factor")?.unwrap_or(1.0),
            factor: o.number("factor")?.unwrap_or(1.0),
        },
        "yarn" => yarn(o, original(kind)?, context)?,
        "longrope" | "su" => longrope(o, original(kind)?, context)?,
        other => {
            return Err(ModelError::UnsupportedArch(format!(
                "{} rope_type {other:?} (supported: default, llama3, linear, longrope, proportional, yarn)",
                o.at
            )));
        }
    }))
}

/// YaRN as Hugging Face's `_compute_yarn_parameters` reads it: the factor from the context
/// lengths when absent, the attention factor from the factor and the mscales when absent, the
/// betas 32 and 1 when absent or 0.
fn yarn(o: &RopeObject<'_>, original: usize, context: &Context) -> Result<RopeScaling, ModelError> {
    let factor = o.number("factor")?.unwrap_or(context.max_positions as f64 / original as f64);
    let mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
    let attention_factor = match (o.number("attention_factor")?, o.number("mscale")?, o.number("mscale_all_dim")?) {
        (Some(a), _, _) => a,
        (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => mscale(factor, m) / mscale(factor, all),
        _ => mscale(factor, 1.0),
    };
    let nonzero = |x: Option<f64>| x.filter(|&x| x != 0.0);
    Ok(RopeScaling::Yarn {
        factor,
        beta_fast: nonzero(o.number("beta_fast")?).unwrap_or(32.0),
        beta_slow: nonzero(o.number("beta_slow")?).unwrap_or(1.0),
        original_max_position_embeddings: original,
        truncate: o.flag("truncate")?.unwrap_or(true),
        attention_factor,
    })
}

/// LongRoPE as Hugging Face's `_compute_longrope_parameters` reads it: a factor per rotated
/// pair in each list, the attention factor from `factor` (else the ratio of the context
/// lengths) when absent.
fn longrope(o: &RopeObject<'_>, original: usize, context: &Context) -> Result<RopeScaling, ModelError> {
    let factors = |name: &'static str| -> Result<Vec<f64>, ModelError> {
        let list = o.numbers(name)?;
        let pairs = context.rotary_dim / 2;
        match list.len() == pairs {
            true => Ok(list),
            false => Err(ModelError::Config(format!(
                "{}.{name} has {} numbers, the rotary width {} needs {pairs}",
                o.at,
                list.len(),
                context.rotary_dim
            ))),
        }
    };
    factors("long_factor")?;
    let factor = o.number("factor")?.unwrap_or(context.max_positions as f64 / original as f64);
    let attention_factor = match o.number("attention_factor")? {
        Some(a) => a,
        None if factor <= 1.0 => 1.0,
        None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
    };
    Ok(RopeScaling::LongRope {
        short_factor: factors("short_factor")?,
        original_max_position_embeddings: original,
        attention_factor,
    })
}
