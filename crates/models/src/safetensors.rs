//! Hugging Face safetensors weights: one `model.safetensors`, or a
//! `model.safetensors.index.json` whose `weight_map` spreads tensors over several files.
//!
//! Each file is memory-mapped once; its header is parsed and checked by the `safetensors`
//! crate (which rejects truncated files: the header's data offsets must end exactly at the
//! end of the file) and tensors are read as slices of the map.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, SafeTensors, TensorInfo};
use siphon_dtype::DType;

use crate::error::ModelError;
use crate::stored::TensorMeta;

/// A block-scaled tensor's dequantized shape and values.
pub(crate) struct Dequantized {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// An MXFP4 tensor's dequantized shape, and its stored blocks and scales.
struct Mxfp4Parts<'a> {
    shape: Vec<usize>,
    blocks: &'a [u8],
    scales: &'a [u8],
}

/// An FP8 weight's scale grid `[scale_rows, scale_cols]` and its scales as f32.
type ScaleGrid = ([usize; 2], Vec<f32>);

/// One or more mapped safetensors files with a name → file index.
pub(crate) struct SafeTensorsSet {
    files: Vec<MappedFile>,
    by_name: HashMap<String, (usize, TensorInfo)>,
    describe: String,
    /// FP8 checkpoints' `weight_block_size` (see [`crate::fp8`]).
    fp8_block: Option<[usize; 2]>,
}

impl std::fmt::Debug for SafeTensorsSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafeTensorsSet").field("source", &self.describe).field("tensors", &self.by_name.len()).finish()
    }
}

struct MappedFile {
    path: PathBuf,
    mmap: Mmap,
    /// Offset of the data section (8 + header length).
    data_start: usize,
}

impl SafeTensorsSet {
    /// The `weight_block_size` of an FP8 checkpoint's `quantization_config`.
    pub(crate) fn set_fp8_block(&mut self, block: Option<[usize; 2]>) {
        self.fp8_block = block;
    }

    pub(crate) fn open_file(path: &Path) -> Result<SafeTensorsSet, ModelError> {
        let mut set = SafeTensorsSet {
            files: Vec::new(),
            by_name: HashMap::new(),
            describe: path.display().to_string(),
            fp8_block: None,
        };
        set.add_file(path, None)?;
        Ok(set)
    }

    pub(crate) fn open_index(index: &Path) -> Result<SafeTensorsSet, ModelError> {
        let text = crate::file::read_to_string(index)?;
        let corrupt = |detail: String| ModelError::Corrupt { path: index.to_path_buf(), detail };
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| corrupt(format!("not JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| corrupt("lacks a weight_map object".into()))?;
        let mut files: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (name, file) in map {
            let file = file.as_str().ok_or_else(|| corrupt(format!("weight_map[{name:?}] is not a string")))?;
            if file.contains('/') || file.contains('\\') || file == ".." {
                return Err(corrupt(format!("weight_map[{name:?}] names {file:?} outside the model directory")));
            }
            files.entry(file).or_default().insert(name);
        }
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut set = SafeTensorsSet {
            files: Vec::new(),
            by_name: HashMap::new(),
            describe: index.display().to_string(),
            fp8_block: None,
        };
        for (file, names) in files {
            set.add_file(&dir.join(file), Some(&names))?;
        }
        // Every tensor the index promises must be in the file it names.
        for (name, file) in map {
            if !set.by_name.contains_key(name) {
                return Err(ModelError::MissingTensor {
                    name: name.clone(),
                    source_desc: format!("{} (index names it)", dir.join(file.as_str().unwrap_or("")).display()),
                });
            }
        }
        Ok(set)
    }

    fn add_file(&mut self, path: &Path, only: Option<&BTreeSet<&str>>) -> Result<(), ModelError> {
        let file = crate::file::open(path)?;
        // SAFETY: read-only map of a model file nobody writes while siphon runs.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
        let (n, metadata) = SafeTensors::read_metadata(&mmap).map_err(|e| ModelError::Corrupt {
            path: path.to_path_buf(),
            detail: format!("not a valid safetensors file: {e}"),
        })?;
        let idx = self.files.len();
        for (name, info) in metadata.tensors() {
            if only.is_some_and(|only| !only.contains(name.as_str())) {
                continue;
            }
            if let Some((other, _)) = self.by_name.get(&name) {
                return Err(ModelError::Corrupt {
                    path: path.to_path_buf(),
                    detail: format!("tensor {name:?} is also in {}", self.files[*other].path.display()),
                });
            }
            self.by_name.insert(name, (idx, info.clone()));
        }
        self.files.push(MappedFile { path: path.to_path_buf(), mmap, data_start: 8 + n });
        Ok(())
    }

    pub(crate) fn describe(&self) -> String {
        self.describe.clone()
    }

    pub(crate) fn names(&self) -> BTreeSet<String> {
        self.by_name.keys().cloned().collect()
    }

    fn entry(&self, name: &str) -> Result<&(usize, TensorInfo), ModelError> {
        self.by_name
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor { name: name.into(), source_desc: self.describe.clone() })
    }

    pub(crate) fn meta(&self, name: &str) -> Result<TensorMeta, ModelError> {
        if let Some(parts) = self.mxfp4_parts(name)? {
            return Ok(TensorMeta { name: name.into(), shape: parts.shape, stored: "MXFP4".into() });
        }
        if self.fp8_scales(name)?.is_some() {
            let (_, info) = self.entry(name)?;
            return Ok(TensorMeta {
                name: name.into(),
                shape: info.shape.clone(),
                stored: "F8_E4M3 block-scaled".into(),
            });
        }
        let (_, info) = self.entry(name)?;
        Ok(TensorMeta { name: name.into(), shape: info.shape.clone(), stored: format!("{:?}", info.dtype) })
    }

    /// The values of `name` when it is stored in a block-scaled format read by dequantizing
    /// (MXFP4 or FP8, see [`SafeTensorsSet::mxfp4`] and [`SafeTensorsSet::fp8`]); `None` for
    /// a plain F32/F16/BF16 tensor.
    pub(crate) fn dequantized(&self, name: &str) -> Result<Option<Dequantized>, ModelError> {
        match self.mxfp4(name)? {
            Some(t) => Ok(Some(t)),
            None => self.fp8(name),
        }
    }

    /// The values of `name` when it is an MXFP4 tensor (`name` = `…_blocks`, U8, beside its
    /// `…_scales`), with its dequantized shape ([`crate::mxfp4`]); `None` for any other tensor.
    fn mxfp4(&self, name: &str) -> Result<Option<Dequantized>, ModelError> {
        Ok(self
            .mxfp4_parts(name)?
            .map(|p| Dequantized { shape: p.shape, values: crate::mxfp4::dequantize(p.blocks, p.scales) }))
    }

    /// The values of `name` when it is an FP8 block-scaled weight (F8_E4M3 beside its
    /// `…_scale_inv`), dequantized as transformers does ([`crate::fp8`]); `None` for any other
    /// tensor.
    fn fp8(&self, name: &str) -> Result<Option<Dequantized>, ModelError> {
        let Some((grid, scales)) = self.fp8_scales(name)? else { return Ok(None) };
        let (_, info) = self.entry(name)?;
        let shape = info.shape.clone();
        let corrupt = |detail: String| ModelError::Corrupt { path: self.describe.clone().into(), detail };
        let [rows, cols] = shape[..] else {
            return Err(corrupt(format!("FP8 weight {name:?} has shape {shape:?}, not [rows, cols]")));
        };
        let block = self.fp8_block;
        let values = crate::fp8::dequantize(self.bytes(name)?, rows, cols, &scales, grid, block).ok_or_else(|| {
            ModelError::UnsupportedQuant(format!(
                "FP8 weight {name:?} {shape:?} with a {grid:?} scale grid that neither divides it nor is the config's \
                 weight_block_size {block:?} rounded up"
            ))
        })?;
        Ok(Some(Dequantized { shape, values }))
    }

    /// `name` as it stays on the device when kept stored: its FP8 bytes and f32 scale grid
    /// with the block they are read in; `None` unless it is an FP8 block-scaled weight.
    pub(crate) fn fp8_stored(&self, name: &str) -> Result<Option<crate::stored::StoredBytes>, ModelError> {
        let Some((grid, scales)) = self.fp8_scales(name)? else { return Ok(None) };
        let (_, info) = self.entry(name)?;
        let [rows, cols] = info.shape[..] else { return Ok(None) };
        let Some(block) = crate::fp8::block_of(rows, cols, grid, self.fp8_block) else { return Ok(None) };
        let weights = self.bytes(name)?;
        if let Some(i) = crate::fp8::first_non_finite(weights, cols, &scales, grid, block) {
            let detail = format!("value {i} (FP8 byte {:#04x} times its block's scale) is not finite", weights[i]);
            return Err(ModelError::NonFinite { name: name.into(), path: self.file_of(name), detail });
        }
        let scales = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
        Ok(Some((crate::stored::StoredForm::Fp8 { block }, vec![weights.to_vec(), scales])))
    }

    /// `name` (`…_blocks`) as it stays on the device when kept stored: its blocks, `[…, rows,
    /// groups · 16]`, and exponents, `[…, rows, groups]`; `None` unless it is MXFP4.
    pub(crate) fn mxfp4_stored(&self, name: &str) -> Result<Option<crate::stored::StoredBytes>, ModelError> {
        let Some(p) = self.mxfp4_parts(name)? else { return Ok(None) };
        if let Some(i) = crate::mxfp4::first_infinite(p.blocks, p.scales) {
            let detail =
                format!("value {i} is infinite: its group's scale 2^({} - 127) overflows f32", p.scales[i / 32]);
            return Err(ModelError::NonFinite { name: name.into(), path: self.file_of(name), detail });
        }
        Ok(Some((crate::stored::StoredForm::Mxfp4, vec![p.blocks.to_vec(), p.scales.to_vec()])))
    }

    /// The file the tensor `name` is in (the set's description when it has none).
    pub(crate) fn file_of(&self, name: &str) -> PathBuf {
        match self.by_name.get(name) {
            Some((idx, _)) => self.files[*idx].path.clone(),
            None => PathBuf::from(&self.describe),
        }
    }

    /// The scale grid and f32 scales of `name` when it is F8_E4M3 beside a `…_scale_inv`.
    fn fp8_scales(&self, name: &str) -> Result<Option<ScaleGrid>, ModelError> {
        let Some((_, info)) = self.by_name.get(name) else { return Ok(None) };
        let scale_name = format!("{name}_scale_inv");
        let Some((_, scale)) = self.by_name.get(&scale_name) else { return Ok(None) };
        if info.dtype != Dtype::F8_E4M3 {
            return Ok(None);
        }
        let bytes = self.bytes(&scale_name)?;
        let scales: Vec<f32> = match scale.dtype {
            Dtype::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect(),
            Dtype::BF16 => bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            Dtype::U8 | Dtype::F8_E8M0 => bytes.iter().map(|&b| crate::fp8::e8m0(b)).collect(),
            other => {
                return Err(ModelError::UnsupportedQuant(format!(
                    "FP8 scales {scale_name:?} are {other:?} (supported: F32, BF16, U8 and F8_E8M0 exponents)"
                )));
            }
        };
        let grid = match scale.shape[..] {
            [r, c] => [r, c],
            [] | [1] => [1, 1],
            _ => {
                return Err(ModelError::Corrupt {
                    path: self.describe.clone().into(),
                    detail: format!("FP8 scales {scale_name:?} have shape {:?}, not a 2-D grid", scale.shape),
                });
            }
        };
        Ok(Some((grid, scales)))
    }

    fn mxfp4_parts(&self, name: &str) -> Result<Option<Mxfp4Parts<'_>>, ModelError> {
        let Some(base) = name.strip_suffix("_blocks") else { return Ok(None) };
        let (_, blocks) = self.entry(name)?;
        let Some((_, scales)) = self.by_name.get(&format!("{base}_scales")) else { return Ok(None) };
        if blocks.dtype != Dtype::U8 || scales.dtype != Dtype::U8 {
            return Ok(None);
        }
        let [groups @ .., 16] = &blocks.shape[..] else {
            return Err(ModelError::Corrupt {
                path: self.describe.clone().into(),
                detail: format!("MXFP4 tensor {name:?} has shape {:?}, not […, 16]", blocks.shape),
            });
        };
        if *groups != scales.shape[..] {
            return Err(ModelError::Corrupt {
                path: self.describe.clone().into(),
                detail: format!("MXFP4 tensor {name:?} {:?} and its scales {:?} differ", blocks.shape, scales.shape),
            });
        }
        let mut shape = groups.to_vec();
        *shape.last_mut().expect("blocks have a group dimension") *= 32;
        Ok(Some(Mxfp4Parts { shape, blocks: self.bytes(name)?, scales: self.bytes(&format!("{base}_scales"))? }))
    }

    fn bytes(&self, name: &str) -> Result<&[u8], ModelError> {
        let (idx, info) = self.entry(name)?;
        let file = &self.files[*idx];
        let (a, b) = info.data_offsets;
        Ok(&file.mmap[file.data_start + a..file.data_start + b])
    }

    pub(crate) fn raw(&self, name: &str) -> Result<(Stored, Vec<usize>, &[u8]), ModelError> {
        let (idx, info) = self.entry(name)?;
        let file = &self.files[*idx];
        let stored = match info.dtype {
            Dtype::F32 => Stored::F32,
            Dtype::F16 => Stored::F16,
            Dtype::BF16 => Stored::Bf16,
            other => {
                return Err(ModelError::UnsupportedQuant(format!(
                    "tensor {name:?} in {} is {other:?} (supported: F32, F16, BF16)",
                    file.path.display()
                )));
            }
        };
        Ok((stored, info.shape.clone(), self.bytes(name)?))
    }
}

/// Safetensors encodings siphon reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    F32,
    F16,
    Bf16,
}

impl Stored {
    pub(crate) fn as_dtype(self) -> DType {
        match self {
            Stored::F32 => DType::F32,
            Stored::F16 => DType::F16,
            Stored::Bf16 => DType::Bf16,
        }
    }
}
