//! Dictionaries spliced into the forward (SAELens's `run_evals`): for each dictionary given a
//! decoder ([`crate::dictionary::Dictionary::with_decoder`]), the blocks after the hook it reads
//! are built a second time from the hook on, its value replaced by the dictionary's
//! reconstruction, and — once per hook — a third time with the value zero-ablated; each
//! stream's final norm then feeds the next-token outputs, which give per token the NLL of
//! each stream and its KL divergence from the clean one (`super::next_token`):
//!
//! - `output.nll.spliced.<hook>[.<dictionary>]`, `output.kl.spliced.<hook>[.<dictionary>]`
//! - `output.nll.ablated.<hook>`, `output.kl.ablated.<hook>`
//! - then each spliced dictionary's `output.sq_error.spliced.<hook>[.<dictionary>]`: `‖x − x̂‖²`
//!   of the hook's value and its reconstruction, in f32 (the numerator of SAELens's fraction of
//!   variance unexplained; the hook's own statistics give the denominator)
//!
//! (`<dictionary>` where several dictionaries read one hook, as their latents are named).
//! A replay records no hook and adds the steering vectors of the blocks it builds again.
//!
//! Spliced so far: an SAE of a block's `hook_resid_pre` or `hook_resid_post` (the residual
//! stream every family's decoder loop carries), and an SAE of a block's `hook_mlp_out` or a
//! transcoder of its MLP input, whose reconstruction takes the place of the block's
//! `hook_mlp_out` (the block then ends with
//! `hook_resid_mid` plus it, in the families whose blocks end so: `Graph::mlp_joins_resid_mid`);
//! in the families whose decoder ends with [`Graph::finish_decoder`] and whose blocks may be
//! built again (not Gemma 4's, whose later layers read earlier layers' keys and values);
//! anything else is refused by name.

use siphon_hlo::{TensorType, Value};

use super::{ForwardSpec, Graph};
use crate::config::ModelConfig;
use crate::dictionary::DictionaryHook;
use crate::error::ModelError;
use crate::hooks::{HookKind, HookPoint};

/// One stream replayed from a hook on.
#[derive(Debug, Clone)]
pub(crate) struct Replayed {
    /// The names of its two outputs: its NLL and its KL divergence from the clean stream.
    pub names: [String; 2],
    /// The residual stream after the last block.
    pub last: Value,
    /// Its final norm's output, once built.
    pub hidden: Option<Value>,
    /// A spliced stream's `output.sq_error.spliced.…` name and its value `[tokens]` f32.
    pub squared_error: Option<(String, Value)>,
}

/// The dictionaries `spec` splices in, by index.
fn spliced(spec: &ForwardSpec) -> impl Iterator<Item = (usize, &DictionaryHook)> {
    spec.dictionaries.iter().enumerate().filter(|(_, d)| !d.dictionary.decoder.is_empty())
}

/// The hook a spliced dictionary's reconstruction replaces: an SAE's own (a block's
/// `hook_resid_pre` or `hook_resid_post`), a transcoder's block's `hook_mlp_out` (it reads the
/// MLP's input: `ln2.hook_normalized` or `mlp.hook_in`); `Err` says why the hook is not spliced.
fn target(d: &DictionaryHook) -> Result<HookPoint, String> {
    let (kind, layer) = (d.hook.kind(), d.hook.layer());
    match (d.dictionary.transcoder, kind, layer) {
        (false, HookKind::ResidPre | HookKind::ResidPost | HookKind::MlpOut, Some(_)) => Ok(d.hook),
        (true, HookKind::Ln2Normalized | HookKind::MlpIn, Some(layer)) => Ok(HookPoint::block(layer, HookKind::MlpOut)),
        (false, ..) => {
            Err(format!("{}: only a block's hook_resid_pre, hook_resid_post or hook_mlp_out is spliced so far", d.hook))
        }
        (true, ..) => Err(format!(
            "a transcoder reading {}: only one reading its block's MLP input (ln2.hook_normalized or mlp.hook_in) is \
             spliced so far",
            d.hook
        )),
    }
}

/// The hooks a splice reads besides the dictionary's own: where it replaces a block's
/// `hook_mlp_out` (a transcoder, or an SAE of it), the block's `hook_resid_mid` (the MLP's
/// output joins it) and `hook_mlp_out` (what it reconstructs).
pub(crate) fn reads(spec: &ForwardSpec) -> impl Iterator<Item = HookPoint> + '_ {
    spliced(spec)
        .filter_map(|(_, d)| target(d).ok())
        .filter(|at| at.kind() == HookKind::MlpOut)
        .filter_map(|at| at.layer())
        .flat_map(|layer| [HookPoint::block(layer, HookKind::ResidMid), HookPoint::block(layer, HookKind::MlpOut)])
}

/// Refuses splices that are not built: at a hook other than those [`target`] takes, a
/// transcoder writing another width than the residual stream's, without the next-token NLL
/// that they are measured by.
pub(crate) fn check(spec: &ForwardSpec, config: &ModelConfig) -> Result<(), ModelError> {
    for (_, d) in spliced(spec) {
        let refuse = |why: String| ModelError::Hook(format!("splicing dictionary {}: {why}", d.dictionary.name));
        target(d).map_err(refuse)?;
        if let Some(d_out) = d.dictionary.d_out()
            && d.dictionary.transcoder
            && d_out != config.hidden_size
        {
            return Err(refuse(format!(
                "it writes {d_out} values a token, the MLP's output is {}",
                config.hidden_size
            )));
        }
        if !spec.next_token.is_some_and(|o| o.nll) {
            return Err(ModelError::Config(format!(
                "splicing dictionary {} is measured by the next-token NLL: ask for the nll output too",
                d.dictionary.name
            )));
        }
    }
    Ok(())
}

/// The names of a splice's outputs, by the dictionary's latents column `column`
/// (`<hook it reads>.hook_sae_acts_post[.<dictionary>]`) and the hook it replaces, `target`
/// (`output.nll.spliced.<target>[.<dictionary>]`, …), and of that hook's ablation.
fn names(column: &str, read: HookPoint, target: HookPoint) -> ([String; 3], [String; 2]) {
    let tail = column.replacen(&format!("{read}.hook_sae_acts_post"), &target.to_string(), 1);
    let spliced = ["nll", "kl", "sq_error"].map(|what| format!("output.{what}.spliced.{tail}"));
    (spliced, [format!("output.nll.ablated.{target}"), format!("output.kl.ablated.{target}")])
}

/// The names of the outputs the splices of `dictionaries` add after the next-token outputs, in
/// result order: each spliced dictionary's NLL and KL, then its hook's ablated NLL and KL the
/// first time that hook is spliced; last, each spliced dictionary's squared error.
pub fn output_names(dictionaries: &[DictionaryHook]) -> Vec<String> {
    let columns = DictionaryHook::names(dictionaries);
    let mut ablated = Vec::new();
    let (mut out, mut errors) = (Vec::new(), Vec::new());
    for (i, d) in dictionaries.iter().enumerate().filter(|(_, d)| !d.dictionary.decoder.is_empty()) {
        let Ok(at) = target(d) else { continue };
        let ([nll, kl, error], ablation) = names(&columns[i], d.hook, at);
        out.extend([nll, kl]);
        errors.push(error);
        if !ablated.contains(&at) {
            ablated.push(at);
            out.extend(ablation);
        }
    }
    out.extend(errors);
    out
}

impl<'a> Graph<'a> {
    /// After the blocks' clean pass: each spliced dictionary's stream, and each of their hooks'
    /// zero-ablated one, through the blocks after the hook ([`Replayed`], in
    /// [`Graph::splices`]).
    pub(crate) fn replay_splices<F>(&mut self, block: &mut F) -> Result<(), ModelError>
    where
        F: FnMut(&mut Graph<'a>, Value, usize) -> Result<Value, ModelError>,
    {
        let spec = self.spec;
        let columns = DictionaryHook::names(&spec.dictionaries);
        let mut ablated = Vec::new();
        for (i, d) in spliced(spec) {
            let refuse = |why: String| ModelError::Config(format!("splicing dictionary {}: {why}", d.dictionary.name));
            if let Some(why) = self.replay_refusal {
                return Err(refuse(why.to_string()));
            }
            let at = target(d).map_err(refuse)?;
            let mlp_out = at.kind() == HookKind::MlpOut;
            if mlp_out && !self.mlp_joins_resid_mid {
                return Err(refuse(format!(
                    "{:?}'s blocks do not add the MLP's output to hook_resid_mid as it is, so a reconstruction of \
                     it is not spliced there yet",
                    self.config.arch
                )));
            }
            let hook = |g: &Graph<'a>, hook: HookPoint| {
                g.hooks.get(&hook).copied().ok_or_else(|| {
                    ModelError::Hook(format!(
                        "splicing {} reads {hook}, which the graph did not produce",
                        d.dictionary.name
                    ))
                })
            };
            let x = hook(self, d.hook)?;
            let args = &self.dictionary_args[i];
            let (encoder, decoder) = args.split_at(d.dictionary.tensors.len());
            let decoder = [decoder[0], decoder[1]];
            let exact = crate::dictionary::encoder::reconstruct(&mut self.b, x, &d.dictionary, encoder, decoder)?;
            let reconstruction = self.b.convert(exact, self.dt)?;
            let ([nll, kl, error], ablated_names) = names(&columns[i], d.hook, at);
            // Where the replay starts, with what: an SAE's residual hook holds its reconstruction
            // (or 0); where hook_mlp_out is replaced (a transcoder, an SAE of it), the block ends
            // with hook_resid_mid plus it (or nothing), steered as the block's output is.
            let (truth, start, spliced_value, ablated_value) = match mlp_out {
                false => {
                    let dims = self.b.dims(x)?.to_vec();
                    (x, d.hook, reconstruction, self.b.splat(0.0, TensorType::new(self.dt, &dims))?)
                }
                true => {
                    let layer = d.hook.layer().expect("a block's hook");
                    let mid = hook(self, HookPoint::block(layer, HookKind::ResidMid))?;
                    let post = HookPoint::block(layer, HookKind::ResidPost);
                    let joined = self.b.add(mid, reconstruction)?;
                    let joined = self.constrain_tokens(joined)?;
                    let (joined, mid_only) = (self.steer(post, joined)?, self.steer(post, mid)?);
                    (hook(self, at)?, post, joined, mid_only)
                }
            };
            let squared_error = self.squared_error(truth, exact)?;
            let last = self.replay_from(start, spliced_value, block)?;
            let squared_error = Some((error, squared_error));
            self.splices.push(Replayed { names: [nll, kl], last, hidden: None, squared_error });
            if !ablated.contains(&at) {
                ablated.push(at);
                let last = self.replay_from(start, ablated_value, block)?;
                self.splices.push(Replayed { names: ablated_names, last, hidden: None, squared_error: None });
            }
        }
        Ok(())
    }

    /// `‖x − x̂‖²` per token `[tokens]` f32 of `x` `[tokens, d]` (the value replaced) and its
    /// reconstruction (f32).
    fn squared_error(&mut self, x: Value, reconstruction: Value) -> Result<Value, ModelError> {
        let x = self.b.convert(x, siphon_hlo::DType::F32)?;
        let diff = self.b.sub(x, reconstruction)?;
        let squares = self.b.mul(diff, diff)?;
        Ok(self.b.reduce_sum(squares, &[1])?)
    }

    /// The residual stream after the last block built when `hook` (a block's `hook_resid_pre`
    /// or `hook_resid_post`) holds `x`: the blocks after it built again, recording nothing.
    fn replay_from<F>(&mut self, hook: HookPoint, mut x: Value, block: &mut F) -> Result<Value, ModelError>
    where
        F: FnMut(&mut Graph<'a>, Value, usize) -> Result<Value, ModelError>,
    {
        let layer = hook.layer().expect("a block's hook");
        let first = match hook.kind() {
            HookKind::ResidPre => layer,
            _ => layer + 1,
        };
        self.recording = false;
        for l in first..self.n_blocks {
            let (pre, post) = (HookPoint::block(l, HookKind::ResidPre), HookPoint::block(l, HookKind::ResidPost));
            if pre != hook {
                x = self.steer(pre, x)?;
            }
            let out = block(self, x, l)?;
            x = self.constrain_tokens(out)?;
            x = self.steer(post, x)?;
        }
        self.recording = true;
        Ok(x)
    }
}

/// Each replayed stream's output names and final norm's output, and the per-token values
/// beside them, for the next-token outputs;
/// refused where a splice was asked for and the family's decoder did not build its stream
/// (one that does not end with [`Graph::finish_decoder`]).
pub(crate) fn variants(g: &Graph<'_>) -> Result<Variants, ModelError> {
    if let Some((_, d)) = spliced(g.spec).next()
        && (g.splices.is_empty() || g.splices.iter().any(|s| s.hidden.is_none()))
    {
        return Err(ModelError::Config(format!(
            "splicing dictionary {} in {:?}: this family's decoder is not built for it yet",
            d.dictionary.name, g.config.arch
        )));
    }
    Ok(Variants {
        streams: g.splices.iter().map(|s| (s.names.clone(), s.hidden.expect("checked"))).collect(),
        per_token: g.splices.iter().filter_map(|s| s.squared_error.clone()).collect(),
    })
}

/// What the splices add to the next-token outputs.
pub(crate) struct Variants {
    /// Each replayed stream's NLL and KL names and final norm's output.
    pub streams: Vec<([String; 2], Value)>,
    /// Values of each token computed beside them (`[tokens]` f32), by name, after them.
    pub per_token: Vec<(String, Value)>,
}
