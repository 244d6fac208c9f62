//! Element types and tensor types, with their MLIR spelling.

use std::fmt;

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// 1-bit boolean (`i1`), the result of comparisons.
    Pred,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// 8-bit float, 4 exponent and 3 mantissa bits, finite only (`f8E4M3FN`: largest 448,
    /// no infinities, one NaN pattern per sign).
    F8E4M3FN,
}

impl From<siphon_dtype::DType> for DType {
    /// The program's element type for siphon's dtype (fp8 activations are `f8E4M3FN` values).
    fn from(dtype: siphon_dtype::DType) -> DType {
        match dtype {
            siphon_dtype::DType::F32 => DType::F32,
            siphon_dtype::DType::Bf16 => DType::BF16,
            siphon_dtype::DType::F16 => DType::F16,
            siphon_dtype::DType::U8 => DType::U8,
            siphon_dtype::DType::Fp8 => DType::F8E4M3FN,
        }
    }
}

impl DType {
    /// The MLIR element type name (`f32`, `bf16`, `i32`, `ui8`, `i1`, …).
    pub fn mlir(self) -> &'static str {
        match self {
            DType::Pred => "i1",
            DType::I8 => "i8",
            DType::U8 => "ui8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F8E4M3FN => "f8E4M3FN",
        }
    }

    /// True for floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F8E4M3FN | DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// True for integer types (not `Pred`).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I8 | DType::U8 | DType::I32 | DType::I64)
    }

    /// True for unsigned integer types.
    pub fn is_unsigned(self) -> bool {
        matches!(self, DType::U8)
    }

    /// Bytes per element as PJRT buffers store it (`Pred` takes a byte).
    pub fn byte_size(self) -> usize {
        match self {
            DType::Pred | DType::I8 | DType::U8 | DType::F8E4M3FN => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// Parses the names users type (`f32`, `bf16`, `f16`, `i32`, …); also accepts
    /// `float32`/`bfloat16`/`float16`.
    pub fn parse(name: &str) -> Option<DType> {
        Some(match name {
            "pred" | "bool" | "i1" => DType::Pred,
            "i8" | "int8" => DType::I8,
            "u8" | "ui8" | "uint8" => DType::U8,
            "i32" | "int32" => DType::I32,
            "i64" | "int64" => DType::I64,
            "f16" | "float16" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "f32" | "float32" => DType::F32,
            "f64" | "float64" => DType::F64,
            "f8E4M3FN" | "f8e4m3fn" | "float8_e4m3fn" => DType::F8E4M3FN,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::U8 => "u8",
            DType::Pred => "pred",
            other => other.mlir(),
        })
    }
}

/// A ranked tensor type: dimensions and element type. Displays as MLIR does:
/// `tensor<4x8xf32>`, `tensor<f32>` for a scalar.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    dtype: DType,
    dims: Vec<usize>,
}

impl TensorType {
    /// A tensor of `dtype` with shape `dims` (empty for a scalar).
    pub fn new(dtype: DType, dims: &[usize]) -> TensorType {
        TensorType { dtype, dims: dims.to_vec() }
    }

    /// A scalar of `dtype`.
    pub fn scalar(dtype: DType) -> TensorType {
        TensorType { dtype, dims: Vec::new() }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Number of elements.
    pub fn num_elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// Bytes of a dense row-major buffer of this type.
    pub fn byte_size(&self) -> usize {
        self.num_elements() * self.dtype.byte_size()
    }

    /// The same shape with another element type.
    pub fn with_dtype(&self, dtype: DType) -> TensorType {
        TensorType { dtype, dims: self.dims.clone() }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.dims {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.dtype.mlir())
    }
}

/// `value` rounded to nearest even as `f8E4M3FN` bits: 3 mantissa bits, exponent bias 7,
/// subnormals below 2^-6, largest 448; what rounds past it is NaN (the type has no infinity).
pub fn e4m3fn_bits(value: f64) -> u8 {
    let sign = if value.is_sign_negative() { 0x80 } else { 0 };
    let a = value.abs();
    if a.is_nan() {
        return sign | 0x7f;
    }
    // The binade's exponent (subnormals share the smallest normal's spacing).
    let mut e = (-6..=9).rev().find(|&e| a >= 2f64.powi(e)).unwrap_or(-6);
    let mut q = (a / 2f64.powi(e - 3)).round_ties_even();
    if q >= 16.0 {
        (e, q) = (e + 1, q / 2.0);
    }
    let bits = if q < 8.0 { q as i32 } else { ((e + 7) << 3) | (q as i32 - 8) };
    if bits >= 0x7f { sign | 0x7f } else { sign | bits as u8 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_print_like_mlir() {
        assert_eq!(TensorType::new(DType::F32, &[4, 8]).to_string(), "tensor<4x8xf32>");
        assert_eq!(TensorType::scalar(DType::BF16).to_string(), "tensor<bf16>");
        assert_eq!(TensorType::new(DType::U8, &[3]).to_string(), "tensor<3xui8>");
        assert_eq!(TensorType::new(DType::Pred, &[2, 1]).to_string(), "tensor<2x1xi1>");
    }

    #[test]
    fn dtype_names_round_trip() {
        for d in [
            DType::Pred,
            DType::I8,
            DType::U8,
            DType::I32,
            DType::I64,
            DType::F8E4M3FN,
            DType::F16,
            DType::BF16,
            DType::F32,
            DType::F64,
        ] {
            assert_eq!(DType::parse(&d.to_string()), Some(d));
            assert_eq!(DType::parse(d.mlir()), Some(d));
        }
        assert_eq!(DType::parse("float8"), None);
    }

    #[test]
    fn e4m3fn_rounds_to_nearest_even_and_overflows_to_nan() {
        // Values and bits as ml_dtypes.float8_e4m3fn gives them.
        let cases = [
            (0.0, 0x00),
            (-0.0, 0x80),
            (1.0, 0x38),
            (-2.5, 0xC2),
            (448.0, 0x7E),
            (464.0, 0x7E),
            (465.0, 0x7F),
            (1e9, 0x7F),
            (2f64.powi(-9), 0x01),
            (2f64.powi(-10), 0x00),
            (1.5 * 2f64.powi(-10), 0x01),
            (2f64.powi(-6), 0x08),
            (0.0625 * 1.0625, 0x18),
            (0.0625 * 1.1875, 0x1A),
            (f64::NAN, 0x7F),
        ];
        for (value, bits) in cases {
            assert_eq!(e4m3fn_bits(value), bits, "{value}");
        }
    }
}
