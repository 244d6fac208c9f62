//! What a compiler made of a program: the optimized HLO a compiled executable holds
//! (`PJRT_Executable_OptimizedProgram`, a serialized `xla.HloModuleProtoWithConfig`), read as
//! far as siphon asks of it — each instruction's computation, opcode, custom-call target, the
//! name its op carried (`OpMetadata.op_name`, from the StableHLO op's `loc("…")`) and its
//! result's dimensions.
//!
//! A plain protobuf walk over the few fields used (numbers from XLA's
//! `xla/service/hlo.proto` and `xla/xla_data.proto`); every length is checked against the
//! bytes, so a malformed module is an error, never a read past the end.

use crate::error::{Error, Result};

// HloModuleProtoWithConfig
const WITH_CONFIG_MODULE: u32 = 1;
// HloModuleProto
const MODULE_COMPUTATIONS: u32 = 3;
// HloComputationProto
const COMPUTATION_NAME: u32 = 1;
const COMPUTATION_INSTRUCTIONS: u32 = 2;
// HloInstructionProto
const INSTRUCTION_NAME: u32 = 1;
const INSTRUCTION_OPCODE: u32 = 2;
const INSTRUCTION_SHAPE: u32 = 3;
const INSTRUCTION_METADATA: u32 = 7;
const INSTRUCTION_CUSTOM_CALL_TARGET: u32 = 28;
// ShapeProto
const SHAPE_DIMENSIONS: u32 = 3;
const SHAPE_TUPLE_SHAPES: u32 = 4;
// OpMetadata
const METADATA_OP_NAME: u32 = 2;

/// One instruction of an optimized module.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HloInstruction {
    /// The computation holding it (the entry, a fusion's body, a loop's body, …).
    pub computation: String,
    /// Its name in the module.
    pub name: String,
    /// Its opcode, e.g. `custom-call`, `fusion`, `while`.
    pub opcode: String,
    /// A custom call's target (`__cudnn$fmhaSoftmax`), else empty.
    pub custom_call_target: String,
    /// The op name its metadata carries (a StableHLO op's `loc("…")`), else empty.
    pub op_name: String,
    /// Its result's dimensions; a tuple's elements each.
    pub shapes: Vec<Vec<i64>>,
}

/// The instructions of a serialized `HloModuleProtoWithConfig` (or a bare
/// `HloModuleProto`, as `format` says: `hlo_with_config` or `hlo`), computation by
/// computation in the module's order.
pub fn instructions(bytes: &[u8], format: &str) -> Result<Vec<HloInstruction>> {
    let module = match format {
        "hlo_with_config" | "hloWithConfig" => {
            let mut module = None;
            for field in Fields::new(bytes) {
                if let (WITH_CONFIG_MODULE, Value::Bytes(b)) = field? {
                    module = Some(b);
                }
            }
            module.ok_or_else(|| bad("no hlo_module in the HloModuleProtoWithConfig"))?
        }
        "hlo" => bytes,
        other => return Err(bad(&format!("optimized program in format {other:?} (expected hlo or hlo_with_config)"))),
    };
    let mut out = Vec::new();
    for field in Fields::new(module) {
        let (MODULE_COMPUTATIONS, Value::Bytes(computation)) = field? else { continue };
        let mut name = String::new();
        let mut bodies = Vec::new();
        for field in Fields::new(computation) {
            match field? {
                (COMPUTATION_NAME, Value::Bytes(b)) => name = text(b)?,
                (COMPUTATION_INSTRUCTIONS, Value::Bytes(b)) => bodies.push(b),
                _ => {}
            }
        }
        for body in bodies {
            let mut instruction = instruction(body)?;
            instruction.computation = name.clone();
            out.push(instruction);
        }
    }
    Ok(out)
}

fn instruction(bytes: &[u8]) -> Result<HloInstruction> {
    let mut out = HloInstruction::default();
    for field in Fields::new(bytes) {
        match field? {
            (INSTRUCTION_NAME, Value::Bytes(b)) => out.name = text(b)?,
            (INSTRUCTION_OPCODE, Value::Bytes(b)) => out.opcode = text(b)?,
            (INSTRUCTION_CUSTOM_CALL_TARGET, Value::Bytes(b)) => out.custom_call_target = text(b)?,
            (INSTRUCTION_SHAPE, Value::Bytes(b)) => shapes(b, &mut out.shapes, 0)?,
            (INSTRUCTION_METADATA, Value::Bytes(b)) => {
                for field in Fields::new(b) {
                    if let (METADATA_OP_NAME, Value::Bytes(name)) = field? {
                        out.op_name = text(name)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// A shape's dimensions into `out`; a tuple's elements each (nested tuples flattened).
fn shapes(bytes: &[u8], out: &mut Vec<Vec<i64>>, depth: usize) -> Result<()> {
    if depth > 16 {
        return Err(bad("tuple shapes nested more than 16 deep"));
    }
    let mut dims = Vec::new();
    let mut tuple = false;
    for field in Fields::new(bytes) {
        match field? {
            (SHAPE_DIMENSIONS, Value::Varint(v)) => dims.push(v as i64),
            (SHAPE_DIMENSIONS, Value::Bytes(packed)) => {
                let mut at = 0;
                while at < packed.len() {
                    dims.push(varint(packed, &mut at)? as i64);
                }
            }
            (SHAPE_TUPLE_SHAPES, Value::Bytes(b)) => {
                tuple = true;
                shapes(b, out, depth + 1)?;
            }
            _ => {}
        }
    }
    if !tuple {
        out.push(dims);
    }
    Ok(())
}

fn text(bytes: &[u8]) -> Result<String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| bad("a string field is not UTF-8"))
}

fn bad(what: &str) -> Error {
    Error::Unexpected(format!("optimized program: {what}"))
}

/// A field's value: a varint, or the bytes of a length-delimited field. Fixed-width fields
/// are skipped over (their values are not read).
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// The fields of one message, in order.
struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    fn new(bytes: &'a [u8]) -> Fields<'a> {
        Fields { bytes, at: 0 }
    }

    fn next_field(&mut self) -> Result<(u32, Value<'a>)> {
        let key = varint(self.bytes, &mut self.at)?;
        let field = u32::try_from(key >> 3).map_err(|_| bad("a field number past u32"))?;
        let value = match key & 7 {
            0 => Value::Varint(varint(self.bytes, &mut self.at)?),
            1 => {
                self.skip(8)?;
                Value::Fixed
            }
            2 => {
                let len = usize::try_from(varint(self.bytes, &mut self.at)?).map_err(|_| bad("a length past usize"))?;
                let start = self.at;
                self.skip(len)?;
                Value::Bytes(&self.bytes[start..self.at])
            }
            5 => {
                self.skip(4)?;
                Value::Fixed
            }
            wire => return Err(bad(&format!("field {field} of wire type {wire}"))),
        };
        Ok((field, value))
    }

    fn skip(&mut self, len: usize) -> Result<()> {
        match self.at.checked_add(len) {
            Some(end) if end <= self.bytes.len() => {
                self.at = end;
                Ok(())
            }
            _ => Err(bad("a field runs past the end of its message")),
        }
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.bytes.len() {
            return None;
        }
        let field = self.next_field();
        if field.is_err() {
            // One error ends the message.
            self.at = self.bytes.len();
        }
        Some(field)
    }
}

fn varint(bytes: &[u8], at: &mut usize) -> Result<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let &byte = bytes.get(*at).ok_or_else(|| bad("a varint runs past the end"))?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(bad("a varint longer than 10 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint_bytes(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        while v >= 0x80 {
            out.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
        out
    }

    fn field(number: u32, bytes: &[u8]) -> Vec<u8> {
        [varint_bytes(u64::from(number << 3 | 2)), varint_bytes(bytes.len() as u64), bytes.to_vec()].concat()
    }

    fn packed(dims: &[u64]) -> Vec<u8> {
        dims.iter().flat_map(|&d| varint_bytes(d)).collect()
    }

    /// A module with an entry computation of two instructions: a custom call whose op name
    /// and tuple result are set, and a parameter with a plain shape and a fixed-width field.
    fn module() -> Vec<u8> {
        let tuple = [field(4, &field(3, &packed(&[2, 4, 8, 16]))), field(4, &field(3, &packed(&[0])))].concat();
        let call = [
            field(1, b"custom-call.3"),
            field(2, b"custom-call"),
            field(3, &tuple),
            field(7, &field(2, b"blocks.1.attn")),
            field(28, b"__cudnn$fmhaSoftmax"),
        ]
        .concat();
        let mut parameter = [field(1, b"p0"), field(2, b"parameter"), field(3, &field(3, &packed(&[300, 2])))].concat();
        parameter.extend(varint_bytes(24 << 3 | 5));
        parameter.extend_from_slice(&[1, 2, 3, 4]);
        let computation = [field(1, b"main"), field(2, &call), field(2, &parameter)].concat();
        field(1, &[field(1, b"module"), field(3, &computation)].concat())
    }

    #[test]
    fn instructions_carry_their_target_name_and_shapes() {
        let found = instructions(&module(), "hlo_with_config").unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].computation, "main");
        assert_eq!(found[0].custom_call_target, "__cudnn$fmhaSoftmax");
        assert_eq!(found[0].op_name, "blocks.1.attn");
        assert_eq!(found[0].shapes, vec![vec![2, 4, 8, 16], vec![0]]);
        assert_eq!(found[1].opcode, "parameter");
        assert_eq!(found[1].shapes, vec![vec![300, 2]]);
    }

    #[test]
    fn a_cut_module_is_an_error_at_every_length() {
        let bytes = module();
        // The module is one field of the outer message: any cut leaves it running past the end.
        for len in 0..bytes.len() {
            let cut = instructions(&bytes[..len], "hlo_with_config");
            assert!(cut.is_err(), "cut at {len}: {cut:?}");
        }
        assert!(instructions(&bytes, "mlir").is_err());
        assert!(instructions(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], "hlo").is_err());
    }
}
