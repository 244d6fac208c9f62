//! The sparse dictionaries' flags (`--sae`, `--latent-cap`, `--splice`) of `forward`, `plan`
//! and `extract` ([`SaeArgs`]); `job::dictionary` opens what they name.

/// Sparse dictionaries' flags (`forward`, `plan`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SaeArgs {
    /// Sparse dictionaries (SAEs, transcoders) whose latents to compute on the devices,
    /// comma-separated: a directory as SAELens, EleutherAI sparsify or Gemma Scope saves one (or
    /// its URL: `hf://OWNER/NAME[@REVISION]/PATH`, gs://, s3://, https://, downloaded once),
    /// `DIR@HOOK` to name the hook it reads where its files do not. `forward` writes each as
    /// `<hook>.hook_sae_acts_post[.<dictionary>].{indices,values,firings}`: each token's largest
    /// latents (`[batch, seq, cap]` i32 indices, -1 past its firings, and f32 values) and its
    /// number of firings.
    #[arg(long, value_name = "DIR[@HOOK]", value_delimiter = ',')]
    pub sae: Vec<String>,
    /// Latents kept per token for every dictionary (its largest); a token firing more is an
    /// error, never truncated. A TopK dictionary keeps at most its k; the default for others is
    /// their width (`extract` asks for the cap).
    #[arg(long, value_name = "N", value_parser = crate::args::limits::count(1, crate::args::limits::MAX_LATENTS))]
    pub latent_cap: Option<usize>,
    /// Splice dictionaries into the forward (SAELens's `run_evals`): the rest of the forward
    /// run again from each one's hook with the hook's value replaced by its reconstruction (a
    /// transcoder's: its block's MLP output), and once more with it zero-ablated; per token the
    /// NLL of each, its KL divergence from the clean forward and the reconstruction's squared
    /// error (`output.nll.spliced.<hook>`, `output.kl.spliced.<hook>`,
    /// `output.sq_error.spliced.<hook>`, `output.nll.ablated.<hook>`, `output.kl.ablated.<hook>`;
    /// implies `--outputs nll`). Every --sae dictionary, or those named (comma-separated
    /// dictionary names). An SAE of a block's hook_resid_pre, hook_resid_post or hook_mlp_out,
    /// or a transcoder of its MLP input, so far.
    #[arg(long, value_name = "NAMES", num_args = 0..=1, default_missing_value = "")]
    pub splice: Option<String>,
}

impl SaeArgs {
    /// Whether the dictionary `name` is spliced in.
    pub fn splices(&self, name: &str) -> bool {
        match self.splice.as_deref() {
            None => false,
            Some("") => true,
            Some(names) => names.split(',').any(|n| n.trim() == name),
        }
    }

    /// Refuses `--splice` without `--sae`, or naming none of the dictionaries `names`.
    pub fn check_splice(&self, names: &[&str]) -> anyhow::Result<()> {
        let Some(splice) = self.splice.as_deref() else { return Ok(()) };
        if self.sae.is_empty() {
            anyhow::bail!("--splice splices the --sae dictionaries into the forward: give --sae");
        }
        if !splice.is_empty()
            && let Some(unknown) = splice.split(',').map(str::trim).find(|n| !names.contains(n))
        {
            anyhow::bail!("--splice {splice}: no --sae dictionary is named {unknown:?} (they are {names:?})");
        }
        Ok(())
    }

    /// `outputs` with the NLL a splice is measured by.
    pub fn with_splice_outputs(&self, outputs: Option<siphon_models::NextToken>) -> Option<siphon_models::NextToken> {
        match self.splice {
            None => outputs,
            Some(_) => Some(siphon_models::NextToken { nll: true, ..outputs.unwrap_or_default() }),
        }
    }
}
