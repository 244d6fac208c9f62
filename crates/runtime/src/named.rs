//! Named create options (a client's, a topology's): their values and their encoding as
//! `PJRT_NamedValue`s.

use std::collections::HashSet;
use std::ffi::c_char;

use crate::error::{Error, Result};
use crate::ffi;

/// A value of a named client create option (`PJRT_NamedValue`).
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    /// A string.
    String(String),
    /// A 64-bit integer.
    Int64(i64),
    /// A list of 64-bit integers.
    Int64List(Vec<i64>),
    /// A 32-bit float.
    Float(f32),
    /// A bool.
    Bool(bool),
}

/// `options` as `PJRT_NamedValue`s, pointing into `options` (which must outlive them); an
/// empty or repeated name is refused.
pub(crate) fn named_values(options: &[(String, OptionValue)]) -> Result<Vec<ffi::PJRT_NamedValue>> {
    let mut seen = HashSet::new();
    let mut named_values = Vec::with_capacity(options.len());
    for (name, value) in options {
        if name.is_empty() {
            return Err(Error::InvalidOption { name: name.clone(), reason: "empty name".into() });
        }
        if !seen.insert(name.as_str()) {
            return Err(Error::InvalidOption { name: name.clone(), reason: "set twice".into() });
        }
        let mut named: ffi::PJRT_NamedValue = ffi::zeroed_plain();
        named.struct_size = std::mem::size_of::<ffi::PJRT_NamedValue>();
        named.name = name.as_ptr() as *const c_char;
        named.name_size = name.len();
        match value {
            OptionValue::String(s) => {
                named.type_ = ffi::NAMED_VALUE_STRING;
                named.value.string_value = s.as_ptr() as *const c_char;
                named.value_size = s.len();
            }
            OptionValue::Int64(v) => {
                named.type_ = ffi::NAMED_VALUE_INT64;
                named.value.int64_value = *v;
                named.value_size = 1;
            }
            OptionValue::Int64List(list) => {
                named.type_ = ffi::NAMED_VALUE_INT64_LIST;
                named.value.int64_array_value = list.as_ptr();
                named.value_size = list.len();
            }
            OptionValue::Float(v) => {
                named.type_ = ffi::NAMED_VALUE_FLOAT;
                named.value.float_value = *v;
                named.value_size = 1;
            }
            OptionValue::Bool(v) => {
                named.type_ = ffi::NAMED_VALUE_BOOL;
                named.value.bool_value = *v;
                named.value_size = 1;
            }
        }
        named_values.push(named);
    }
    Ok(named_values)
}
