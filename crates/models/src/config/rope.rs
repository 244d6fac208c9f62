//! RoPE's settings: its base, the frequency scaling of long-context checkpoints, the base of
//! sliding-window layers, and the width it rotates; the inverse frequencies they give, as
//! Hugging Face computes them ([`Rope::frequencies`]), and the ranges that keep those finite
//! and meaningful ([`Rope::check`]: bases and factors positive, Llama 3's high frequency factor
//! above its low one, YaRN's fast end above its slow one, the frequencies themselves finite).

use serde::{Deserialize, Serialize};

use super::{positive, positive_count};
use crate::error::ModelError;

/// RoPE's settings; serialized flat in the configuration, under the names `run.json` has
/// always held.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Rope {
    /// The base.
    #[serde(rename = "rope_theta")]
    pub theta: f64,
    /// Frequency scaling, if any.
    #[serde(rename = "rope_scaling")]
    pub scaling: Option<RopeScaling>,
    /// The base of the sliding-window layers, which take no frequency scaling (Gemma 3);
    /// `None`: every layer uses `theta` and `scaling`.
    #[serde(rename = "local_rope_theta", default, skip_serializing_if = "Option::is_none")]
    pub local_theta: Option<f64>,
    /// Leading dimensions of each head that RoPE rotates (GPT-NeoX's `rotary_pct`, Phi-3's
    /// `partial_rotary_factor`); `None`: all of `head_dim`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotary_dim: Option<usize>,
}

/// RoPE frequency scaling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RopeScaling {
    /// Llama 3's piecewise scaling of long wavelengths.
    Llama3 {
        /// Overall scale factor.
        factor: f64,
        /// Wavelengths shorter than `original_max / high_freq_factor` are kept.
        low_freq_factor: f64,
        /// Wavelengths longer than `original_max / low_freq_factor` are divided by `factor`.
        high_freq_factor: f64,
        /// Context length the model was pre-trained with.
        original_max_position_embeddings: usize,
    },
    /// Plain linear position interpolation: positions divided by `factor`.
    Linear {
        /// Scale factor.
        factor: f64,
    },
    /// Gemma 4's proportional RoPE: rotate-half over the whole head, the first
    /// `int(fraction * head_dim / 2)` frequencies `theta^(-2i / head_dim)` and the others 0
    /// (those pairs pass unrotated), every frequency divided by `factor`.
    Proportional {
        /// `partial_rotary_factor`.
        fraction: f64,
        /// `factor` (1 when absent).
        factor: f64,
    },
    /// YaRN (GPT-OSS; DeepSeek-V3's and Qwen's long contexts): each frequency blended
    /// between itself and itself / `factor` by a linear ramp over the frequencies that turn
    /// `beta_fast` … `beta_slow` times in `original_max_position_embeddings` positions (the
    /// ramp's ends rounded outward when `truncate`); cos and sin multiplied by
    /// `attention_factor`.
    Yarn {
        /// Context extension factor.
        factor: f64,
        /// Rotations marking the ramp's fast end (32 by default).
        beta_fast: f64,
        /// Rotations marking the ramp's slow end (1 by default).
        beta_slow: f64,
        /// Context length the model was pre-trained with.
        original_max_position_embeddings: usize,
        /// Whether the ramp's ends are rounded to whole frequencies.
        truncate: bool,
        /// Multiplies cos and sin.
        attention_factor: f64,
    },
    /// Phi-3's LongRoPE with the short factors (the ones Hugging Face uses while the batch
    /// is no longer than `original_max_position_embeddings`, which siphon requires): each
    /// frequency divided by its factor, cos and sin multiplied by `attention_factor`.
    LongRope {
        /// One factor per frequency (`rotary_dim / 2`).
        short_factor: Vec<f64>,
        /// Context length the factors were fitted for; longer sequences are refused.
        original_max_position_embeddings: usize,
        /// Multiplies cos and sin.
        attention_factor: f64,
    },
}

impl Rope {
    /// The inverse frequencies and the cos/sin scale of a block whose heads are `head_dim`
    /// wide: the local base's, unscaled, on a sliding-window (`windowed`) layer of a family
    /// that has one, else the model's base with its scaling over the rotated width (YaRN's and
    /// LongRoPE's attention factor scaling cos and sin).
    pub(crate) fn frequencies(&self, head_dim: usize, windowed: bool) -> (Vec<f32>, f64) {
        if let Some(theta) = self.local_theta.filter(|_| windowed) {
            return (inv_freq(head_dim, theta, None), 1.0);
        }
        let scale = match &self.scaling {
            Some(RopeScaling::Yarn { attention_factor, .. } | RopeScaling::LongRope { attention_factor, .. }) => {
                *attention_factor
            }
            _ => 1.0,
        };
        (inv_freq(self.rotary_dim.unwrap_or(head_dim), self.theta, self.scaling.as_ref()), scale)
    }

    /// Checks the settings against the ranges Hugging Face's computation needs for finite,
    /// meaningful frequencies, then the frequencies themselves for heads of each of
    /// `head_dims`: a value derived from valid-looking ones that is not finite is refused too.
    pub(crate) fn check(&self, head_dims: &[usize]) -> Result<(), ModelError> {
        positive("rope_theta (the RoPE base)", self.theta)?;
        if let Some(theta) = self.local_theta {
            positive("the sliding-window layers' RoPE base (rope_local_base_freq)", theta)?;
        }
        if self.rotary_dim == Some(0) {
            return Err(ModelError::Config("partial_rotary_factor rotates no dimension of a head".into()));
        }
        if let Some(scaling) = &self.scaling {
            scaling.check()?;
        }
        // The model's frequencies, and the sliding-window layers' where they have their own.
        let kinds = [false].into_iter().chain(self.local_theta.map(|_| true));
        for windowed in kinds {
            for &head_dim in head_dims {
                let (inv_freq, _) = self.frequencies(head_dim, windowed);
                if let Some(f) = inv_freq.iter().find(|f| !f.is_finite()) {
                    let which = if windowed { "the sliding-window layers' RoPE" } else { "RoPE and its scaling" };
                    return Err(ModelError::Config(format!(
                        "{which} give the inverse frequency {f} for heads {head_dim} wide (base {}, local base {:?})",
                        self.theta, self.local_theta
                    )));
                }
            }
        }
        Ok(())
    }
}

impl RopeScaling {
    /// Checks each parameter's range, naming it with the scaling's type.
    fn check(&self) -> Result<(), ModelError> {
        let name = |kind: &str, key: &str| format!("RoPE scaling ({kind}) {key}");
        match self {
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                positive(&name("llama3", "factor"), *factor)?;
                positive(&name("llama3", "low_freq_factor"), *low_freq_factor)?;
                positive(&name("llama3", "high_freq_factor"), *high_freq_factor)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(ModelError::Config(format!(
                        "{} {high_freq_factor} must be above low_freq_factor {low_freq_factor}",
                        name("llama3", "high_freq_factor")
                    )));
                }
                positive_count(&name("llama3", "original_max_position_embeddings"), *original_max_position_embeddings)
            }
            RopeScaling::Linear { factor } => positive(&name("linear", "factor"), *factor).map(drop),
            RopeScaling::Proportional { fraction, factor } => {
                positive(&name("proportional", "factor"), *factor)?;
                match (0.0..=1.0).contains(fraction) {
                    true => Ok(()),
                    false => Err(ModelError::Config(format!(
                        "{} {fraction} is not in [0, 1]",
                        name("proportional", "partial_rotary_factor")
                    ))),
                }
            }
            RopeScaling::Yarn {
                factor,
                beta_fast,
                beta_slow,
                original_max_position_embeddings,
                attention_factor,
                ..
            } => {
                positive(&name("yarn", "factor"), *factor)?;
                positive(&name("yarn", "beta_fast"), *beta_fast)?;
                positive(&name("yarn", "beta_slow"), *beta_slow)?;
                if beta_fast < beta_slow {
                    return Err(ModelError::Config(format!(
                        "{} {beta_fast} is below beta_slow {beta_slow}",
                        name("yarn", "beta_fast")
                    )));
                }
                positive(&name("yarn", "attention_factor (given or from factor and the mscales)"), *attention_factor)?;
                positive_count(&name("yarn", "original_max_position_embeddings"), *original_max_position_embeddings)
            }
            RopeScaling::LongRope { short_factor, original_max_position_embeddings, attention_factor } => {
                for f in short_factor {
                    positive(&name("longrope", "short_factor entry"), *f)?;
                }
                positive(&name("longrope", "attention_factor (given or from the context lengths)"), *attention_factor)?;
                positive_count(&name("longrope", "original_max_position_embeddings"), *original_max_position_embeddings)
            }
        }
    }
}

/// Inverse frequencies of a `d`-wide head for base `theta` with `scaling`.
fn inv_freq(d: usize, theta: f64, scaling: Option<&RopeScaling>) -> Vec<f32> {
    let base = theta as f32;
    let inv: Vec<f32> = (0..d).step_by(2).map(|i| 1.0 / base.powf(i as f32 / d as f32)).collect();
    match scaling {
        None => inv,
        Some(RopeScaling::Linear { factor }) => inv.iter().map(|f| f / *factor as f32).collect(),
        // Hugging Face's _compute_proportional_rope_parameters: int(fraction * d // 2) rotated
        // frequencies, zeros for the rest, all divided by the factor.
        Some(RopeScaling::Proportional { fraction, factor }) => {
            let rotated = (fraction * d as f64 / 2.0).floor() as usize;
            inv.iter().enumerate().map(|(i, f)| if i < rotated { f / *factor as f32 } else { 0.0 }).collect()
        }
        // 1 / (factor * base^(i/d)), in f32 as Hugging Face computes it.
        Some(RopeScaling::LongRope { short_factor, .. }) => (0..d)
            .step_by(2)
            .zip(short_factor)
            .map(|(i, &f)| 1.0 / (f as f32 * base.powf(i as f32 / d as f32)))
            .collect(),
        // Hugging Face's _compute_yarn_parameters, its tensor arithmetic in f32.
        Some(RopeScaling::Yarn {
            factor, beta_fast, beta_slow, original_max_position_embeddings, truncate, ..
        }) => {
            let dim = d as f64;
            let correction = |rotations: f64| {
                let max = *original_max_position_embeddings as f64;
                dim * (max / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
            };
            let (mut low, mut high) = (correction(*beta_fast), correction(*beta_slow));
            if *truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
            if low == high {
                high += 0.001;
            }
            (0..d)
                .step_by(2)
                .enumerate()
                .map(|(j, i)| {
                    let pos = base.powf(i as f32 / d as f32);
                    let (extrapolated, interpolated) = (1.0 / pos, 1.0 / (*factor as f32 * pos));
                    let ramp = ((j as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
                    let keep = 1.0 - ramp;
                    interpolated * (1.0 - keep) + extrapolated * keep
                })
                .collect()
        }
        Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
            let (factor, low, high) = (*factor, *low_freq_factor, *high_freq_factor);
            let old = *original_max_position_embeddings as f64;
            let low_wavelen = old / low;
            let high_wavelen = old / high;
            inv.iter()
                .map(|&f| {
                    let f = f as f64;
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    let scaled = if wavelen > low_wavelen { f / factor } else { f };
                    // HF's `~(wavelen < high) * ~(wavelen > low)`; wavelengths are finite, so >= is the same.
                    let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                    if medium {
                        let smooth = (old / wavelen - low) / (high - low);
                        ((1.0 - smooth) * scaled / factor + smooth * scaled) as f32
                    } else {
                        scaled as f32
                    }
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama3(factor: f64, low: f64, high: f64) -> Rope {
        let scaling = RopeScaling::Llama3 {
            factor,
            low_freq_factor: low,
            high_freq_factor: high,
            original_max_position_embeddings: 8192,
        };
        Rope { theta: 500000.0, scaling: Some(scaling), ..Rope::default() }
    }

    #[test]
    fn llama3_scaling_matches_hf_formula() {
        let plain = Rope { theta: 500000.0, ..Rope::default() }.frequencies(64, false).0;
        let scaled = llama3(8.0, 1.0, 4.0).frequencies(64, false).0;
        // High frequencies (short wavelengths) untouched, the lowest divided by the factor.
        assert_eq!(scaled[0], plain[0]);
        assert!((scaled[31] - plain[31] / 8.0).abs() <= 1e-6 * plain[31]);
        // Medium band lies strictly between.
        let mid = (0..32).find(|&i| scaled[i] != plain[i] && (scaled[i] - plain[i] / 8.0).abs() > 1e-12).unwrap();
        assert!(scaled[mid] < plain[mid] && scaled[mid] > plain[mid] / 8.0);
    }

    fn yarn(factor: f64, beta_fast: f64, beta_slow: f64, attention_factor: f64) -> Rope {
        let scaling = RopeScaling::Yarn {
            factor,
            beta_fast,
            beta_slow,
            original_max_position_embeddings: 4096,
            truncate: true,
            attention_factor,
        };
        Rope { theta: 150000.0, scaling: Some(scaling), ..Rope::default() }
    }

    /// Every value out of its range is refused naming it; the edge values that Hugging Face
    /// computes finitely pass.
    #[test]
    fn each_parameter_is_checked_for_its_range() {
        let err = |rope: Rope| rope.check(&[64]).unwrap_err().to_string();
        assert!(llama3(8.0, 1.0, 4.0).check(&[64, 128]).is_ok());
        assert!(yarn(32.0, 32.0, 1.0, 1.3).check(&[64]).is_ok());
        for (rope, named) in [
            (Rope { theta: -1.0, ..Rope::default() }, "rope_theta (the RoPE base) -1"),
            (Rope { theta: 0.0, ..Rope::default() }, "rope_theta (the RoPE base) 0"),
            (Rope { theta: f64::NAN, ..Rope::default() }, "rope_theta (the RoPE base) NaN"),
            (Rope { theta: 1e4, local_theta: Some(-5.0), ..Rope::default() }, "rope_local_base_freq) -5"),
            (Rope { theta: 1e4, rotary_dim: Some(0), ..Rope::default() }, "rotates no dimension"),
            (llama3(0.0, 1.0, 4.0), "(llama3) factor 0"),
            (llama3(8.0, 0.0, 4.0), "(llama3) low_freq_factor 0"),
            (llama3(8.0, 4.0, 4.0), "high_freq_factor 4 must be above low_freq_factor 4"),
            (llama3(8.0, 4.0, 1.0), "high_freq_factor 1 must be above low_freq_factor 4"),
            (llama3(f64::INFINITY, 1.0, 4.0), "(llama3) factor inf"),
            (yarn(0.0, 32.0, 1.0, 1.0), "(yarn) factor 0"),
            (yarn(32.0, -1.0, 1.0, 1.0), "(yarn) beta_fast -1"),
            (yarn(32.0, 32.0, 0.0, 1.0), "(yarn) beta_slow 0"),
            (yarn(32.0, 1.0, 32.0, 1.0), "beta_fast 1 is below beta_slow 32"),
            (yarn(32.0, 32.0, 1.0, 0.0), "attention_factor"),
        ] {
            let e = err(rope);
            assert!(e.contains(named), "{named}: {e}");
        }
        let rope = |scaling| Rope { theta: 1e4, scaling: Some(scaling), ..Rope::default() };
        let cases = [
            (RopeScaling::Linear { factor: -2.0 }, "(linear) factor -2"),
            (RopeScaling::Proportional { fraction: 0.25, factor: 0.0 }, "(proportional) factor 0"),
            (RopeScaling::Proportional { fraction: 1.5, factor: 1.0 }, "partial_rotary_factor 1.5 is not in [0, 1]"),
            (
                RopeScaling::LongRope {
                    short_factor: vec![1.0; 31].into_iter().chain([0.0]).collect(),
                    original_max_position_embeddings: 4096,
                    attention_factor: 1.2,
                },
                "short_factor entry 0",
            ),
            (
                RopeScaling::LongRope {
                    short_factor: vec![1.0; 32],
                    original_max_position_embeddings: 0,
                    attention_factor: 1.2,
                },
                "original_max_position_embeddings 0",
            ),
        ];
        for (scaling, named) in cases {
            let e = err(rope(scaling));
            assert!(e.contains(named), "{named}: {e}");
        }
        // Proportional RoPE may leave every pair unrotated, as Hugging Face allows.
        assert!(rope(RopeScaling::Proportional { fraction: 0.0, factor: 1.0 }).check(&[64]).is_ok());
    }

    /// A frequency that comes out infinite from values each in range is refused too.
    #[test]
    fn a_derived_frequency_that_is_not_finite_is_refused() {
        // 1 / (f · base^x) with a factor so small the product underflows to 0.
        let scaling = RopeScaling::LongRope {
            short_factor: vec![1e-300; 32],
            original_max_position_embeddings: 4096,
            attention_factor: 1.0,
        };
        let err = Rope { theta: 1e4, scaling: Some(scaling), ..Rope::default() }.check(&[64]).unwrap_err();
        assert!(err.to_string().contains("inverse frequency inf"), "{err}");
    }
}
