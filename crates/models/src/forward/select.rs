//! Chosen rows ([`ForwardSpec::select`]): each row of the batch returns `rows` rows per hook
//! instead of one per token, each a weighted sum of the row's tokens, the weights the program's
//! `select` input `[batch, rows, seq]` f32. A one-hot row picks a token (the last of a document,
//! the token after a marker); weights `1/n` over a document's tokens average them. The sums
//! are taken in f32 (`dot_general` at `HIGHEST`), so a picked row is the token's value exactly
//! and a mean is the f32 mean; tokens no row reads are zeroed first, so that what lies under
//! padding (whatever it is) never reaches a sum as `0 · x`.
//!
//! Only the chosen rows leave the program: what a step copies to the host is `rows` rows a
//! sequence, not `seq`.

use siphon_hlo::{Builder, CompareDir, DType, DotDims, TensorType, Value};
use siphon_mesh::PartitionSpec;

use super::ForwardSpec;
use crate::error::ModelError;

/// The `select` input: `[batch, rows, seq]` f32, split as the `[batch, seq]` inputs are
/// (its rows dimension whole).
pub(crate) fn input_spec(tokens: &PartitionSpec) -> PartitionSpec {
    let dims = tokens.dims();
    PartitionSpec::from_dims(vec![dims[0].clone(), Vec::new(), dims[1].clone()])
}

/// A chosen rows' result `[batch, rows, …]`: split over the batch as the inputs are.
pub(crate) fn output_spec(tokens: &PartitionSpec, rank: usize) -> PartitionSpec {
    let mut dims = vec![tokens.dims()[0].clone()];
    dims.resize(rank, Vec::new());
    PartitionSpec::from_dims(dims)
}

/// What [`ForwardSpec::select`] cannot go with: the next-token outputs (and the splices they
/// carry) are per token.
pub(crate) fn check(spec: &ForwardSpec) -> Result<(), ModelError> {
    match (spec.select, spec.next_token.is_some() || spec.decode.is_some()) {
        (Some(0), _) => Err(ModelError::Config("chosen rows: 0 rows a sequence".into())),
        (Some(_), true) => Err(ModelError::Config(
            "the next-token outputs (and splices) are per token: not with chosen rows (--positions)".into(),
        )),
        _ => Ok(()),
    }
}

/// The select weights' reach: whether any row reads each token, `[batch, seq]`.
pub(crate) fn read_tokens(b: &mut Builder, select: Value) -> Result<Value, ModelError> {
    let magnitude = b.abs(select)?;
    let most = b.reduce_max(magnitude, &[1])?;
    let dims = b.dims(most)?.to_vec();
    let zero = b.splat(0.0, TensorType::new(DType::F32, &dims))?;
    Ok(b.compare(CompareDir::Gt, most, zero)?)
}

/// `x` (a hook's values, `batch · seq · width` elements token-major) as the chosen rows
/// `[batch, rows, width]` f32: tokens outside `read` (from [`read_tokens`]) zeroed, then each
/// row the weighted sum of its tokens.
pub(crate) fn rows(
    b: &mut Builder,
    select: Value,
    read: Value,
    x: Value,
    [batch, seq]: [usize; 2],
    width: usize,
) -> Result<Value, ModelError> {
    let x = b.reshape(x, &[batch, seq, width])?;
    let x = b.convert(x, DType::F32)?;
    let shape = [batch, seq, width];
    let read = b.broadcast_in_dim(read, &shape, &[0, 1])?;
    let zero = b.splat(0.0, TensorType::new(DType::F32, &shape))?;
    let x = b.select(read, x, zero)?;
    Ok(b.dot_general(select, x, &DotDims::batched(&[0], &[0], &[2], &[1]))?)
}
