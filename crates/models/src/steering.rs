//! Steering vectors (activation addition, repeng's control vectors): a vector of a hook's width
//! added to that hook's value for the rest of the forward, so every later hook, latent and
//! next-token output sees it, and the hook itself holds the steered value (as a
//! TransformerLens hook function returning `x + v` leaves it). A vector is read from a `.npy`
//! (float32 or float64, `[d]` or `[1, d]`) or a `.safetensors` file holding one tensor (F32,
//! BF16 or F16), scaled in f32; it reaches the program as an f32 argument `[d]` after the
//! dictionaries' tensors (`ForwardSpec::steering`), rounded to the compute dtype and
//! added there (as a forward hook of a bf16 model returning `out + v.to(out.dtype)`).
//!
//! Steered so far: a block's `hook_resid_pre` and `hook_resid_post`, the residual stream every
//! family's decoder loop shares; its `hook_mlp_out` in the families built by the pre-norm
//! decoder (Llama and those built like it) and its `hook_attn_out` in those of them whose mixer
//! is the shared self-attention; both in the post-normed blocks (Gemma 2/3/4, OLMo 2), where they
//! are the normed outputs that join the residual stream. Any other hook is refused by name,
//! and a family whose program never adds a vector it was given is refused when the program is
//! built, never steered elsewhere.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::hooks::{HookKind, HookPoint};

/// One steering vector, scaled, on its hook.
#[derive(Debug, Clone, PartialEq)]
pub struct Steering {
    /// The hook whose value it is added to.
    pub hook: HookPoint,
    /// The vector times `scale`, `[hidden]`.
    pub values: Vec<f32>,
    /// The scale it was read with.
    pub scale: f32,
    /// The file it was read from.
    pub source: PathBuf,
}

/// Refuses `hook` unless siphon steers it: a block's `hook_resid_pre`, `hook_resid_post`,
/// `hook_attn_out` or `hook_mlp_out` within the model (the last two where the family's blocks
/// add the vector: a program that never adds one it was given is refused when built).
pub fn check_hook(hook: HookPoint, config: &ModelConfig) -> Result<(), ModelError> {
    if !matches!(hook.kind(), HookKind::ResidPre | HookKind::ResidPost | HookKind::AttnOut | HookKind::MlpOut) {
        return Err(ModelError::Hook(format!(
            "steering at {hook}: only a block's hook_resid_pre, hook_resid_post, hook_attn_out or hook_mlp_out is \
             steered so far"
        )));
    }
    crate::hooks::check(&hook.to_string(), hook, config)
}

/// Each steered hook once, each allowed ([`check_hook`]).
pub fn check_all(hooks: &[HookPoint], config: &ModelConfig) -> Result<(), ModelError> {
    for (i, &hook) in hooks.iter().enumerate() {
        check_hook(hook, config)?;
        if hooks[..i].contains(&hook) {
            return Err(ModelError::Hook(format!("steering at {hook} twice: give one vector a hook")));
        }
    }
    Ok(())
}

impl Steering {
    /// The vector in `path` times `scale`, on `hook` of `config`'s model: a hook siphon steers,
    /// a vector of the hidden size, every value and the scale finite.
    pub fn read(hook: HookPoint, path: &Path, scale: f32, config: &ModelConfig) -> Result<Steering, ModelError> {
        check_hook(hook, config)?;
        let refuse = |what: String| ModelError::Config(format!("steering vector {}: {what}", path.display()));
        if !scale.is_finite() {
            return Err(refuse(format!("scale {scale} is not a finite number")));
        }
        let mut bytes = Vec::new();
        crate::file::open(path)?.read_to_end(&mut bytes).map_err(|e| refuse(e.to_string()))?;
        let (shape, values) = match path.extension().and_then(|e| e.to_str()) {
            Some("npy") => npy(&bytes).map_err(refuse)?,
            Some("safetensors") => safetensors(&bytes).map_err(refuse)?,
            _ => return Err(refuse("not a .npy or .safetensors file".into())),
        };
        let d = config.hidden_size;
        if !(shape == [d] || shape == [1, d]) {
            return Err(refuse(format!("shape {shape:?}: {hook} is [{d}] a token")));
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(refuse(format!("element {i} is {}", values[i])));
        }
        let values: Vec<f32> = values.iter().map(|v| v * scale).collect();
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(refuse(format!("element {i} times the scale {scale} is not finite")));
        }
        Ok(Steering { hook, values, scale, source: path.to_path_buf() })
    }
}

/// A `.npy` array of float32 or float64, as f32.
fn npy(bytes: &[u8]) -> Result<(Vec<usize>, Vec<f32>), String> {
    let file = npyz::NpyFile::new(bytes).map_err(|e| e.to_string())?;
    let shape: Vec<usize> = file.shape().iter().map(|&d| d as usize).collect();
    let values = match file.dtype() {
        npyz::DType::Plain(t) if t.to_string().ends_with("f4") => file.into_vec::<f32>(),
        npyz::DType::Plain(t) if t.to_string().ends_with("f8") => {
            file.into_vec::<f64>().map(|v| v.into_iter().map(|x| x as f32).collect())
        }
        other => return Err(format!("dtype {other:?}: float32 or float64 expected")),
    }
    .map_err(|e| e.to_string())?;
    Ok((shape, values))
}

/// The one tensor of a safetensors file (F32, BF16 or F16), as f32.
fn safetensors(bytes: &[u8]) -> Result<(Vec<usize>, Vec<f32>), String> {
    let file = safetensors::SafeTensors::deserialize(bytes).map_err(|e| e.to_string())?;
    let names = file.names();
    let [name] = names[..] else {
        return Err(format!("{} tensors ({names:?}): one vector expected", names.len()));
    };
    let tensor = file.tensor(name).map_err(|e| e.to_string())?;
    let data = tensor.data();
    let values = match tensor.dtype() {
        safetensors::Dtype::F32 => data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        safetensors::Dtype::BF16 => {
            data.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
        }
        safetensors::Dtype::F16 => {
            data.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
        }
        other => return Err(format!("{name} is {other:?}: F32, BF16 or F16 expected")),
    };
    Ok((tensor.shape().to_vec(), values))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ModelConfig {
        crate::HfConfig::from_json(
            r#"{"model_type": "llama", "hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 2,
                "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 16}"#,
        )
        .unwrap()
        .into_config()
        .unwrap()
    }

    fn npy_f32(values: &[f32], shape: &str) -> Vec<u8> {
        let header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
        let mut header = header.into_bytes();
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(b' ');
        }
        header.push(b'\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend((header.len() as u16).to_le_bytes());
        out.extend(header);
        out.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        out
    }

    #[test]
    fn a_vector_is_read_scaled_from_npy_or_safetensors() {
        let dir = tempfile::tempdir().unwrap();
        let c = config();
        let hook = HookPoint::block(1, HookKind::ResidPre);
        let path = dir.path().join("v.npy");
        std::fs::write(&path, npy_f32(&[1.0, -2.0, 0.5, 0.0], "(4,)")).unwrap();
        let s = Steering::read(hook, &path, 2.0, &c).unwrap();
        assert_eq!((s.values.as_slice(), s.scale), (&[2.0, -4.0, 1.0, 0.0][..], 2.0));
        let path = dir.path().join("v.safetensors");
        let data: Vec<u8> = [1f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1, 4], &data).unwrap();
        let bytes = safetensors::serialize([("v", view)], None).unwrap();
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(Steering::read(hook, &path, -1.0, &c).unwrap().values, [-1.0, -2.0, -3.0, -4.0]);
    }

    #[test]
    fn what_is_not_steered_exactly_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let c = config();
        let path = dir.path().join("v.npy");
        std::fs::write(&path, npy_f32(&[1.0, 2.0, 3.0], "(3,)")).unwrap();
        let at = HookPoint::block(0, HookKind::ResidPost);
        let err = Steering::read(at, &path, 1.0, &c).unwrap_err().to_string();
        assert!(err.contains("shape [3]") && err.contains("[4] a token"), "{err}");
        std::fs::write(&path, npy_f32(&[1.0, f32::NAN, 3.0, 4.0], "(4,)")).unwrap();
        let err = Steering::read(at, &path, 1.0, &c).unwrap_err().to_string();
        assert!(err.contains("element 1 is NaN"), "{err}");
        std::fs::write(&path, npy_f32(&[1.0, 2.0, 3.0, 4.0], "(4,)")).unwrap();
        assert!(Steering::read(at, &path, f32::INFINITY, &c).unwrap_err().to_string().contains("scale inf"));
        let err = Steering::read(HookPoint::block(0, HookKind::MlpPost), &path, 1.0, &c).unwrap_err().to_string();
        assert!(err.contains("steering at blocks.0.mlp.hook_post"), "{err}");
        assert!(Steering::read(HookPoint::block(2, HookKind::ResidPre), &path, 1.0, &c).is_err());
        let txt = dir.path().join("v.txt");
        std::fs::write(&txt, "1 2 3 4").unwrap();
        assert!(Steering::read(at, &txt, 1.0, &c).unwrap_err().to_string().contains("not a .npy or .safetensors"));
        let err = check_all(&[at, at], &c).unwrap_err().to_string();
        assert!(err.contains("twice"), "{err}");
    }

    #[test]
    fn a_vector_is_an_argument_added_where_its_hook_is_recorded() {
        use crate::contract::ForwardSpec;
        let c = config();
        let (pre1, post0) = (HookPoint::block(1, HookKind::ResidPre), HookPoint::block(0, HookKind::ResidPost));
        let spec =
            |hooks: Vec<HookPoint>, steering: Vec<HookPoint>| ForwardSpec { steering, ..ForwardSpec::new(1, 3, hooks) };
        let plain = crate::forward::build_forward(&c, &spec(vec![pre1], vec![])).unwrap();
        let steered = crate::forward::build_forward(&c, &spec(vec![pre1], vec![pre1])).unwrap();
        // One more argument, [4] f32, and one more add; the result's shape unchanged.
        let main = |p: &crate::ForwardProgram| p.text.lines().find(|l| l.contains("func.func")).unwrap().to_string();
        let args = |p: &crate::ForwardProgram| main(p).matches("%arg").count();
        assert_eq!(args(&steered), args(&plain) + 1, "{}", main(&steered));
        assert!(main(&steered).contains("tensor<4xf32>"));
        assert_eq!(steered.text.matches("stablehlo.add").count(), plain.text.matches("stablehlo.add").count() + 1);
        // After everything returned: refused, naming it.
        let err = crate::forward::build_forward(&c, &spec(vec![post0], vec![HookPoint::block(1, HookKind::ResidPost)]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("steering at blocks.1.hook_resid_post") && err.contains("change nothing"), "{err}");
        // Every vector is checked, not only the first past the blocks: the next block's input
        // is steered where it is returned, a later vector still refused.
        let (pre1_post1, hooks) = (vec![pre1, HookPoint::block(1, HookKind::ResidPost)], vec![post0, pre1]);
        let err = crate::forward::build_forward(&c, &spec(hooks.clone(), pre1_post1)).unwrap_err().to_string();
        assert!(err.contains("steering at blocks.1.hook_resid_post"), "{err}");
        crate::forward::build_forward(&c, &spec(hooks, vec![pre1])).unwrap();
        // The next block's input not returned: nothing would change.
        let err = crate::forward::build_forward(&c, &spec(vec![post0], vec![pre1])).unwrap_err().to_string();
        assert!(err.contains("steering at blocks.1.hook_resid_pre"), "{err}");
        let err = crate::forward::build_forward(&c, &spec(vec![post0], vec![HookPoint::block(0, HookKind::MlpPost)]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("only a block's hook_resid_pre, hook_resid_post, hook_attn_out or hook_mlp_out"), "{err}");
    }
}
