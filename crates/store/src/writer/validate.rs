//! What a run's descriptor must hold before the writer opens: hooks with shapes and names
//! of their own, latents columns of a stored dtype, a width and a cap.

use crate::batch::{DType, check_token_shape};
use crate::config::RunDescriptor;
use crate::error::{Result, StoreError};
use crate::shard::RESERVED_TENSOR_NAMES;

/// Checks the hooks: something to store (hooks or latents), one shape per hook where shapes
/// are given, names neither empty, reserved nor repeated.
pub(super) fn validate_hooks(hooks: &[String], shapes: &[Vec<usize>], latents: bool) -> Result<()> {
    if hooks.is_empty() && !latents {
        return Err(StoreError::InvalidConfig("no hooks or latents to store".into()));
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

/// Checks the latents columns: stored as f32, bf16 or f16; a width and a cap; names that are
/// not a hook's, a reserved one or another column's.
pub(super) fn validate_latents(descriptor: &RunDescriptor, dtype: DType) -> Result<()> {
    let bad = |reason: String| Err(StoreError::InvalidConfig(reason));
    if !descriptor.latents.is_empty() && !matches!(dtype, DType::F32 | DType::Bf16 | DType::F16) {
        return bad(format!("latents are stored as f32, bf16 or f16, not {}: choose another --dtype", dtype.name()));
    }
    let mut seen: std::collections::HashSet<String> = descriptor.hooks.iter().cloned().collect();
    for column in &descriptor.latents {
        if column.width == 0 || column.cap == 0 || column.cap > column.width {
            return bad(format!(
                "latents {}: {} kept per token of {} latents (both > 0, the cap at most the width)",
                column.name, column.cap, column.width
            ));
        }
        if column.width > crate::sparse::MAX_LATENTS {
            return bad(format!(
                "latents {}: {} latents, more than the {} a column may have",
                column.name,
                column.width,
                crate::sparse::MAX_LATENTS
            ));
        }
        let names = std::iter::once(column.name.clone()).chain(column.tensor_names());
        for name in names {
            if RESERVED_TENSOR_NAMES.contains(&name.as_str()) || name.is_empty() || !seen.insert(name.clone()) {
                return bad(format!("latents name {name:?} is empty, reserved or already a hook's or a column's"));
            }
        }
    }
    Ok(())
}
