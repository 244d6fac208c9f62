//! Statistics as JSON numbers, except the non-finite ones (a run that allows NaN or ±Inf
//! activations gives them), which JSON has no numbers for: they are written as `null`, what
//! every JSON reader takes (numpy reads it as NaN through `float`/`np.asarray(..., float)`),
//! and read back as NaN; the hook's `non_finite` count says how many values gave them. A
//! statistic that is not finite stays so when merged (`HookStats::merge`), so a resumed run's
//! file is the run's. The strings `"NaN"`, `"Infinity"` and `"-Infinity"` that files of
//! earlier siphons hold read as those values.

use serde::de::{self, Deserializer, Visitor};
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

/// One value in its JSON form.
pub struct Float(pub f64);

impl Serialize for Float {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let v = self.0;
        match v.is_finite() {
            true => s.serialize_f64(v),
            false => s.serialize_unit(),
        }
    }
}

impl<'de> Deserialize<'de> for Float {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Float, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Float;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number or null")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Float, E> {
                Ok(Float(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Float, E> {
                Ok(Float(v as f64))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Float, E> {
                Ok(Float(v as f64))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Float, E> {
                Ok(Float(f64::NAN))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Float, E> {
                match v {
                    "NaN" => Ok(Float(f64::NAN)),
                    "Infinity" => Ok(Float(f64::INFINITY)),
                    "-Infinity" => Ok(Float(f64::NEG_INFINITY)),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

pub mod one {
    use super::*;
    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        Float(*v).serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Float::deserialize(d).map(|f| f.0)
    }
}

pub mod vec {
    use super::*;
    pub fn serialize<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(v.len()))?;
        for &x in v {
            seq.serialize_element(&Float(x))?;
        }
        seq.end()
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        Vec::<Float>::deserialize(d).map(|v| v.into_iter().map(|f| f.0).collect())
    }
}

pub mod opt_one {
    use super::*;
    pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        v.map(Float).serialize(s)
    }
    /// A present value, `null` included (NaN); an absent one is the field's default.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        Float::deserialize(d).map(|f| Some(f.0))
    }
}

pub mod opt_vec {
    use super::*;
    pub fn serialize<S: Serializer>(v: &Option<Vec<f64>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => vec::serialize(v, s),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<f64>>, D::Error> {
        Option::<Vec<Float>>::deserialize(d).map(|v| v.map(|v| v.into_iter().map(|f| f.0).collect()))
    }
}
