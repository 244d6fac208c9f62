//! A minimal protobuf encoder for `xla.CompileOptionsProto`.
//!
//! Only what siphon sends: varints and length-delimited sub-messages. Field numbers are from
//! XLA's `xla/pjrt/proto/compile_options.proto` and `xla/xla_data.proto`. Writing these few
//! bytes by hand avoids protoc/prost in a crate that otherwise needs no protobuf.

use crate::compile::CompileOptions;

// CompileOptionsProto
const COMPILE_OPTIONS_EXECUTABLE_BUILD_OPTIONS: u32 = 3;
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
}
