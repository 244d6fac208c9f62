//! [`Weights`]: one source of weight tensors by Hugging Face name, whatever the file format.
//!
//! Files stay memory-mapped. A tensor requested in the dtype it is stored in is returned as
//! a slice of the map (no copy); any conversion (f32 ↔ bf16/f16, GGUF dequantization and
//! llama.cpp's q/k row permutation) writes straight into the one output buffer, so a tensor
//! is never copied twice on its way to the device.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::path::Path;

use half::{bf16, f16};

use crate::config::{ParamInfo, Slice};
use crate::error::ModelError;
use crate::finite::first_non_finite;
use crate::gguf::convert::{self, RowOrder};
use crate::gguf::{GgmlType, GgufFile, dequant};
use crate::safetensors::{SafeTensorsSet, Stored};
use crate::stored::{StoredBytes, TensorMeta};

pub use siphon_dtype::DType;

/// A tensor on the host: little-endian elements of `dtype` in row-major order, borrowed from
/// the file's memory map when no conversion was needed.
#[derive(Debug, Clone)]
pub struct HostTensor<'a> {
    /// Element type of `data`.
    pub dtype: DType,
    /// Row-major shape.
    pub shape: Vec<usize>,
    /// `shape.product() * dtype.size()` bytes.
    pub data: Cow<'a, [u8]>,
}

impl HostTensor<'_> {
    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The elements as f32 (a copy; for tests and inspection).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.n_elements()];
        decode_into(self.dtype, &self.data, &mut out);
        out
    }

    /// Element `i` as f32.
    fn to_f32_at(&self, i: usize) -> f32 {
        let size = self.dtype.size();
        let mut out = [0.0];
        decode_into(self.dtype, &self.data[i * size..(i + 1) * size], &mut out);
        out[0]
    }
}

/// Weight tensors by Hugging Face name, from safetensors files or a GGUF file.
#[derive(Debug)]
pub struct Weights {
    inner: Inner,
    /// `(prefix, instead)`: where a missing name starting with `prefix` is looked for next.
    renames: &'static [(&'static str, &'static str)],
}

#[derive(Debug)]
enum Inner {
    SafeTensors(SafeTensorsSet),
    Gguf(GgufWeights),
}

#[derive(Debug)]
struct GgufWeights {
    file: GgufFile,
    /// HF name → index into the file's tensor directory, and how to read it.
    names: std::collections::BTreeMap<String, (usize, convert::Mapping)>,
}

impl Weights {
    /// Weights from one `model.safetensors` file.
    pub fn from_safetensors_file(path: &Path) -> Result<Weights, ModelError> {
        Ok(Weights { inner: Inner::SafeTensors(SafeTensorsSet::open_file(path)?), renames: &[] })
    }

    /// Weights from a `model.safetensors.index.json` and the files it names.
    pub fn from_safetensors_index(path: &Path) -> Result<Weights, ModelError> {
        Ok(Weights { inner: Inner::SafeTensors(SafeTensorsSet::open_index(path)?), renames: &[] })
    }

    /// Weights from an open GGUF file, named and laid out as transformers would load them.
    /// `n_heads`/`n_kv_heads` come from the file's config and undo llama.cpp's q/k
    /// permutation.
    /// `n_experts` splits a mixture's stacked expert tensors into one HF tensor per expert.
    pub fn from_gguf(
        file: GgufFile,
        n_heads: usize,
        n_kv_heads: usize,
        n_experts: usize,
    ) -> Result<Weights, ModelError> {
        let arch = convert::architecture(&file)?;
        let mut names = std::collections::BTreeMap::new();
        for (i, t) in file.tensors().iter().enumerate() {
            for mapping in convert::hf_names(&arch, &t.name, n_heads, n_kv_heads, n_experts) {
                names.insert(mapping.hf.clone(), (i, mapping));
            }
        }
        Ok(Weights { inner: Inner::Gguf(GgufWeights { file, names }), renames: &[] })
    }

    /// FP8 weights in blocks of `block` (the `weight_block_size` of the checkpoint's
    /// `quantization_config`), partial blocks at the edges included (see `crate::fp8`).
    pub fn with_fp8_block(mut self, block: Option<[usize; 2]>) -> Weights {
        if let Inner::SafeTensors(set) = &mut self.inner {
            set.set_fp8_block(block);
        }
        self
    }

    /// Looks a missing name up again under each of `renames` (`(prefix, instead)`, tried in
    /// order), for checkpoints that keep a family's tensors under another prefix.
    pub fn with_renames(mut self, renames: &'static [(&'static str, &'static str)]) -> Weights {
        self.renames = renames;
        self
    }

    /// The name `name` is stored under: itself, or its first rename the file has.
    fn resolve<'n>(&self, name: &'n str) -> Cow<'n, str> {
        if self.stored_meta(name).is_ok() {
            return Cow::Borrowed(name);
        }
        self.renames
            .iter()
            .filter_map(|(prefix, instead)| name.strip_prefix(prefix).map(|rest| format!("{instead}{rest}")))
            .find(|n| self.stored_meta(n).is_ok())
            .map_or(Cow::Borrowed(name), Cow::Owned)
    }

    /// Where the weights come from, for messages.
    pub fn describe(&self) -> String {
        match &self.inner {
            Inner::SafeTensors(s) => s.describe(),
            Inner::Gguf(g) => g.file.path().display().to_string(),
        }
    }

    /// All tensor names (Hugging Face naming), sorted.
    pub fn names(&self) -> BTreeSet<String> {
        match &self.inner {
            Inner::SafeTensors(s) => s.names(),
            Inner::Gguf(g) => g.names.keys().cloned().collect(),
        }
    }

    /// Stored shape and encoding of a tensor.
    pub fn meta(&self, name: &str) -> Result<TensorMeta, ModelError> {
        let mut meta = self.stored_meta(&self.resolve(name))?;
        meta.name = name.into();
        Ok(meta)
    }

    fn stored_meta(&self, name: &str) -> Result<TensorMeta, ModelError> {
        match &self.inner {
            Inner::SafeTensors(s) => s.meta(name),
            Inner::Gguf(g) => {
                let (t, mapping) = g.info(name)?;
                Ok(TensorMeta {
                    name: name.into(),
                    shape: GgufWeights::hf_shape(t, mapping),
                    stored: format!("{:?}", t.ggml_type),
                })
            }
        }
    }

    /// A tensor converted to `dtype` (borrowed from the map when stored as `dtype`); one
    /// holding a NaN or an infinity, stored or from its dequantization, is refused naming it
    /// and its file.
    pub fn get(&self, name: &str, dtype: DType) -> Result<HostTensor<'_>, ModelError> {
        let name = &*self.resolve(name);
        let tensor = self.read(name, dtype)?;
        match first_non_finite(tensor.dtype, &tensor.data) {
            None => Ok(tensor),
            Some(i) => {
                let value = tensor.to_f32_at(i);
                let detail = format!("holds {value} (element {i} of {})", tensor.n_elements());
                Err(ModelError::NonFinite { name: name.into(), path: self.file_of(name), detail })
            }
        }
    }

    /// The file the stored tensor `name` is in.
    fn file_of(&self, name: &str) -> std::path::PathBuf {
        match &self.inner {
            Inner::SafeTensors(s) => s.file_of(name),
            Inner::Gguf(g) => g.file.path().to_path_buf(),
        }
    }

    /// The stored tensor `name` converted to `dtype`.
    fn read(&self, name: &str, dtype: DType) -> Result<HostTensor<'_>, ModelError> {
        match &self.inner {
            Inner::SafeTensors(s) => {
                if let Some(t) = s.dequantized(name)? {
                    let mut data = vec![0u8; t.values.len() * dtype.size()];
                    encode_into(dtype, &t.values, &mut data);
                    return Ok(HostTensor { dtype, shape: t.shape, data: Cow::Owned(data) });
                }
                let (stored, shape, bytes) = s.raw(name)?;
                let data = convert_bytes(stored, bytes, dtype);
                Ok(HostTensor { dtype, shape, data })
            }
            Inner::Gguf(g) => g.get(name, dtype),
        }
    }

    /// [`Weights::get`], or `None` where the weights hold no tensor `name` (for files whose
    /// tensors are optional, as a dictionary's are).
    pub fn get_if_stored(&self, name: &str, dtype: DType) -> Result<Option<HostTensor<'_>>, ModelError> {
        match self.get(name, dtype) {
            Ok(t) => Ok(Some(t)),
            Err(ModelError::MissingTensor { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Checks that the tensor a forward parameter is read from exists with the shape the
    /// config implies.
    pub fn check(&self, param: &ParamInfo) -> Result<(), ModelError> {
        if !param.stack.is_empty() {
            return param.stack.iter().try_for_each(|name| {
                self.check(&ParamInfo::new(name.clone(), &param.shape[1..], param.class, param.layer))
            });
        }
        let expected = param.source.as_ref().map_or(&param.shape, |s| &s.stored);
        let meta = self.meta(param.stored_name())?;
        if meta.shape != *expected {
            return Err(ModelError::ShapeMismatch {
                name: param.stored_name().into(),
                expected: expected.clone(),
                found: meta.shape,
                source_desc: self.describe(),
            });
        }
        Ok(())
    }

    /// The tensor a forward parameter needs, checked against the shape the config expects,
    /// and cut from its stored tensor when it is part of one ([`crate::config::Slice`]).
    pub fn load(&self, param: &ParamInfo, dtype: DType) -> Result<HostTensor<'_>, ModelError> {
        self.check(param)?;
        if !param.stack.is_empty() {
            let mut data = Vec::with_capacity(param.shape.iter().product::<usize>() * dtype.size());
            for name in &param.stack {
                data.extend_from_slice(&self.get(name, dtype)?.data);
            }
            return Ok(HostTensor { dtype, shape: param.shape.clone(), data: Cow::Owned(data) });
        }
        let whole = self.get(param.stored_name(), dtype)?;
        let Some(slice) = &param.source else { return Ok(whole) };
        let data = slice_rows(slice, dtype.size(), &whole.data);
        debug_assert_eq!(data.len(), param.shape.iter().product::<usize>() * dtype.size());
        Ok(HostTensor { dtype, shape: param.shape.clone(), data: Cow::Owned(data) })
    }
}

impl Weights {
    /// The form `param` can stay in on the device ([`crate::stored::StoredForm`]): an FP8 or MXFP4 weight (rows
    /// of one cut as GPT-OSS cuts its gate and up), or a
    /// GGUF block-quantized one read as it is stored (not transposed, not shifted, rows of
    /// whole blocks); stacked experts when every expert's is the same. `None` for anything
    /// else, which is dequantized on load.
    pub fn stored_form(&self, param: &ParamInfo) -> Result<Option<crate::stored::StoredForm>, ModelError> {
        if let Some(slice) = &param.source {
            // Rows of a stored tensor (GPT-OSS's interleaved gate and up): each row keeps its
            // blocks; a transposed one does not.
            let form = self.stored_one(&self.resolve(&slice.tensor))?.map(|(f, _)| f);
            return Ok(
                form.filter(|f| !slice.transposed && *f == crate::stored::StoredForm::Mxfp4 && f.fits(&param.shape))
            );
        }
        let mut form = None;
        for name in members(param) {
            let this = self.stored_one(&self.resolve(name))?.map(|(f, _)| f);
            if this.is_none() || (form.is_some() && form != this) {
                return Ok(None);
            }
            form = this;
        }
        Ok(form.filter(|f| f.fits(&param.shape)))
    }

    /// `param`'s parts in its stored form ([`Weights::stored_form`]), experts stacked.
    pub fn load_stored(
        &self,
        param: &ParamInfo,
        form: crate::stored::StoredForm,
    ) -> Result<Vec<HostTensor<'_>>, ModelError> {
        self.check(param)?;
        if let Some(slice) = &param.source {
            let Some((f, whole)) = self.stored_one(&self.resolve(&slice.tensor))? else {
                return Err(ModelError::UnsupportedQuant(format!("{} is not stored as {form:?}", slice.tensor)));
            };
            // Each part's rows as the slice takes the weight's: the same rows, their own widths.
            let stored_parts = f.parts(&slice.stored);
            return Ok(form
                .parts(&param.shape)
                .into_iter()
                .zip(stored_parts)
                .zip(whole)
                .map(|((p, stored), bytes)| {
                    let part_slice = Slice { stored: stored.shape, ..slice.clone() };
                    let data = slice_rows(&part_slice, p.dtype.size(), &bytes);
                    HostTensor { dtype: p.dtype, shape: p.shape, data: Cow::Owned(data) }
                })
                .collect());
        }
        let names = members(param);
        let parts = form.parts(&param.shape);
        let mut data: Vec<Vec<u8>> = parts.iter().map(|_| Vec::new()).collect();
        for name in names {
            let Some((f, bytes)) = self.stored_one(&self.resolve(name))? else {
                return Err(ModelError::UnsupportedQuant(format!("{name} is not stored as {form:?}")));
            };
            if f != form {
                return Err(ModelError::UnsupportedQuant(format!("{name} is stored as {f:?}, not {form:?}")));
            }
            data.iter_mut().zip(bytes).for_each(|(d, b)| d.extend(b));
        }
        Ok(parts
            .into_iter()
            .zip(data)
            .map(|(p, data)| HostTensor { dtype: p.dtype, shape: p.shape, data: Cow::Owned(data) })
            .collect())
    }

    /// One stored tensor's form and its parts' bytes, if it has a form kept on the device.
    fn stored_one(&self, name: &str) -> Result<Option<StoredBytes>, ModelError> {
        match &self.inner {
            Inner::SafeTensors(s) => match s.fp8_stored(name)? {
                Some(fp8) => Ok(Some(fp8)),
                None => s.mxfp4_stored(name),
            },
            Inner::Gguf(g) => g.stored(name),
        }
    }
}

impl GgufWeights {
    /// A block-quantized tensor's parts in HF row order: per row its blocks' f16 scales (and mins)
    /// and their quants, as [`crate::stored::StoredForm`] lays them out.
    fn stored(&self, name: &str) -> Result<Option<StoredBytes>, ModelError> {
        use crate::stored::StoredForm;
        let (t, mapping) = self.info(name)?;
        let form = match t.ggml_type {
            GgmlType::Q8_0 => StoredForm::Q8_0,
            GgmlType::Q4_0 => StoredForm::Q4_0,
            GgmlType::Q4_1 => StoredForm::Q4_1,
            GgmlType::Q4K => StoredForm::Q4K,
            GgmlType::Q6K => StoredForm::Q6K,
            _ => return Ok(None),
        };
        if mapping.transpose || mapping.minus_one || t.dims.len() < 2 {
            return Ok(None);
        }
        let raw = self.file.data(t);
        let row_len = t.dims[0];
        let n_rows = t.n_elements() / row_len;
        let (first, n_rows) = match mapping.expert {
            Some((e, n)) => (e * (n_rows / n), n_rows / n),
            None => (0, n_rows),
        };
        self.check_heads(name, mapping.order, n_rows, row_len, &Self::hf_shape(t, mapping))?;
        let (bb, nb) = (t.ggml_type.block_bytes(), row_len / t.ggml_type.block_size());
        let row_bytes = nb * bb;
        let mut parts: Vec<Vec<u8>> = vec![Vec::new(); form.parts(&[1, QK_K]).len()];
        for hf_row in 0..n_rows {
            let src_row = first + convert::hf_row_of(mapping.order, n_rows, hf_row);
            for block in raw[src_row * row_bytes..(src_row + 1) * row_bytes].chunks_exact(bb) {
                split_block(form, block, &mut parts);
            }
        }
        // The blocks' f16 scales and mins: every other part is a small integer, so these
        // alone can make a stored weight's values non-finite.
        for (part, bytes) in form.parts(&[1, QK_K]).iter().zip(&parts) {
            if let Some(i) = first_non_finite(part.dtype, bytes) {
                let value = f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]);
                let detail = format!("a block's f16 scale is {value} ({:?}, scale {i} of its part)", t.ggml_type);
                return Err(ModelError::NonFinite { name: name.into(), path: self.file.path().to_path_buf(), detail });
            }
        }
        Ok(Some((form, parts)))
    }
}

/// Values per k-quant super-block.
const QK_K: usize = 256;

/// Appends one GGUF block's fields to `parts`, in [`crate::stored::StoredForm::parts`]' order: its f16
/// scale (and min), then its quants as stored — Q4_K's packed 6-bit scales and mins unpacked
/// to a byte each, Q6_K's values gathered from their bit planes to a byte each, in order.
fn split_block(form: crate::stored::StoredForm, block: &[u8], parts: &mut [Vec<u8>]) {
    use crate::stored::StoredForm::*;
    match form {
        Q8_0 | Q4_0 => {
            parts[0].extend_from_slice(&block[..2]);
            parts[1].extend_from_slice(&block[2..]);
        }
        Q4_1 => {
            parts[0].extend_from_slice(&block[..2]);
            parts[1].extend_from_slice(&block[2..4]);
            parts[2].extend_from_slice(&block[4..]);
        }
        Q4K => {
            parts[0].extend_from_slice(&block[..2]);
            parts[1].extend_from_slice(&block[2..4]);
            for j in 0..8 {
                let (sc, m) = dequant::scale_min_k4(j, &block[4..16]);
                parts[2].push(sc);
                parts[3].push(m);
            }
            parts[4].extend_from_slice(&block[16..144]);
        }
        Q6K => {
            parts[0].extend_from_slice(&block[208..210]);
            parts[1].extend_from_slice(&block[192..208]);
            let mut q = [0u8; QK_K];
            for half in 0..2 {
                let (ql, qh) = (&block[64 * half..64 * half + 64], &block[128 + 32 * half..128 + 32 * half + 32]);
                let y = &mut q[128 * half..128 * half + 128];
                for l in 0..32 {
                    y[l] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
                    y[l + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
                    y[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                    y[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                }
            }
            parts[2].extend_from_slice(&q);
        }
        Fp8 { .. } | Mxfp4 => unreachable!("not a GGUF block form"),
    }
}

/// The stored tensors `param` is read from: its stack's, or its own.
fn members(param: &ParamInfo) -> Vec<&str> {
    match param.stack.is_empty() {
        true => vec![param.name.as_str()],
        false => param.stack.iter().map(String::as_str).collect(),
    }
}

/// The bytes of `slice` (elements of `size` bytes) taken from its stored tensor's `bytes`.
fn slice_rows(slice: &Slice, size: usize, bytes: &[u8]) -> Vec<u8> {
    // Stacked experts `[E, r, c]` (Gemma 4's fused gate_up; GPT-OSS's, stored `[in, out]`
    // per expert) are cut per expert; a 2-D tensor is one expert.
    let (experts, r, c) = match slice.stored[..] {
        [e, r, c] => (e, r, c),
        [r, c] => (1, r, c),
        [r] => (1, r, 1),
        _ => unreachable!("slices are of 1-D, 2-D and stacked 3-D tensors"),
    };
    let (rows, cols) = if slice.transposed { (experts * c, r) } else { (experts * r, c) };
    let row_bytes = cols * size;
    let row = |i: usize| -> std::borrow::Cow<'_, [u8]> {
        if !slice.transposed {
            return Cow::Borrowed(&bytes[i * row_bytes..(i + 1) * row_bytes]);
        }
        // Row i of the transpose: column i % c of expert i / c's stored [r, c] matrix.
        let (x, j) = (i / c, i % c);
        let mut out = Vec::with_capacity(row_bytes);
        for k in 0..r {
            let at = ((x * r + k) * c + j) * size;
            out.extend_from_slice(&bytes[at..at + size]);
        }
        Cow::Owned(out)
    };
    let block = rows / slice.groups;
    let mut out = Vec::with_capacity(slice.groups * slice.len * row_bytes);
    for g in 0..slice.groups {
        for i in g * block + slice.start..g * block + slice.start + slice.len {
            out.extend_from_slice(&row(i));
        }
    }
    out
}

impl GgufWeights {
    fn info(&self, name: &str) -> Result<(&crate::gguf::GgufTensorInfo, &convert::Mapping), ModelError> {
        let (i, mapping) = self.names.get(name).ok_or_else(|| ModelError::MissingTensor {
            name: name.into(),
            source_desc: self.file.path().display().to_string(),
        })?;
        Ok((&self.file.tensors()[*i], mapping))
    }

    /// Checks that `n_rows` rows reordered as `order` says split into its heads, each of 2
    /// (q, k) or 3 (fused qkv) equal parts.
    fn check_heads(
        &self,
        name: &str,
        order: RowOrder,
        n_rows: usize,
        row_len: usize,
        shape: &[usize],
    ) -> Result<(), ModelError> {
        let heads = match order {
            RowOrder::ReversePermute { n_heads } => Some((n_heads, 2)),
            RowOrder::PerHeadQkv { n_heads } => Some((n_heads, 3)),
            RowOrder::Identity => None,
        };
        if let Some((n_heads, per)) = heads
            && (n_heads == 0 || !n_rows.is_multiple_of(per * n_heads))
        {
            return Err(ModelError::ShapeMismatch {
                name: name.into(),
                expected: vec![n_heads * per, row_len],
                found: shape.to_vec(),
                source_desc: format!(
                    "{} (rows must split into {n_heads} heads of {per} equal parts)",
                    self.file.path().display()
                ),
            });
        }
        Ok(())
    }

    /// The HF shape of a tensor: one expert's rows of a stacked tensor, transposed where HF
    /// stores `[in, out]`.
    fn hf_shape(t: &crate::gguf::GgufTensorInfo, mapping: &convert::Mapping) -> Vec<usize> {
        let mut shape = t.shape();
        if mapping.expert.is_some() {
            shape.remove(0);
        }
        if mapping.transpose {
            shape.reverse();
        }
        shape
    }

    fn get(&self, name: &str, dtype: DType) -> Result<HostTensor<'_>, ModelError> {
        let (t, mapping) = self.info(name)?;
        let shape = Self::hf_shape(t, mapping);
        let raw = self.file.data(t);
        let order = mapping.order;
        let block_row = t.dims[0];
        let total_rows = t.n_elements() / block_row.max(1);
        // A 1-D tensor reordered element by element (GPT-NeoX's qkv bias) is read as rows of
        // one element; biases are never block-quantized.
        let elementwise = t.dims.len() == 1 && order != RowOrder::Identity;
        let (row_len, n_rows) = if elementwise { (1, t.n_elements()) } else { (block_row, total_rows) };
        let (first, n_rows) = match mapping.expert {
            Some((e, n)) => (e * (n_rows / n), n_rows / n),
            None => (0, n_rows),
        };
        if elementwise && t.ggml_type.block_size() != 1 {
            return Err(ModelError::UnsupportedQuant(format!(
                "{name}: a block-quantized ({:?}) 1-D tensor whose elements are reordered",
                t.ggml_type
            )));
        }
        let row_bytes = row_len / t.ggml_type.block_size() * t.ggml_type.block_bytes();
        self.check_heads(name, order, n_rows, row_len, &shape)?;
        let mut row = vec![0f32; row_len];
        let read_row = |hf_row: usize, row: &mut [f32]| {
            let src_row = first + convert::hf_row_of(order, n_rows, hf_row);
            let src = &raw[src_row * row_bytes..(src_row + 1) * row_bytes];
            dequant::dequantize(t.ggml_type, src, row);
            if mapping.minus_one {
                row.iter_mut().for_each(|v| *v -= 1.0);
            }
        };
        let mut out = vec![0u8; n_rows * row_len * dtype.size()];
        if mapping.transpose {
            // [n_rows, row_len] as stored -> [row_len, n_rows].
            let mut values = vec![0f32; n_rows * row_len];
            for r in 0..n_rows {
                read_row(r, &mut row);
                for (c, v) in row.iter().enumerate() {
                    values[c * n_rows + r] = *v;
                }
            }
            encode_into(dtype, &values, &mut out);
        } else {
            let out_row_bytes = row_len * dtype.size();
            for (hf_row, dst) in out.chunks_exact_mut(out_row_bytes.max(1)).enumerate().take(n_rows) {
                read_row(hf_row, &mut row);
                encode_into(dtype, &row, dst);
            }
        }
        Ok(HostTensor { dtype, shape, data: Cow::Owned(out) })
    }
}

fn convert_bytes(stored: Stored, bytes: &[u8], want: DType) -> Cow<'_, [u8]> {
    let from = stored.as_dtype();
    if from == want {
        return Cow::Borrowed(bytes);
    }
    let n = bytes.len() / from.size();
    let mut out = vec![0u8; n * want.size()];
    // Convert in chunks through a small f32 buffer so no full-size f32 copy is made.
    const CHUNK: usize = 4096;
    let mut tmp = vec![0f32; CHUNK];
    for (src, dst) in bytes.chunks(CHUNK * from.size()).zip(out.chunks_mut(CHUNK * want.size())) {
        let m = src.len() / from.size();
        decode_into(from, src, &mut tmp[..m]);
        encode_into(want, &tmp[..m], dst);
    }
    Cow::Owned(out)
}

/// Decodes little-endian elements of `dtype` into f32.
pub fn decode_into(dtype: DType, src: &[u8], dst: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (s, d) in src.chunks_exact(4).zip(dst) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        DType::Bf16 => {
            for (s, d) in src.chunks_exact(2).zip(dst) {
                *d = bf16::from_le_bytes([s[0], s[1]]).to_f32();
            }
        }
        DType::F16 => {
            for (s, d) in src.chunks_exact(2).zip(dst) {
                *d = f16::from_le_bytes([s[0], s[1]]).to_f32();
            }
        }
        DType::U8 => src.iter().zip(dst).for_each(|(s, d)| *d = f32::from(*s)),
        DType::Fp8 => src.iter().zip(dst).for_each(|(s, d)| *d = crate::fp8::e4m3(*s)),
    }
}

/// Encodes f32 values as little-endian elements of `dtype` (round to nearest even).
pub fn encode_into(dtype: DType, src: &[f32], dst: &mut [u8]) {
    match dtype {
        DType::F32 => {
            for (s, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
                d.copy_from_slice(&s.to_le_bytes());
            }
        }
        DType::Bf16 => {
            for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
                d.copy_from_slice(&bf16::from_f32(*s).to_le_bytes());
            }
        }
        DType::F16 => {
            for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
                d.copy_from_slice(&f16::from_f32(*s).to_le_bytes());
            }
        }
        // Byte values (stored block formats), saturating.
        DType::U8 => src.iter().zip(dst).for_each(|(s, d)| *d = *s as u8),
        DType::Fp8 => src.iter().zip(dst).for_each(|(s, d)| *d = siphon_hlo::e4m3fn_bits(f64::from(*s))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_borrows_when_dtype_matches() {
        let bytes: Vec<u8> = [1.0f32, -0.5, 3.25].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert!(matches!(convert_bytes(Stored::F32, &bytes, DType::F32), Cow::Borrowed(_)));
        let bf = convert_bytes(Stored::F32, &bytes, DType::Bf16);
        let t = HostTensor { dtype: DType::Bf16, shape: vec![3], data: bf };
        assert_eq!(t.to_f32_vec(), vec![1.0, -0.5, 3.25]);
        let back = convert_bytes(Stored::Bf16, &t.data, DType::F16);
        let t = HostTensor { dtype: DType::F16, shape: vec![3], data: back };
        assert_eq!(t.to_f32_vec(), vec![1.0, -0.5, 3.25]);
    }

    #[test]
    fn dtype_parses() {
        assert_eq!("BF16".parse::<DType>().unwrap(), DType::Bf16);
        assert!("int8".parse::<DType>().unwrap_err().to_string().contains("int8"));
    }
}
