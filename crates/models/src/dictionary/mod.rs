//! Sparse dictionaries — SAEs and transcoders, as researchers publish them — in one form, one
//! room: the description ([`Dictionary`], here; [`DictionaryHook`] on the hook it reads, and
//! its results in a program, [`Latents`] and [`LatentsInfo`]), read from the formats' files by
//! [`Dictionary::open`] (`files.rs` and a file per format: [`saelens`], [`gemma_scope`],
//! [`sparsify`], [`llama_scope`]) and handed to the devices as [`host_tensors`], and built into
//! a program by [`encoder`] (its arguments, its ops, its results). A dictionary reads
//! one hook's value and gives each token's active latents.
//!
//! A [`Dictionary`] is the hook it reads (TransformerLens's name), its widths, its encoder and
//! the encoder's tensors in f32 under fixed names: `W_enc` `[d_in, d_sae]`, `b_enc` `[d_sae]`,
//! `b_dec` `[d_in]` (subtracted from the input where the format says so), `threshold`
//! `[d_sae]` (JumpReLU), `b_gate`, `r_mag`, `b_mag` `[d_sae]` (gated). The decoder is not
//! read: latents are all a latent cache needs. What a format holds that siphon does not
//! compute exactly (an input normalisation fitted on data, a rescaling by decoder norms) is
//! refused with an error naming it — unless the format's own loader folds it into the
//! encoder's weights, as Llama Scope's does; the reader then folds it the same way.
//!
//! The room stands in three of the crate's layers (`tests/layering.rs`): the description with
//! the configuration, the encoder with the program, the files' readers with the loading.

pub mod encoder;
mod files;
pub mod gemma_scope;
pub mod llama_scope;
pub mod saelens;
pub mod sparsify;

use std::path::PathBuf;
use std::sync::Arc;

use siphon_mesh::PartitionSpec;

pub use files::{decoder, host_tensors};

use crate::error::ModelError;
use crate::hooks::HookPoint;

/// How a dictionary turns the pre-activations `pre = x̃·W_enc + b_enc` into latents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoder {
    /// `relu(pre)`.
    Relu,
    /// `relu(pre) · (pre > threshold)`, one threshold per latent.
    JumpRelu,
    /// The `k` largest pre-activations (the lower latent first among ties), then `relu`.
    TopK {
        /// Latents kept per token.
        k: usize,
    },
    /// `(x̃·W_enc + b_gate > 0) · relu(x̃·(W_enc · exp(r_mag)) + b_mag)` (no `b_enc`).
    Gated,
}

/// How the hook's values are normalised per token before encoding (SAELens's
/// `normalize_activations` at inference).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Normalize {
    /// As they are.
    None,
    /// `x · √d_in / ‖x‖₂`.
    ConstantNorm,
    /// `(x − mean(x)) / (std(x) + 1e-5)`, `std` with Bessel's correction (torch's default).
    LayerNorm,
}

/// One of a dictionary's tensors, f32, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Its name in [`Dictionary`]'s scheme (`W_enc`, `b_enc`, …).
    pub name: &'static str,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its values.
    pub values: Vec<f32>,
}

impl Tensor {
    /// The latents of a torch `Linear` encoder's weight `[d_sae, d_in]` (sparsify's and
    /// lm-saes's `encoder.weight`); `Err` names a shape that is not `[d_sae, d_in]` (`d_in` as
    /// the format calls it: `input`).
    pub(crate) fn linear_latents(&self, d_in: usize, input: &str) -> Result<usize, String> {
        let shape = &self.shape;
        match shape[..] {
            [0, _] | [_, 0] => Err(format!("{} is {shape:?}: an empty encoder", self.name)),
            [d_sae, width] if width == d_in => Ok(d_sae),
            [_, _] => Err(format!("{} is {shape:?}, {input} is {d_in}", self.name)),
            _ => Err(format!("{} is {shape:?}, not [d_sae, {input}]", self.name)),
        }
    }

    /// A torch `Linear` encoder's weight `[d_sae, d_in]` ([`Tensor::linear_latents`] checked
    /// it) as the `W_enc` `[d_in, d_sae]` the encoder reads, each latent's row times
    /// `scale(latent)` (1 leaves it exact).
    pub(crate) fn linear_as_w_enc(&self, d_sae: usize, scale: impl Fn(usize) -> f64) -> Tensor {
        let d_in = self.values.len() / d_sae;
        let mut w_enc = vec![0.0; d_in * d_sae];
        for (latent, row) in self.values.chunks_exact(d_in).enumerate() {
            let factor = scale(latent);
            for (i, &v) in row.iter().enumerate() {
                w_enc[i * d_sae + latent] = (f64::from(v) * factor) as f32;
            }
        }
        Tensor { name: "W_enc", shape: vec![d_in, d_sae], values: w_enc }
    }
}

/// A sparse dictionary's encoder, ready to build into a program.
#[derive(Debug, Clone, PartialEq)]
pub struct Dictionary {
    /// A name that tells it from other dictionaries on the same hook (its directory's name
    /// unless given).
    pub name: String,
    /// The TransformerLens hook it reads (a transcoder's input hook).
    pub hook: String,
    /// The hook's width.
    pub d_in: usize,
    /// Its number of latents.
    pub d_sae: usize,
    /// How pre-activations become latents.
    pub encoder: Encoder,
    /// How the input is normalised first.
    pub normalize: Normalize,
    /// Whether `b_dec` is subtracted from the input (after normalising) before encoding.
    pub subtract_b_dec: bool,
    /// Whether it is a transcoder: its decoder writes another hook (the MLP's output) than
    /// the one it reads.
    pub transcoder: bool,
    /// The tensors the encoder reads, in the order a program takes them.
    pub tensors: Vec<Tensor>,
    /// Its decoder, `W_dec` `[d_sae, d_in]` then `b_dec` `[d_in]`, where its reconstruction is
    /// spliced into the forward ([`Dictionary::with_decoder`]); empty otherwise (latents alone
    /// need no decoder). A program takes them after [`Dictionary::tensors`].
    pub decoder: Vec<Tensor>,
    /// Where it was read from.
    pub source: PathBuf,
}

impl Dictionary {
    /// A dictionary of `encoder` that reads its hook's values as they are: no normalisation,
    /// `b_dec` not subtracted (a format that says otherwise sets those fields).
    pub(crate) fn new(
        name: String,
        hook: String,
        [d_in, d_sae]: [usize; 2],
        encoder: Encoder,
        tensors: Vec<Tensor>,
        source: &std::path::Path,
    ) -> Dictionary {
        let (normalize, subtract_b_dec, source) = (Normalize::None, false, source.to_path_buf());
        let (decoder, transcoder) = (Vec::new(), false);
        Dictionary { name, hook, d_in, d_sae, encoder, normalize, subtract_b_dec, transcoder, tensors, decoder, source }
    }

    /// The dictionary with its decoder read from `dir` (where [`Dictionary::open`] read it), to
    /// splice its reconstruction `latents · W_dec + b_dec` into the forward, as SAELens's
    /// `decode` computes it: in place of the hook's value for an SAE, of its block's MLP output
    /// for a transcoder (`W_dec` `[d_sae, d_out]`). Refused by name where that is not what the
    /// dictionary's own library computes: one that normalises its input (the reconstruction
    /// would need the normalisation undone), a skip transcoder (its `W_skip` term), or an
    /// SAE's decoder of another width than its hook.
    pub fn with_decoder(mut self, dir: &std::path::Path) -> Result<Dictionary, ModelError> {
        let refuse = |why: String| ModelError::Config(format!("splicing dictionary {}: {why}", self.name));
        if files::has_skip(dir)? {
            return Err(refuse("a skip transcoder's W_skip term is not spliced yet".into()));
        }
        if self.normalize != Normalize::None {
            return Err(refuse(format!(
                "it normalises its input ({:?}), which splicing does not undo yet",
                self.normalize
            )));
        }
        let [w_dec, b_dec] = files::decoder_tensors(dir)?;
        // A transcoder's output may be of another width than its input (the graph checks it
        // against the hook it writes).
        let d_out = if self.transcoder { w_dec.shape.get(1).copied().unwrap_or(0) } else { self.d_in };
        if w_dec.shape != [self.d_sae, d_out] || b_dec.shape != [d_out] || d_out == 0 {
            return Err(refuse(format!(
                "W_dec is {:?} and b_dec {:?}: its reconstruction is [{}, {d_out}] and [{d_out}]",
                w_dec.shape, b_dec.shape, self.d_sae
            )));
        }
        for t in [&w_dec, &b_dec] {
            if let Some(i) = t.values.iter().position(|v| !v.is_finite()) {
                return Err(ModelError::NonFinite {
                    name: t.name.into(),
                    path: self.source.clone(),
                    detail: format!("dictionary tensor holds {} (element {i} of {})", t.values[i], t.values.len()),
                });
            }
        }
        self.decoder = vec![w_dec, b_dec];
        Ok(self)
    }

    /// The width of what its decoder writes (its hook's for an SAE); `None` without a decoder.
    pub fn d_out(&self) -> Option<usize> {
        self.decoder.first().and_then(|w| w.shape.get(1).copied())
    }

    /// Every tensor a program takes, in its order: the encoder's, then the decoder's.
    pub fn program_tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.tensors.iter().chain(&self.decoder)
    }

    /// The tensor `name`.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The names its encoder reads, in program order, for `encoder`.
    pub fn tensor_names(encoder: Encoder, subtract_b_dec: bool) -> Vec<&'static str> {
        let mut names = vec!["W_enc"];
        match encoder {
            Encoder::Relu | Encoder::TopK { .. } => names.push("b_enc"),
            Encoder::JumpRelu => names.extend(["b_enc", "threshold"]),
            Encoder::Gated => names.extend(["b_gate", "r_mag", "b_mag"]),
        }
        if subtract_b_dec {
            names.push("b_dec");
        }
        names
    }

    /// Checks that the tensors are exactly those the encoder reads, each of its shape and
    /// finite (as its file holds it, or as siphon folds a format's scales into it): a NaN or
    /// an infinity would make every latent it reaches NaN, or never fire.
    pub(crate) fn check(&self) -> Result<(), ModelError> {
        let wrong = |detail: String| ModelError::Config(format!("dictionary {}: {detail}", self.source.display()));
        if self.d_in == 0 || self.d_sae == 0 {
            return Err(wrong(format!("d_in {} and d_sae {} must be positive", self.d_in, self.d_sae)));
        }
        let names = Dictionary::tensor_names(self.encoder, self.subtract_b_dec);
        if self.tensors.iter().map(|t| t.name).collect::<Vec<_>>() != names {
            return Err(wrong(format!(
                "holds {:?}, its encoder reads {names:?}",
                self.tensors.iter().map(|t| t.name).collect::<Vec<_>>()
            )));
        }
        for t in &self.tensors {
            let want = match t.name {
                "W_enc" => vec![self.d_in, self.d_sae],
                "b_dec" => vec![self.d_in],
                _ => vec![self.d_sae],
            };
            if t.shape != want || t.values.len() != want.iter().product::<usize>() {
                return Err(wrong(format!(
                    "{} is {:?}, expected {want:?} (d_in {}, d_sae {})",
                    t.name, t.shape, self.d_in, self.d_sae
                )));
            }
            if let Some(i) = t.values.iter().position(|v| !v.is_finite()) {
                return Err(ModelError::NonFinite {
                    name: t.name.into(),
                    path: self.source.clone(),
                    detail: format!("dictionary tensor holds {} (element {i} of {})", t.values[i], t.values.len()),
                });
            }
        }
        if let Encoder::TopK { k } = self.encoder
            && (k == 0 || k > self.d_sae)
        {
            return Err(wrong(format!("k = {k} of {} latents", self.d_sae)));
        }
        Ok(())
    }
}

/// A dictionary read from one hook's values inside the program.
#[derive(Debug, Clone)]
pub struct DictionaryHook {
    /// The hook it reads: its per-token values must be `d_in` wide.
    pub hook: HookPoint,
    /// The dictionary.
    pub dictionary: Arc<Dictionary>,
    /// Latents kept per token, its largest; firings past them are counted, never kept.
    pub cap: usize,
}

impl DictionaryHook {
    /// Its hook's per-token width at `seq` tokens a row, refused unless it is the dictionary's
    /// `d_in`.
    pub fn width(&self, config: &crate::config::ModelConfig, seq: usize) -> Result<usize, ModelError> {
        let width: usize = self.hook.dims(config, seq).iter().product();
        if width != self.dictionary.d_in {
            return Err(ModelError::Config(format!(
                "dictionary {} reads {} values a token, {} has {width}",
                self.dictionary.name, self.dictionary.d_in, self.hook
            )));
        }
        Ok(width)
    }

    /// The name of each dictionary's latents, as SAELens's `HookedSAETransformer` names them:
    /// `<hook>.hook_sae_acts_post`, then `.<dictionary>` where several dictionaries read one hook.
    pub fn names(dictionaries: &[DictionaryHook]) -> Vec<String> {
        dictionaries
            .iter()
            .map(|d| {
                let shared = dictionaries.iter().filter(|o| o.hook == d.hook).count() > 1;
                let base = format!("{}.hook_sae_acts_post", d.hook);
                if shared { format!("{base}.{}", d.dictionary.name) } else { base }
            })
            .collect()
    }
}

/// One dictionary's latents, its three results: `T` is a value of the program
/// ([`encoder::encode`]: over `[tokens]`) or, copied back, an array on the host (over
/// `[batch, seq]`, as [`LatentsInfo`] says).
#[derive(Debug, Clone, Copy)]
pub struct Latents<T> {
    /// `[.., cap]` i32: each token's largest latents, largest first; `-1` past its firings.
    pub indices: T,
    /// `[.., cap]` f32: their values; 0 past the firings.
    pub values: T,
    /// `[..]` i32: each token's number of firings (latents > 0), which may exceed `cap` (what
    /// stores them refuses such a token: `siphon_store::kept_firings`).
    pub firings: T,
}

impl<T> Latents<T> {
    /// Its results in the program's order.
    pub fn into_results(self) -> [T; 3] {
        [self.indices, self.values, self.firings]
    }

    /// The dictionaries' latents from a program's results after the hooks', three each in
    /// order; `None` where their number is not a multiple of three.
    pub fn of_results(results: Vec<T>) -> Option<Vec<Latents<T>>> {
        if !results.len().is_multiple_of(3) {
            return None;
        }
        let mut results = results.into_iter();
        let mut all = Vec::with_capacity(results.len() / 3);
        while let (Some(indices), Some(values), Some(firings)) = (results.next(), results.next(), results.next()) {
            all.push(Latents { indices, values, firings });
        }
        Some(all)
    }
}

/// What one dictionary's [`Latents`] are among a program's results, after the hooks': indices
/// and values `[batch, seq, cap]`, firings `[batch, seq]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatentsInfo {
    /// Its index in the program's dictionaries (`ForwardSpec::dictionaries`).
    pub dictionary: usize,
    /// `[batch, seq, cap]`.
    pub shape: Vec<usize>,
    /// How the indices and values come back split over the mesh (the firings: its first two
    /// dimensions).
    pub spec: PartitionSpec,
}

impl LatentsInfo {
    /// How its three results come back split over the mesh: the indices and values as
    /// [`LatentsInfo::spec`] says, the firings over its first two dimensions.
    pub fn result_specs(&self) -> [PartitionSpec; 3] {
        let firings = PartitionSpec::from_dims(self.spec.dims()[..2].to_vec());
        [self.spec.clone(), self.spec.clone(), firings]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a format's reader folds into a tensor (Gemma Scope's arrays, Llama Scope's scaled
    /// encoder) is checked like what a file holds.
    #[test]
    fn a_tensor_that_is_not_finite_is_refused_naming_it() {
        let tensors = |bad: f32| {
            vec![
                Tensor { name: "W_enc", shape: vec![2, 3], values: vec![0.5; 6] },
                Tensor { name: "b_enc", shape: vec![3], values: vec![0.0, bad, 0.0] },
            ]
        };
        let dictionary = |bad| {
            Dictionary::new(
                "d".into(),
                "blocks.0.hook_resid_post".into(),
                [2, 3],
                Encoder::Relu,
                tensors(bad),
                std::path::Path::new("/sae/d"),
            )
        };
        dictionary(1.0).check().unwrap();
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let err = dictionary(bad).check().unwrap_err();
            assert!(matches!(err, ModelError::NonFinite { .. }), "{err}");
            let err = err.to_string();
            assert!(err.contains("\"b_enc\" in /sae/d") && err.contains("(element 1 of 3)"), "{err}");
        }
    }
}
