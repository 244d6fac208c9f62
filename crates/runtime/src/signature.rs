//! The per-device parameter types of a StableHLO text program, read from its `@main`
//! signature, so that `execute` can reject arguments of the wrong shape or element type.
//!
//! XLA itself checks only each argument's byte size: a transposed weight (`[in, out]` for
//! `[out, in]`) or an i32 array for an f32 one would run and silently produce garbage.
//!
//! This is a best-effort reader, not an MLIR parser: whatever it does not understand (dynamic
//! dimensions, GSPMD strings, sub-axes, open shardings, bytecode) leaves that parameter
//! unchecked rather than risking a false rejection.

use crate::buffer::ElementType;

/// A parameter's element type and the dimensions each device holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParamType {
    pub(crate) element_type: ElementType,
    pub(crate) dims: Vec<usize>,
}

/// The parameter types of `@main`, one entry per parameter (`None`: unchecked), or `None`
/// when the signature cannot be read at all.
pub(crate) fn parameter_types(program: &[u8], num_partitions: usize) -> Option<Vec<Option<ParamType>>> {
    let text = std::str::from_utf8(program).ok()?;
    let start = ["func.func public @main(", "func.func @main("]
        .iter()
        .find_map(|head| text.find(head).map(|i| i + head.len()))?;
    let body = &text[start..];
    let args = split_top_level(body)?;
    let meshes = parse_meshes(text);
    Some(args.iter().map(|arg| parse_arg(arg, &meshes, num_partitions)).collect())
}

/// Splits the argument list (text after `@main(`) at top-level commas, up to the closing `)`.
fn split_top_level(text: &str) -> Option<Vec<&str>> {
    let mut depth = 0i32;
    let mut in_string = false;
    let mut args = Vec::new();
    let mut begin = 0;
    for (i, c) in text.char_indices() {
        if in_string {
            if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '(' | '<' | '{' | '[' => depth += 1,
            ')' if depth == 0 => {
                let last = text[begin..i].trim();
                if !last.is_empty() {
                    args.push(last);
                }
                return Some(args);
            }
            ')' | '>' | '}' | ']' => {
                // `->` never appears inside an argument list, so '>' always closes.
                depth -= 1;
                if depth < 0 {
                    return None;
                }
            }
            ',' if depth == 0 => {
                args.push(text[begin..i].trim());
                begin = i + 1;
            }
            _ => {}
        }
    }
    None
}

/// `sdy.mesh @name = <["a"=2, "b"=4]>` declarations: name → axes.
fn parse_meshes(text: &str) -> Vec<(String, Vec<(String, usize)>)> {
    let mut meshes = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("sdy.mesh @") else {
            continue;
        };
        let Some((name, rest)) = rest.split_once('=') else {
            continue;
        };
        let Some(rest) = rest.trim().strip_prefix("<[") else {
            continue;
        };
        let Some(end) = rest.find(']') else { continue };
        let mut axes = Vec::new();
        let mut ok = true;
        for entry in rest[..end].split(',').map(str::trim).filter(|e| !e.is_empty()) {
            match entry.split_once('=') {
                Some((axis, size)) => match (unquote(axis.trim()), size.trim().parse()) {
                    (Some(axis), Ok(size)) => axes.push((axis.to_string(), size)),
                    _ => ok = false,
                },
                None => ok = false,
            }
        }
        if ok {
            meshes.push((name.trim().to_string(), axes));
        }
    }
    meshes
}

fn unquote(text: &str) -> Option<&str> {
    text.strip_prefix('"')?.strip_suffix('"')
}

fn parse_arg(arg: &str, meshes: &[(String, Vec<(String, usize)>)], num_partitions: usize) -> Option<ParamType> {
    let (_, rest) = arg.split_once(':')?;
    let rest = rest.trim_start().strip_prefix("tensor<")?;
    let end = rest.find('>')?;
    let (element_type, global) = parse_tensor(&rest[..end])?;
    let attrs = &rest[end + 1..];
    if attrs.contains("mhlo.sharding") {
        return None;
    }
    let Some(at) = attrs.find("#sdy.sharding<@") else {
        // Unannotated: replicated, unless XLA may pick a sharding for it (SPMD).
        return (num_partitions == 1).then_some(ParamType { element_type, dims: global });
    };
    let sharding = &attrs[at + "#sdy.sharding<@".len()..];
    let (mesh_name, sharding) = sharding.split_once(',')?;
    let axes = &meshes.iter().find(|(name, _)| name == mesh_name.trim())?.1;
    let sharding = sharding.trim_start().strip_prefix('[')?;
    let close = sharding.find(']')?;
    let groups: Vec<&str> = sharding[..close]
        .split('}')
        .map(|g| g.trim().trim_start_matches(',').trim())
        .filter(|g| !g.is_empty())
        .collect();
    if groups.len() != global.len() {
        return None;
    }
    let mut dims = Vec::with_capacity(global.len());
    for (group, &size) in groups.iter().zip(&global) {
        let names = group.strip_prefix('{')?;
        let mut ways = 1;
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let name = unquote(name)?;
            ways *= axes.iter().find(|(axis, _)| axis == name)?.1;
        }
        if ways == 0 || size % ways != 0 {
            return None;
        }
        dims.push(size / ways);
    }
    Some(ParamType { element_type, dims })
}

/// `8x16xf32` → (F32, [8, 16]); `f32` → (F32, []).
fn parse_tensor(text: &str) -> Option<(ElementType, Vec<usize>)> {
    let mut parts: Vec<&str> = text.trim().split('x').collect();
    let element = parts.pop()?;
    let element_type = match element.trim() {
        "i1" => ElementType::Pred,
        "i8" => ElementType::S8,
        "i16" => ElementType::S16,
        "i32" => ElementType::S32,
        "i64" => ElementType::S64,
        "ui8" => ElementType::U8,
        "ui16" => ElementType::U16,
        "ui32" => ElementType::U32,
        "ui64" => ElementType::U64,
        "f16" => ElementType::F16,
        "f32" => ElementType::F32,
        "f64" => ElementType::F64,
        "bf16" => ElementType::BF16,
        _ => return None,
    };
    let dims = parts.iter().map(|d| d.trim().parse().ok()).collect::<Option<Vec<usize>>>()?;
    Some((element_type, dims))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(element_type: ElementType, dims: &[usize]) -> Option<ParamType> {
        Some(ParamType { element_type, dims: dims.to_vec() })
    }

    #[test]
    fn reads_sharded_and_plain_parameters() {
        let text = r#"module {
sdy.mesh @mesh = <["data"=2, "model"=4]>
func.func @main(%x: tensor<8x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}, %w: tensor<16x8xbf16> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"data", "model"}]>}, %ids: tensor<4xi32>, %s: tensor<f32>) -> (tensor<8x8xf32>) {
"#;
        let types = parameter_types(text.as_bytes(), 8).unwrap();
        assert_eq!(types, vec![param(ElementType::F32, &[4, 16]), param(ElementType::BF16, &[16, 1]), None, None]);
        // Single-partition programs check unannotated parameters too.
        let types = parameter_types(text.replace("sdy.sharding", "x.y").as_bytes(), 1).unwrap();
        assert_eq!(types[2], param(ElementType::S32, &[4]));
        assert_eq!(types[3], param(ElementType::F32, &[]));
    }

    #[test]
    fn leaves_what_it_does_not_understand_unchecked() {
        let text = r#"func.func public @main(%a: tensor<?x4xf32>, %b: tensor<4xcomplex<f32>>, %c: tensor<8xf32> {mhlo.sharding = "{devices=[2]<=[2]}"}, %d: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data", ?}]>}, %e: tensor<2xui8> loc("e")) -> tensor<4xf32> {"#;
        let types = parameter_types(text.as_bytes(), 1).unwrap();
        assert_eq!(types, vec![None, None, None, None, param(ElementType::U8, &[2])]);
        assert_eq!(parameter_types(b"not a program", 1), None);
        assert_eq!(parameter_types(b"func.func @main(%a: tensor<4xf32>", 1), None);
        assert_eq!(parameter_types(b"func.func @main() -> () {", 1), Some(vec![]));
    }
}
