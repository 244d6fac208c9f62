//! The layers families build their blocks from, each a file: norms, RoPE, softmax attention,
//! multi-head latent attention (MLA), gated DeltaNet (linear attention), MLPs and the routed
//! mixture (a sparse dictionary's encoder is in [`crate::dictionary`]). Each adds its methods to [`crate::forward::Graph`] and records its own hooks; a
//! family's file says which it uses and how they are wired.

pub(crate) mod attention;
pub mod cudnn;
pub mod gated_deltanet;
pub mod mla;
pub(crate) mod mlp;
pub(crate) mod moe;
pub(crate) mod norm;
pub(crate) mod rope;
