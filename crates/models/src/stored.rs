//! Weights kept on the devices in the form their checkpoint stores them (`--weights stored`):
//! FP8 bytes with their block scales, GPT-OSS's MXFP4, GGUF's Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K
//! blocks (the k-quants' packed scales and bit planes unpacked to a byte each). The forward takes
//! each such weight as its parts and dequantizes it inside the program where the layer uses
//! it, computing exactly what the host-side readers compute ([`crate::fp8`],
//! [`crate::gguf`]'s dequantization): every value is the same f32 product, so the matmuls see
//! the same weights and the activations equal dequantize-on-load bit for bit in f32.
//!
//! A weight's parts split over the mesh as the weight does, on whole blocks only
//! ([`StoredForm::part_specs`] refuses a split that would cut one, naming the weight; the
//! planner keeps such a dimension whole, [`StoredForm::whole_blocks`]).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use siphon_dtype::DType;
use siphon_hlo::{Builder, CompareDir, DType as Hlo, TensorType, Value};
use siphon_mesh::{Mesh, PartitionSpec};

use crate::config::{ModelConfig, ParamClass};
use crate::error::ModelError;

/// A stored form a weight can stay in on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StoredForm {
    /// FP8 E4M3 bytes `[…, rows, cols]` and an f32 scale per `block` (`[…, ⌈rows/br⌉,
    /// ⌈cols/bc⌉]`, partial at the edges).
    Fp8 {
        /// `[br, bc]`.
        block: [usize; 2],
    },
    /// GGUF Q8_0: per 32 values of a row an f16 scale `d` and 32 signed bytes, `d · q`.
    Q8_0,
    /// GGUF Q4_0: per 32 values an f16 `d` and 16 bytes of nibbles, `d · (q − 8)`.
    Q4_0,
    /// GGUF Q4_1: per 32 values f16 `d` and `m` and 16 bytes of nibbles, `d · q + m`.
    Q4_1,
    /// GGUF Q4_K: per 256 values f16 `d` and `dmin`, per 32 of them a 6-bit scale and min
    /// (unpacked to a byte each) and nibbles, `d·sc · q − dmin·m`.
    Q4K,
    /// GGUF Q6_K: per 256 values an f16 `d`, per 16 of them a signed 8-bit scale, and 6-bit
    /// values (gathered from their low and high bit planes into a byte each), `d·sc · (q − 32)`.
    Q6K,
    /// MXFP4 (GPT-OSS's experts): per 32 values of a row 16 bytes of E2M1 nibbles (low
    /// first) and one E8M0 exponent byte, `e2m1 · 2^(e − 127)`.
    Mxfp4,
}

/// A tensor's stored form and its parts' bytes, in [`StoredForm::parts`]' order.
pub(crate) type StoredBytes = (StoredForm, Vec<Vec<u8>>);

/// Values per GGUF block.
const QK: usize = 32;
/// Values per GGUF k-quant super-block.
const QK_K: usize = 256;

/// One array a stored weight is uploaded as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its element type.
    pub dtype: DType,
}

impl StoredForm {
    /// The arrays a weight of `shape` (`[…, rows, cols]`, experts stacked first) is kept as,
    /// in the order the program takes them.
    pub fn parts(self, shape: &[usize]) -> Vec<Part> {
        let n = shape.len();
        let with = |last2: [usize; 2], dtype| {
            let mut s = shape[..n - 2].to_vec();
            s.extend(last2);
            Part { shape: s, dtype }
        };
        let (r, c) = (shape[n - 2], shape[n - 1]);
        match self {
            StoredForm::Fp8 { block: [br, bc] } => {
                vec![with([r, c], DType::U8), with([r.div_ceil(br), c.div_ceil(bc)], DType::F32)]
            }
            StoredForm::Q8_0 => vec![with([r, c / QK], DType::F16), with([r, c], DType::U8)],
            StoredForm::Q4_0 => vec![with([r, c / QK], DType::F16), with([r, c / 2], DType::U8)],
            StoredForm::Q4_1 => {
                vec![with([r, c / QK], DType::F16), with([r, c / QK], DType::F16), with([r, c / 2], DType::U8)]
            }
            StoredForm::Q4K => vec![
                with([r, c / QK_K], DType::F16),
                with([r, c / QK_K], DType::F16),
                with([r, c / QK], DType::U8),
                with([r, c / QK], DType::U8),
                with([r, c / 2], DType::U8),
            ],
            StoredForm::Q6K => {
                vec![with([r, c / QK_K], DType::F16), with([r, c / 16], DType::U8), with([r, c], DType::U8)]
            }
            StoredForm::Mxfp4 => vec![with([r, c / 2], DType::U8), with([r, c / QK], DType::U8)],
        }
    }

    /// Bytes of a weight of `shape` in this form.
    pub fn bytes(self, shape: &[usize]) -> usize {
        self.parts(shape).iter().map(|p| p.shape.iter().product::<usize>() * p.dtype.size()).sum()
    }

    /// Whether a weight of `shape` can be kept in this form (GGUF rows of whole blocks).
    pub fn fits(self, shape: &[usize]) -> bool {
        let [br, bc] = self.block();
        let partial_blocks = matches!(self, StoredForm::Fp8 { .. });
        shape.len() >= 2 && br > 0 && bc > 0 && (partial_blocks || shape[shape.len() - 1].is_multiple_of(bc))
    }

    /// The block a weight of this form is cut in along its last two dimensions.
    fn block(self) -> [usize; 2] {
        match self {
            StoredForm::Fp8 { block } => block,
            StoredForm::Q4K | StoredForm::Q6K => [1, QK_K],
            _ => [1, QK],
        }
    }

    /// `spec` less the splits of a weight of `shape` that would cut this form's blocks (those
    /// dimensions kept whole), and whether any was dropped.
    pub fn whole_blocks(self, shape: &[usize], spec: &PartitionSpec, mesh: &Mesh) -> (PartitionSpec, bool) {
        let cuts = self.cuts(shape, spec, mesh);
        let mut dims = spec.dims().to_vec();
        for &(d, _, _) in &cuts {
            dims[d].clear();
        }
        (PartitionSpec::from_dims(dims), !cuts.is_empty())
    }

    /// The dimensions `spec` splits across this form's blocks: `(dimension, ways, block)`.
    fn cuts(self, shape: &[usize], spec: &PartitionSpec, mesh: &Mesh) -> Vec<(usize, usize, usize)> {
        let n = shape.len();
        let [br, bc] = self.block();
        [(n - 2, br), (n - 1, bc)]
            .into_iter()
            .map(|(d, b)| (d, spec.ways(d, mesh), b))
            .filter(|&(d, ways, b)| ways > 1 && !shape[d].is_multiple_of(ways * b))
            .collect()
    }

    /// Each part's partition spec for the weight `name` of `shape` split by `spec`: the same
    /// axes on the same dimensions, where every device's share holds whole blocks; a split
    /// that would cut one is refused.
    pub fn part_specs(
        self,
        name: &str,
        shape: &[usize],
        spec: &PartitionSpec,
        mesh: &Mesh,
    ) -> Result<Vec<PartitionSpec>, ModelError> {
        if let Some(&(d, ways, b)) = self.cuts(shape, spec, mesh).first() {
            return Err(ModelError::Sharding(format!(
                "{name} {shape:?} split {ways} ways on dimension {d} would cut its {self:?} blocks of {b}: \
                 keep it replicated there, or dequantize the weights on load"
            )));
        }
        Ok(self.parts(shape).iter().map(|_| spec.clone()).collect())
    }

    /// The weight, `[…, rows, cols]` in `dt`, from its parts inside the program. With
    /// `without_tables`, FP8 bytes become values by XLA's `f8E4M3FN` conversion (a bitcast
    /// and a convert) and MXFP4's by their bits ([`e2m1_from_bits`], [`e8m0_from_bits`]), the
    /// same values, instead of a table's gather, which libtpu costs at kilobytes an element.
    pub(crate) fn dequantize(
        self,
        b: &mut Builder,
        parts: &[Value],
        shape: &[usize],
        dt: Hlo,
        without_tables: bool,
    ) -> Result<Value, ModelError> {
        let n = shape.len();
        let (r, c) = (shape[n - 2], shape[n - 1]);
        let lead = &shape[..n - 2];
        let dims = |last: &[usize]| [lead, last].concat();
        let values = match self {
            StoredForm::Fp8 { block: [br, bc] } => {
                let w = if without_tables {
                    let w = b.bitcast_convert(parts[0], Hlo::F8E4M3FN)?;
                    b.convert(w, Hlo::F32)?
                } else {
                    let table: Vec<f32> = (0..=255u8).map(crate::fp8::e4m3).collect();
                    byte_table(b, parts[0], &table)?
                };
                let (sr, sc) = (r.div_ceil(br), c.div_ceil(bc));
                let mut map: Vec<usize> = (0..lead.len()).collect();
                map.extend([n - 2, n]);
                let s = b.broadcast_in_dim(parts[1], &dims(&[sr, br, sc, bc]), &map)?;
                let s = b.reshape(s, &dims(&[sr * br, sc * bc]))?;
                let s = b.slice_dim(s, n - 2, 0, r)?;
                let s = b.slice_dim(s, n - 1, 0, c)?;
                b.mul(w, s)?
            }
            StoredForm::Q8_0 => {
                let table: Vec<f32> = (0..=255u8).map(|q| f32::from(q as i8)).collect();
                let q = byte_table(b, parts[1], &table)?;
                let q = b.reshape(q, &dims(&[r, c / QK, QK]))?;
                let d = per_block(b, parts[0], &dims(&[r, c / QK, QK]))?;
                let v = b.mul(d, q)?;
                b.reshape(v, &dims(&[r, c]))?
            }
            StoredForm::Q4_0 | StoredForm::Q4_1 => {
                let qs = parts[parts.len() - 1];
                let nb = c / QK;
                let qs = b.reshape(qs, &dims(&[r, nb, QK / 2]))?;
                // Low nibbles are a block's first 16 values, high nibbles its last 16.
                let q = nibbles(b, qs, n)?;
                let q = b.convert(q, Hlo::F32)?;
                let full = dims(&[r, nb, QK]);
                let d = per_block(b, parts[0], &full)?;
                let v = if self == StoredForm::Q4_0 {
                    let eight = b.splat(8.0, TensorType::new(Hlo::F32, &full))?;
                    let q = b.sub(q, eight)?;
                    b.mul(d, q)?
                } else {
                    let m = per_block(b, parts[1], &full)?;
                    let dq = b.mul(d, q)?;
                    b.add(dq, m)?
                };
                b.reshape(v, &dims(&[r, c]))?
            }
            StoredForm::Q4K => {
                let nsb = c / QK_K;
                // Each 32 bytes of a super-block's quants: a sub-block in the low nibbles,
                // the next in the high ones.
                let qs = b.reshape(parts[4], &dims(&[r, nsb, 4, 1, QK]))?;
                let q = nibbles(b, qs, n + 1)?;
                let q = b.reshape(q, &dims(&[r, nsb, 8, QK]))?;
                let q = b.convert(q, Hlo::F32)?;
                let sub = dims(&[r, nsb, 8]);
                let scaled = |b: &mut Builder, d: Value, s: Value| -> Result<Value, ModelError> {
                    let d = per_block(b, d, &sub)?;
                    let s = b.reshape(s, &sub)?;
                    let s = b.convert(s, Hlo::F32)?;
                    Ok(b.mul(d, s)?)
                };
                let d1 = scaled(b, parts[0], parts[2])?;
                let m1 = scaled(b, parts[1], parts[3])?;
                let full = dims(&[r, nsb, 8, QK]);
                let map: Vec<usize> = (0..n + 1).collect();
                let d1 = b.broadcast_in_dim(d1, &full, &map)?;
                let m1 = b.broadcast_in_dim(m1, &full, &map)?;
                let v = b.mul(d1, q)?;
                let v = b.sub(v, m1)?;
                b.reshape(v, &dims(&[r, c]))?
            }
            StoredForm::Q6K => {
                let nsb = c / QK_K;
                let sub = dims(&[r, nsb, 16]);
                let signed: Vec<f32> = (0..=255u8).map(|v| f32::from(v as i8)).collect();
                let sc = b.reshape(parts[1], &sub)?;
                let sc = byte_table(b, sc, &signed)?;
                let d = per_block(b, parts[0], &sub)?;
                let s = b.mul(d, sc)?;
                let full = dims(&[r, nsb, 16, 16]);
                let map: Vec<usize> = (0..n + 1).collect();
                let s = b.broadcast_in_dim(s, &full, &map)?;
                let q = b.reshape(parts[2], &full)?;
                let q = b.convert(q, Hlo::F32)?;
                let offset = b.splat(32.0, TensorType::new(Hlo::F32, &full))?;
                let q = b.sub(q, offset)?;
                let v = b.mul(s, q)?;
                b.reshape(v, &dims(&[r, c]))?
            }
            StoredForm::Mxfp4 => {
                let blocks = b.reshape(parts[0], &dims(&[r, c / 2, 1]))?;
                // Each byte's low nibble, then its high one.
                let nibbles = nibbles(b, blocks, n)?;
                let nibbles = b.reshape(nibbles, &dims(&[r, c / QK, QK]))?;
                // 2·e2m1 · 2^(e − 128): exact, and finite at e = 255 where 2^(e − 127) is not.
                let (v, p) = if without_tables {
                    (e2m1_from_bits(b, nibbles)?, e8m0_from_bits(b, parts[1])?)
                } else {
                    let e2m1: Vec<f32> = crate::mxfp4::E2M1.iter().map(|v| 2.0 * v).collect();
                    let powers: Vec<f32> = (0..=255).map(|e| 2f64.powi(e - 128) as f32).collect();
                    (byte_table(b, nibbles, &e2m1)?, byte_table(b, parts[1], &powers)?)
                };
                let map: Vec<usize> = (0..n).collect();
                let p = b.broadcast_in_dim(p, &dims(&[r, c / QK, QK]), &map)?;
                let v = b.mul(v, p)?;
                b.reshape(v, &dims(&[r, c]))?
            }
        };
        Ok(b.convert(values, dt)?)
    }
}

/// The weights of `config`'s first `n_layers` blocks that an FP8 checkpoint (`quantization_config`
/// `fp8` with blocks of `block`) stores FP8, as transformers' FP8 quantizer converts them: every
/// linear projection (attention, latents, MLPs, experts); not the embeddings, routers, norms or
/// lm_head. For planning from a config alone.
pub fn fp8_forms(config: &ModelConfig, n_layers: usize, block: [usize; 2]) -> HashMap<String, StoredForm> {
    use ParamClass::*;
    config
        .params(n_layers, false)
        .into_iter()
        .filter(|p| {
            matches!(
                p.class,
                AttnQ | AttnK | AttnV | AttnO | MlpGate | MlpUp | MlpDown | ExpertGate | ExpertUp | ExpertDown | Latent
            )
        })
        .map(|p| (p.name, StoredForm::Fp8 { block }))
        .collect()
}

/// The weights of `config`'s first `n_layers` blocks that a checkpoint in MXFP4 stores so: the
/// parts read untransposed from a hub tensor `{name}_blocks` (`crate::mxfp4`; GPT-OSS's
/// experts under `quantization_config` `mxfp4`). For planning from a config alone.
pub fn mxfp4_forms(config: &ModelConfig, n_layers: usize) -> HashMap<String, StoredForm> {
    config
        .params(n_layers, false)
        .into_iter()
        .filter(|p| p.source.as_ref().is_some_and(|s| !s.transposed && s.tensor.ends_with("_blocks")))
        .filter(|p| StoredForm::Mxfp4.fits(&p.shape))
        .map(|p| (p.name, StoredForm::Mxfp4))
        .collect()
}

/// The low nibbles of `bytes` (u8) and then their high nibbles, concatenated along `axis`.
fn nibbles(b: &mut Builder, bytes: Value, axis: usize) -> Result<Value, ModelError> {
    let ty = b.ty(bytes)?.clone();
    let (low, four) = (b.splat(15.0, ty.clone())?, b.splat(4.0, ty)?);
    let lo = b.and(bytes, low)?;
    let hi = b.shift_right_logical(bytes, four)?;
    Ok(b.concatenate(&[lo, hi], axis)?)
}

/// `2 · e2m1(n)` for every nibble `n` (u8, `s e e m`) as f32, built from its bits as the table
/// `2 · E2M1` has it: `m · 1.0` where `e = 0`, else the f32 of exponent `e` (biased 127) and
/// mantissa `m`; its sign by a multiply, so that `8` is `-0.0`.
fn e2m1_from_bits(b: &mut Builder, nibbles: Value) -> Result<Value, ModelError> {
    let dims = b.dims(nibbles)?.to_vec();
    let int = |b: &mut Builder, v: f64| b.splat(v, TensorType::new(Hlo::I32, &dims));
    let n = b.convert(nibbles, Hlo::I32)?;
    let (one, three) = (int(b, 1.0)?, int(b, 3.0)?);
    let m = b.and(n, one)?;
    let e = b.shift_right_logical(n, one)?;
    let e = b.and(e, three)?;
    let exponent = int(b, 127.0)?;
    let exponent = b.add(e, exponent)?;
    let step = int(b, (1 << 23) as f64)?;
    let exponent = b.mul(exponent, step)?;
    let half = int(b, (1 << 22) as f64)?;
    let mantissa = b.mul(m, half)?;
    let normal = b.add(exponent, mantissa)?;
    let unit = int(b, f32::to_bits(1.0) as f64)?;
    let small = b.mul(m, unit)?;
    let zero = int(b, 0.0)?;
    let is_small = b.compare(CompareDir::Eq, e, zero)?;
    let bits = b.select(is_small, small, normal)?;
    let magnitude = b.bitcast_convert(bits, Hlo::F32)?;
    let s = int(b, 3.0)?;
    let s = b.shift_right_logical(n, s)?;
    let negative = b.compare(CompareDir::Eq, s, one)?;
    let f = |b: &mut Builder, v: f64| b.splat(v, TensorType::new(Hlo::F32, &dims));
    let (minus, plus) = (f(b, -1.0)?, f(b, 1.0)?);
    let sign = b.select(negative, minus, plus)?;
    Ok(b.mul(magnitude, sign)?)
}

/// `2^(e − 128)` for every E8M0 byte `e` (u8) as f32, built from its bits as the table has
/// it: exponent field `e − 1` from `e = 2`, the subnormals `2^-127` and `2^-128` below.
fn e8m0_from_bits(b: &mut Builder, bytes: Value) -> Result<Value, ModelError> {
    let dims = b.dims(bytes)?.to_vec();
    let int = |b: &mut Builder, v: f64| b.splat(v, TensorType::new(Hlo::I32, &dims));
    let e = b.convert(bytes, Hlo::I32)?;
    let (one, two) = (int(b, 1.0)?, int(b, 2.0)?);
    let field = b.sub(e, one)?;
    let step = int(b, (1 << 23) as f64)?;
    let normal = b.mul(field, step)?;
    let (at_one, at_zero) =
        (int(b, f32::to_bits(2f32.powi(-127)) as f64)?, int(b, f32::to_bits(2f32.powi(-128)) as f64)?);
    let is_one = b.compare(CompareDir::Eq, e, one)?;
    let subnormal = b.select(is_one, at_one, at_zero)?;
    let is_normal = b.compare(CompareDir::Ge, e, two)?;
    let bits = b.select(is_normal, normal, subnormal)?;
    Ok(b.bitcast_convert(bits, Hlo::F32)?)
}

/// `table[byte]` for every byte of `bytes` (u8), as f32.
fn byte_table(b: &mut Builder, bytes: Value, table: &[f32]) -> Result<Value, ModelError> {
    let t = b.constant_f32(table, &[table.len()])?;
    Ok(b.take_rows(t, bytes)?)
}

/// One f16 value per block `[…, r, nb]` as f32, repeated over the block's values (`full`).
fn per_block(b: &mut Builder, v: Value, full: &[usize]) -> Result<Value, ModelError> {
    let v = b.convert(v, Hlo::F32)?;
    let map: Vec<usize> = (0..full.len() - 1).collect();
    Ok(b.broadcast_in_dim(v, full, &map)?)
}

/// How a tensor is stored in its file, before any conversion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMeta {
    /// Hugging Face name.
    pub name: String,
    /// Row-major shape in Hugging Face layout.
    pub shape: Vec<usize>,
    /// The stored encoding as the file names it (`F32`, `BF16`, `Q4_1`, ...).
    pub stored: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MXFP4 decoded from its bits (the TPU's form) is the tables' decode bit for bit: every
    /// nibble under every scale byte, run on the CPU plugin (which flushes subnormals, so the
    /// scale bytes 0 and 1, `2^-128` and `2^-127`, give zeros both ways here).
    #[test]
    fn mxfp4_from_bits_is_the_tables_bit_for_bit() {
        use siphon_runtime::{Client, ClientOptions, CompileOptions, HostArray, Plugin};
        let (r, c) = (256, 32);
        // Row i: scale byte i; its 16 bytes hold the nibbles 0..15 twice.
        let blocks: Vec<u8> = (0..r).flat_map(|_| (0..16u8).map(|k| (2 * k % 16) | ((2 * k + 1) % 16) << 4)).collect();
        let scales: Vec<u8> = (0..=255).collect();
        let mut b = Builder::new("mxfp4");
        let parts = [
            b.arg(TensorType::new(Hlo::U8, &[r, c / 2]), None).unwrap(),
            b.arg(TensorType::new(Hlo::U8, &[r, 1]), None).unwrap(),
        ];
        let decode = |b: &mut Builder, without_tables| {
            let v = StoredForm::Mxfp4.dequantize(b, &parts, &[r, c], Hlo::F32, without_tables).unwrap();
            b.bitcast_convert(v, Hlo::I32).unwrap()
        };
        let (tables, bits) = (decode(&mut b, false), decode(&mut b, true));
        let text = b.finish(&[tables, bits]).unwrap();
        let path = std::env::var_os("SIPHON_PJRT_PLUGIN")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(siphon_runtime::default_cpu_plugin_path);
        let client = Client::new(&Plugin::load(&path).unwrap(), ClientOptions::new()).unwrap();
        let exe = client.compile(&text, &CompileOptions::single_device(None)).unwrap();
        let device = exe.device_ids()[0];
        let args =
            [HostArray::from_slice(&[r, c / 2], &blocks).unwrap(), HostArray::from_slice(&[r, 1], &scales).unwrap()];
        let bufs: Vec<_> = args.iter().map(|a| client.upload(a, device).unwrap()).collect();
        let out = exe.execute(&[bufs.iter().collect()]).unwrap();
        let [tables, bits] = [0, 1].map(|i| out[0][i].to_host().unwrap().bytes().to_vec());
        assert_eq!(tables.len(), r * c * 4);
        assert!(tables == bits, "MXFP4 from bits differs from the tables");
        // The tables' values themselves: -0.0 for nibble 8, 2·6·2^(255−128) at the top.
        let at = |i: usize| f32::from_le_bytes(tables[4 * i..4 * i + 4].try_into().unwrap());
        assert_eq!(at(128 * c + 8).to_bits(), (-0.0f32).to_bits());
        assert_eq!(at(255 * c + 7), 12.0 * 2f32.powi(127));
    }

    #[test]
    fn parts_bytes_and_splits_on_whole_blocks() {
        // DeepSeek's kv_a_proj_with_mqa: 576 rows in 128-row blocks, the last one partial.
        let fp8 = StoredForm::Fp8 { block: [128, 128] };
        let parts = fp8.parts(&[576, 7168]);
        assert_eq!((parts[0].shape.clone(), parts[1].shape.clone()), (vec![576, 7168], vec![5, 56]));
        assert_eq!(fp8.bytes(&[576, 7168]), 576 * 7168 + 5 * 56 * 4);
        // Q4_1: 20 bytes per 32 values; stacked experts keep their leading dimension.
        assert_eq!(StoredForm::Q4_1.bytes(&[4, 8, 64]), 4 * 8 * 2 * 20);
        assert_eq!(StoredForm::Q6K.parts(&[2, 512])[2].shape, [2, 512]);
        let mesh = Mesh::new(&[("fsdp", 2), ("model", 4)], (0..8).collect()).unwrap();
        let spec = PartitionSpec::new(&[&["model"], &["fsdp"]]);
        // 576 rows over 4 cut 128-row blocks; 7168 columns over 2 do not.
        let (whole, dropped) = fp8.whole_blocks(&[576, 7168], &spec, &mesh);
        assert!(dropped);
        assert_eq!(whole, PartitionSpec::new(&[&[], &["fsdp"]]));
        assert!(fp8.part_specs("w", &[576, 7168], &whole, &mesh).is_ok());
        let err = fp8.part_specs("w", &[576, 7168], &spec, &mesh).unwrap_err().to_string();
        assert!(err.contains("w [576, 7168] split 4 ways on dimension 0 would cut"), "{err}");
        assert_eq!(fp8.whole_blocks(&[1024, 7168], &spec, &mesh), (spec, false));
    }
}
