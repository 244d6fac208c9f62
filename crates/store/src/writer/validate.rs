//! What a run's hooks must be before the writer opens: shapes and names of their own (the
//! latents columns' checks are `crate::sparse::validate_columns`).

use crate::batch::check_token_shape;
use crate::error::{Result, StoreError};
use crate::tensor::RESERVED_TENSOR_NAMES;

/// Checks the hooks: something to store (hooks, or `other_columns`: latents or outputs), one
/// shape per hook where shapes are given, names neither empty, reserved nor repeated.
pub(super) fn validate_hooks(hooks: &[String], shapes: &[Vec<usize>], other_columns: bool) -> Result<()> {
    if hooks.is_empty() && !other_columns {
        return Err(StoreError::InvalidConfig("no hooks, latents or outputs to store".into()));
    }
    if !shapes.is_empty() && shapes.len() != hooks.len() {
        return Err(StoreError::InvalidConfig(format!(
            "{} hook shapes for {} hooks {hooks:?}: give one per hook, or none",
            shapes.len(),
            hooks.len()
        )));
    }
    for (hook, shape) in hooks.iter().zip(shapes) {
        check_token_shape(shape).map_err(|e| StoreError::InvalidConfig(format!("hook {hook} {e}")))?;
    }
    let mut seen = std::collections::HashSet::new();
    for hook in hooks {
        if hook.is_empty()
            || RESERVED_TENSOR_NAMES.contains(&hook.as_str())
            || hook == "__metadata__"
            || hook.ends_with(".fp8_scale")
        {
            return Err(StoreError::InvalidConfig(format!(
                "hook name {hook:?} is empty or reserved ({RESERVED_TENSOR_NAMES:?}, `*.fp8_scale`)"
            )));
        }
        if !seen.insert(hook) {
            return Err(StoreError::InvalidConfig(format!("hook {hook:?} listed twice")));
        }
    }
    Ok(())
}
