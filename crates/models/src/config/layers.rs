//! What each block is where a model's blocks differ: one [`LayerSpec`] per layer, kept as
//! [`Layers`] (empty when every block is the same). `run.json` holds them as it always has,
//! one list per setting, each left out when no layer sets it.

use serde::{Deserialize, Serialize};

/// One layer's sizes, where layers differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerShape {
    /// Width of one head.
    pub head_dim: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Width of the MLP's gate/up projections.
    pub intermediate_size: usize,
}

/// What one block is, where blocks differ; `Default` is a block like the model's others.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerSpec {
    /// Its sliding attention window (a query attends the keys less than this many positions
    /// back, itself included); `None`: full causal attention.
    pub window: Option<usize>,
    /// Its head width, key/value heads and MLP width where some layer's differ from the
    /// model's `head_dim`, `n_kv_heads` and `intermediate_size` (Gemma 4's global layers and
    /// its double-wide MLPs): then every layer has one.
    pub shape: Option<LayerShape>,
    /// The earlier layer whose keys and values it attends over instead of its own (Gemma 4's
    /// last `num_kv_shared_layers`).
    pub kv_source: Option<usize>,
    /// Its attention skips RoPE (SmolLM3's NoPE layers).
    pub skips_rope: bool,
}

/// Every layer's [`LayerSpec`], or none when every block is the same.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "Lists", try_from = "Lists")]
pub struct Layers(Vec<LayerSpec>);

impl Layers {
    /// Layer `layer`'s spec (the default one when the layers do not differ).
    pub fn get(&self, layer: usize) -> LayerSpec {
        self.0.get(layer).copied().unwrap_or_default()
    }

    /// Specs kept: the model's layer count, or 0 when its blocks do not differ.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether every block is the same.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every spec, in layer order.
    pub fn iter(&self) -> impl Iterator<Item = &LayerSpec> {
        self.0.iter()
    }

    /// Every layer's window, or none when no layer has one.
    pub fn windows(&self) -> Vec<Option<usize>> {
        list(&self.0, |s| s.window)
    }

    /// These layers with each of `n` set by `f` (from its spec so far); none kept when every
    /// one is left the default.
    pub fn with(mut self, n: usize, mut f: impl FnMut(usize, &mut LayerSpec)) -> Layers {
        self.0.resize(n.max(self.0.len()), LayerSpec::default());
        for (layer, spec) in self.0.iter_mut().enumerate() {
            f(layer, spec);
        }
        if self.0.iter().all(|s| *s == LayerSpec::default()) {
            self.0.clear();
        }
        self
    }
}

/// [`Layers`] as `run.json` holds them: a list per setting, empty (and left out) when no layer
/// sets it.
#[derive(Serialize, Deserialize)]
struct Lists {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    layer_windows: Vec<Option<usize>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    layer_shapes: Vec<LayerShape>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    kv_shared_from: Vec<Option<usize>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    rope_skipped: Vec<bool>,
}

impl From<Layers> for Lists {
    fn from(layers: Layers) -> Lists {
        let specs = &layers.0;
        Lists {
            layer_windows: layers.windows(),
            layer_shapes: specs.iter().filter_map(|s| s.shape).collect(),
            kv_shared_from: list(specs, |s| s.kv_source),
            rope_skipped: list(specs, |s| s.skips_rope),
        }
    }
}

/// One setting of every layer, or none when no layer sets it.
fn list<T: Default + PartialEq>(specs: &[LayerSpec], setting: impl Fn(&LayerSpec) -> T) -> Vec<T> {
    let all: Vec<T> = specs.iter().map(setting).collect();
    if all.iter().all(|v| *v == T::default()) { Vec::new() } else { all }
}

impl TryFrom<Lists> for Layers {
    type Error = String;

    fn try_from(lists: Lists) -> Result<Layers, String> {
        let lens = [
            ("layer_windows", lists.layer_windows.len()),
            ("layer_shapes", lists.layer_shapes.len()),
            ("kv_shared_from", lists.kv_shared_from.len()),
            ("rope_skipped", lists.rope_skipped.len()),
        ];
        let given: Vec<_> = lens.iter().filter(|(_, len)| *len > 0).collect();
        if given.windows(2).any(|w| w[0].1 != w[1].1) {
            return Err(format!("the per-layer lists disagree on the number of layers: {given:?}"));
        }
        let n = given.first().map_or(0, |(_, len)| *len);
        Ok(Layers::default().with(n, |layer, spec| {
            *spec = LayerSpec {
                window: lists.layer_windows.get(layer).copied().flatten(),
                shape: lists.layer_shapes.get(layer).copied(),
                kv_source: lists.kv_shared_from.get(layer).copied().flatten(),
                skips_rope: lists.rope_skipped.get(layer).copied().unwrap_or(false),
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_are_kept_as_the_lists_run_json_holds() {
        let json = r#"{"layer_windows":[4,null,4],"rope_skipped":[false,true,false]}"#;
        let layers: Layers = serde_json::from_str(json).unwrap();
        assert_eq!(layers.len(), 3);
        assert_eq!(layers.get(1), LayerSpec { skips_rope: true, ..LayerSpec::default() });
        assert_eq!(layers.get(2), LayerSpec { window: Some(4), ..LayerSpec::default() });
        assert_eq!(layers.get(7), LayerSpec::default());
        assert_eq!(serde_json::to_string(&layers).unwrap(), json);
        // Every block the same: no list at all.
        let same = Layers::default().with(3, |_, spec| spec.window = None);
        assert!(same.is_empty());
        assert_eq!(serde_json::to_string(&same).unwrap(), "{}");
        let err = serde_json::from_str::<Layers>(r#"{"layer_windows":[4,null],"rope_skipped":[true,false,true]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("disagree on the number of layers"), "{err}");
    }
}
