//! The sparse dictionaries' flags (`--sae`, `--latent-cap`) of `forward`, `plan` and
//! `extract` ([`SaeArgs`]); `job::dictionary` opens what they name.

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
}
