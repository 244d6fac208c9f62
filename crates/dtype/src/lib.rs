//! The element types siphon computes, moves and stores in, one [`DType`] shared by the models
//! (weights handed to the device, a program's compute and output dtype), the planner (bytes
//! per element) and the shard store (what a hook's rows hold). The program's own element type
//! (`siphon_hlo::DType`, with integers, predicates and `f8E4M3FN`) is converted from it at
//! the edge.
#![deny(missing_docs)]

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An element type, written `f32`, `bf16`, `f16`, `u8` or `fp8` on the command line, in
/// run.json and wherever siphon serializes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
    /// Bytes of a block format kept as stored (quantized weights); never computed in, never
    /// an activation's dtype.
    U8,
    /// Activations as `float8_e4m3fn` with one f32 scale per token row (the row's largest
    /// magnitude over 448), quantized on the device: an output and stored dtype only. A row is
    /// its scale (4 bytes, little-endian) then its values.
    Fp8,
}

/// A dtype name siphon does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype {0:?} (expected f32, bf16, f16 or fp8)")]
pub struct UnknownDType(pub String);

impl DType {
    /// Bytes per element (an fp8 row adds its 4-byte scale: [`DType::row_bytes`]).
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 | DType::F16 => 2,
            DType::U8 | DType::Fp8 => 1,
        }
    }

    /// Bytes of one token's row of `elements` values.
    pub fn row_bytes(self, elements: usize) -> usize {
        match self {
            DType::Fp8 => 4 + elements,
            other => elements * other.size(),
        }
    }

    /// Its name: `f32`, `bf16`, `f16`, `u8`, `fp8`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::U8 => "u8",
            DType::Fp8 => "fp8",
        }
    }

    /// The safetensors dtype of its values (`F8_E4M3` for fp8's, whose scales are stored
    /// beside them as `F32`).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::Bf16 => "BF16",
            DType::F16 => "F16",
            DType::U8 => "U8",
            DType::Fp8 => "F8_E4M3",
        }
    }

    /// Whether activations may be held in it (every dtype but [`DType::U8`]).
    pub fn is_activation(self) -> bool {
        self != DType::U8
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = UnknownDType;

    /// Accepts siphon's names (any case) and `config.json`'s `torch_dtype` names (`float32`,
    /// `float`, `bfloat16`, `float16`, `half`); `u8` is internal and not parsed.
    fn from_str(s: &str) -> Result<DType, UnknownDType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "float" => Ok(DType::F32),
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            "f16" | "float16" | "half" => Ok(DType::F16),
            "fp8" | "f8e4m3" | "f8_e4m3" => Ok(DType::Fp8),
            _ => Err(UnknownDType(s.to_string())),
        }
    }
}

/// The value of a `float8_e4m3fn` byte (bias 7, subnormals, no infinities, `S.1111.111` NaN):
/// fp8 activations' values and FP8 checkpoints' weights.
pub fn e4m3fn_to_f32(byte: u8) -> f32 {
    let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((byte >> 3) & 0x0F);
    let man = f32::from(byte & 0x07);
    match (exp, byte & 0x7F) {
        (_, 0x7F) => f32::NAN,
        (0, _) => sign * man / 8.0 * 2f32.powi(-6),
        _ => sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_serialize_as_written() {
        for d in [DType::F32, DType::Bf16, DType::F16, DType::Fp8] {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
            assert_eq!(d.name().to_uppercase().parse::<DType>().unwrap(), d);
            assert_eq!(serde_json::to_string(&d).unwrap(), format!("{:?}", d.name()));
        }
        assert_eq!(serde_json::to_string(&DType::U8).unwrap(), "\"u8\"");
        assert_eq!("bfloat16".parse::<DType>().unwrap(), DType::Bf16);
        assert_eq!("half".parse::<DType>().unwrap(), DType::F16);
        assert_eq!("float".parse::<DType>().unwrap(), DType::F32);
        let err = "int8".parse::<DType>().unwrap_err().to_string();
        assert_eq!(err, "unknown dtype \"int8\" (expected f32, bf16, f16 or fp8)");
        assert!("u8".parse::<DType>().is_err());
    }

    #[test]
    fn e4m3fn_bytes_decode_as_float8_e4m3fn() {
        let v = e4m3fn_to_f32;
        assert_eq!([v(0x00), v(0x80), v(0x38), v(0xB8)], [0.0, -0.0, 1.0, -1.0]);
        // The largest normal (448), the smallest normal (2^-6) and subnormal (2^-9).
        assert_eq!([v(0x7E), v(0x08), v(0x01), v(0x81)], [448.0, 2f32.powi(-6), 2f32.powi(-9), -(2f32.powi(-9))]);
        assert!(v(0x7F).is_nan() && v(0xFF).is_nan());
        assert_eq!([v(0x3F), v(0x77)], [1.875, 240.0]);
    }

    #[test]
    fn rows_count_the_fp8_scale() {
        assert_eq!(DType::F32.row_bytes(10), 40);
        assert_eq!(DType::Bf16.row_bytes(10), 20);
        assert_eq!(DType::Fp8.row_bytes(10), 14);
        assert!(!DType::U8.is_activation() && DType::Fp8.is_activation());
    }
}
