//! Mutations of a valid binary (or text) input.

use proptest::prelude::*;

/// Integers written over the input: zero, one, the sign bit of each width, all ones (-1), and
/// sizes that overflow 32-bit products or ask for terabytes.
pub const EDGE_INTEGERS: [u64; 12] = [
    0,
    1,
    0x7f,
    0x80,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX,
];

/// Bytes a run is filled with: NUL, all ones, the sign bit, and JSON's and text's delimiters.
pub const EDGE_BYTES: [u8; 9] = [0, 0xff, 0x7f, 0x80, b'"', b'{', b'9', b'\n', b'\\'];

/// An integer field of a message: its `valid` value, one of [`EDGE_INTEGERS`] cut to the
/// field's width (`mask`), or just past the valid value.
pub fn edge(valid: u64, mask: u64) -> BoxedStrategy<u64> {
    prop_oneof![
        1 => Just(valid),
        2 => proptest::sample::select(EDGE_INTEGERS.to_vec()).prop_map(move |v| v & mask),
        1 => (0..4u64).prop_map(move |d| valid.wrapping_add(d) & mask),
    ]
    .boxed()
}

/// One change to an input.
#[derive(Debug, Clone)]
pub enum Op {
    /// Cut the input to this many bytes.
    Truncate(usize),
    /// Flip one bit.
    FlipBit { at: usize, bit: u8 },
    /// Write a little-endian integer of `width` bytes.
    SetInt { at: usize, width: usize, value: u64 },
    /// Overwrite `len` bytes with `byte`.
    Fill { at: usize, len: usize, byte: u8 },
    /// Repeat the `len` bytes at `at` right after them.
    Duplicate { at: usize, len: usize },
    /// Delete `len` bytes.
    Delete { at: usize, len: usize },
}

impl Op {
    fn apply(&self, out: &mut Vec<u8>) {
        let n = out.len();
        let clamp = |at: usize| at.min(n);
        match *self {
            Op::Truncate(at) => out.truncate(at),
            Op::FlipBit { at, bit } if at < n => out[at] ^= 1 << (bit % 8),
            Op::SetInt { at, width, value } => {
                let at = clamp(at);
                let end = (at + width).min(n);
                out[at..end].copy_from_slice(&value.to_le_bytes()[..end - at]);
            }
            Op::Fill { at, len, byte } => {
                let at = clamp(at);
                out[at..(at + len).min(n)].fill(byte);
            }
            Op::Duplicate { at, len } => {
                let at = clamp(at);
                let span = out[at..(at + len).min(n)].to_vec();
                out.splice(at..at, span);
            }
            Op::Delete { at, len } => {
                let at = clamp(at);
                out.drain(at..(at + len).min(n));
            }
            Op::FlipBit { .. } => {}
        }
    }
}

/// An input made from a valid one by `ops`; `Debug` shows the ops, not the bytes.
#[derive(Clone)]
pub struct Mutated {
    /// The changes, in order.
    pub ops: Vec<Op>,
    /// The changed input.
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for Mutated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes after {:?}", self.bytes.len(), self.ops)
    }
}

impl std::ops::Deref for Mutated {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Lengths worth cutting at: nothing, the first fields of a header, around `hot` (where a
/// header ends), the middle and the last byte — and anywhere.
fn truncation(len: usize, hot: usize) -> BoxedStrategy<usize> {
    let mut classes: Vec<usize> = vec![0, 1, 2, 3, 4, 7, 8, 9, 12, 16, 24, 32, 64];
    classes.extend([hot.saturating_sub(1), hot, hot + 1, len / 2, len.saturating_sub(1)]);
    classes.retain(|&c| c < len);
    if classes.is_empty() {
        return Just(0).boxed();
    }
    prop_oneof![3 => proptest::sample::select(classes), 1 => 0..len.max(1)].boxed()
}

/// One op on an input of `len` bytes, its offsets mostly within the first `hot`.
pub fn op(len: usize, hot: usize) -> impl Strategy<Value = Op> {
    let hot = hot.clamp(1, len.max(1));
    let at = prop_oneof![3 => 0..hot, 1 => 0..len.max(1)].boxed();
    let edge_int = proptest::sample::select(EDGE_INTEGERS.to_vec());
    let edge_byte = proptest::sample::select(EDGE_BYTES.to_vec());
    let width = proptest::sample::select(vec![1usize, 2, 4, 8]);
    prop_oneof![
        2 => truncation(len, hot).prop_map(Op::Truncate),
        2 => (at.clone(), 0u8..8).prop_map(|(at, bit)| Op::FlipBit { at, bit }),
        3 => (at.clone(), width, edge_int).prop_map(|(at, width, value)| Op::SetInt { at, width, value }),
        1 => (at.clone(), 1usize..16, edge_byte).prop_map(|(at, len, byte)| Op::Fill { at, len, byte }),
        1 => (at.clone(), 1usize..64).prop_map(|(at, len)| Op::Duplicate { at, len }),
        1 => (at, 1usize..64).prop_map(|(at, len)| Op::Delete { at, len }),
    ]
}

/// Inputs made from `valid` by one to four ops, mostly within its first `hot` bytes.
pub fn mutations(valid: &[u8], hot: usize) -> impl Strategy<Value = Mutated> + use<> {
    let valid = valid.to_vec();
    proptest::collection::vec(op(valid.len(), hot), 1..=4).prop_map(move |ops| {
        let mut bytes = valid.clone();
        for op in &ops {
            op.apply(&mut bytes);
        }
        Mutated { ops, bytes }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_stay_within_the_input() {
        let mut v = b"abcdef".to_vec();
        Op::SetInt { at: 4, width: 8, value: u64::MAX }.apply(&mut v);
        assert_eq!(v, b"abcd\xff\xff");
        Op::Duplicate { at: 1, len: 2 }.apply(&mut v);
        assert_eq!(v, b"abcbcd\xff\xff");
        Op::Delete { at: 6, len: 9 }.apply(&mut v);
        assert_eq!(v, b"abcbcd");
        Op::Truncate(2).apply(&mut v);
        Op::FlipBit { at: 9, bit: 1 }.apply(&mut v);
        Op::Fill { at: 1, len: 4, byte: 0 }.apply(&mut v);
        assert_eq!(v, b"a\0");
    }
}
