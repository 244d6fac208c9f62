//! A minimal protobuf encoder for `xla.CompileOptionsProto`.
//!
//! Only what siphon sends: varints and length-delimited sub-messages. Field numbers are from
//! XLA's `xla/pjrt/proto/compile_options.proto` and `xla/xla_data.proto`. Writing these few
//! bytes by hand avoids protoc/prost in a crate that otherwise needs no protobuf.

use crate::compile_options::{CompileOptions, XlaOption};

// CompileOptionsProto
const COMPILE_OPTIONS_EXECUTABLE_BUILD_OPTIONS: u32 = 3;
const COMPILE_OPTIONS_ENV_OPTION_OVERRIDES: u32 = 7;
// A map entry
const MAP_KEY: u32 = 1;
const MAP_VALUE: u32 = 2;
// OptionOverrideProto
const OVERRIDE_STRING: u32 = 1;
const OVERRIDE_BOOL: u32 = 2;
const OVERRIDE_INT: u32 = 3;
// ExecutableBuildOptionsProto
const BUILD_NUM_REPLICAS: u32 = 4;
const BUILD_NUM_PARTITIONS: u32 = 5;
const BUILD_USE_SPMD_PARTITIONING: u32 = 6;
const BUILD_DEVICE_ASSIGNMENT: u32 = 9;
const BUILD_USE_SHARDY_PARTITIONER: u32 = 19;
// DeviceAssignmentProto
const ASSIGNMENT_REPLICA_COUNT: u32 = 1;
const ASSIGNMENT_COMPUTATION_COUNT: u32 = 2;
const ASSIGNMENT_COMPUTATION_DEVICES: u32 = 3;
// DeviceAssignmentProto.ComputationDevice
const COMPUTATION_REPLICA_DEVICE_IDS: u32 = 1;

const WIRE_VARINT: u32 = 0;
const WIRE_LEN: u32 = 2;

/// Serializes `options` with the resolved `[replica][partition]` device assignment.
pub(crate) fn compile_options(options: &CompileOptions, assignment: &[Vec<usize>]) -> Vec<u8> {
    // DeviceAssignmentProto: computation_devices[partition].replica_device_ids[replica].
    let mut device_assignment = Vec::new();
    put_varint_field(&mut device_assignment, ASSIGNMENT_REPLICA_COUNT, options.num_replicas as u64);
    put_varint_field(&mut device_assignment, ASSIGNMENT_COMPUTATION_COUNT, options.num_partitions as u64);
    for partition in 0..options.num_partitions {
        let mut packed = Vec::new();
        for replica in assignment {
            put_varint(&mut packed, replica[partition] as u64);
        }
        let mut computation = Vec::new();
        put_len_field(&mut computation, COMPUTATION_REPLICA_DEVICE_IDS, &packed);
        put_len_field(&mut device_assignment, ASSIGNMENT_COMPUTATION_DEVICES, &computation);
    }

    let mut build = Vec::new();
    put_varint_field(&mut build, BUILD_NUM_REPLICAS, options.num_replicas as u64);
    put_varint_field(&mut build, BUILD_NUM_PARTITIONS, options.num_partitions as u64);
    put_varint_field(&mut build, BUILD_USE_SPMD_PARTITIONING, options.use_spmd_partitioning as u64);
    put_len_field(&mut build, BUILD_DEVICE_ASSIGNMENT, &device_assignment);
    put_varint_field(&mut build, BUILD_USE_SHARDY_PARTITIONER, options.use_shardy_partitioner as u64);

    let mut out = Vec::new();
    put_len_field(&mut out, COMPILE_OPTIONS_EXECUTABLE_BUILD_OPTIONS, &build);
    for (name, value) in &options.xla_options {
        let mut value_proto = Vec::new();
        match value {
            XlaOption::Str(s) => put_len_field(&mut value_proto, OVERRIDE_STRING, s.as_bytes()),
            XlaOption::Bool(b) => put_varint_field(&mut value_proto, OVERRIDE_BOOL, *b as u64),
            // int64 as a varint: two's complement in 64 bits, as protobuf encodes negatives.
            XlaOption::Int(i) => put_varint_field(&mut value_proto, OVERRIDE_INT, *i as u64),
        }
        let mut entry = Vec::new();
        put_len_field(&mut entry, MAP_KEY, name.as_bytes());
        put_len_field(&mut entry, MAP_VALUE, &value_proto);
        put_len_field(&mut out, COMPILE_OPTIONS_ENV_OPTION_OVERRIDES, &entry);
    }
    out
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_tag(out: &mut Vec<u8>, field: u32, wire: u32) {
    put_varint(out, u64::from(field << 3 | wire));
}

fn put_varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
    put_tag(out, field, WIRE_VARINT);
    put_varint(out, value);
}

fn put_len_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_tag(out, field, WIRE_LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_match_the_protobuf_encoding() {
        let mut out = Vec::new();
        put_varint(&mut out, 1);
        put_varint(&mut out, 300);
        put_varint(&mut out, 0);
        assert_eq!(out, [0x01, 0xac, 0x02, 0x00]);
    }

    #[test]
    fn field_19_tag_takes_two_bytes() {
        let mut out = Vec::new();
        put_varint_field(&mut out, BUILD_USE_SHARDY_PARTITIONER, 1);
        // (19 << 3) | 0 = 152 = 0x98 0x01
        assert_eq!(out, [0x98, 0x01, 0x01]);
    }

    #[test]
    fn two_partition_options_encode_the_assignment() {
        let options = CompileOptions {
            num_replicas: 1,
            num_partitions: 2,
            use_spmd_partitioning: true,
            use_shardy_partitioner: true,
            device_assignment: None,
            xla_options: Vec::new(),
        };
        let bytes = compile_options(&options, &[vec![3, 5]]);
        // Device assignment: replica_count=1, computation_count=2, then one computation per
        // partition holding its packed replica device ids {field 1, len 1, id}.
        let mut expected_assignment = vec![0x08, 1, 0x10, 2];
        for id in [3u8, 5] {
            expected_assignment.extend_from_slice(&[0x1a, 3, 0x0a, 1, id]);
        }
        let mut build = vec![0x20, 1, 0x28, 2, 0x30, 1, 0x4a, expected_assignment.len() as u8];
        build.extend_from_slice(&expected_assignment);
        build.extend_from_slice(&[0x98, 0x01, 0x01]);
        let mut expected = vec![0x1a, build.len() as u8];
        expected.extend_from_slice(&build);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn xla_options_are_map_entries_of_env_option_overrides() {
        let mut options = CompileOptions::single_device(None);
        options.xla_options = vec![
            ("ab".into(), XlaOption::Int(512)),
            ("c".into(), XlaOption::Bool(true)),
            ("d".into(), XlaOption::Str("x".into())),
        ];
        let bytes = compile_options(&options, &[vec![0]]);
        // After the build options: field 7 (tag 0x3a) per entry, {1: key, 2: {3|2|1: value}}.
        let tail = [
            &[0x3a, 9, 0x0a, 2, b'a', b'b', 0x12, 3, 0x18, 0x80, 0x04][..],
            &[0x3a, 7, 0x0a, 1, b'c', 0x12, 2, 0x10, 1][..],
            &[0x3a, 8, 0x0a, 1, b'd', 0x12, 3, 0x0a, 1, b'x'][..],
        ]
        .concat();
        assert!(bytes.ends_with(&tail), "{bytes:x?}");
        assert_eq!(bytes[0], 0x1a, "the build options come first");
    }
}
