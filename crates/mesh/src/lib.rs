//! Named device meshes and partition specs: the vocabulary every other siphon crate uses to
//! talk about sharding.
//!
//! A [`Mesh`] arranges `n` devices in a grid with named axes (siphon uses `data`, `fsdp` and
//! `model`). Mesh position `i` (row-major over the axes, first axis most significant) is SPMD
//! partition `i`, which runs on device id `device_ids[i]`; this is the order Shardy assumes
//! for a mesh without explicit device ids and the order of a PJRT device assignment.
//!
//! A [`PartitionSpec`] says, per tensor dimension, which mesh axes that dimension is split
//! over (major to minor), like JAX's `P("data", None)`. Axes a spec does not name are
//! replicated over.
//!
//! The crate does no I/O and knows nothing of StableHLO text or PJRT; it is pure index math
//! that the builder (text), the runtime (host-side split and assembly) and the planner
//! (memory) share, so they cannot disagree about which device holds which slice.
//!
//! ```
//! use siphon_mesh::{Mesh, PartitionSpec};
//! let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
//! let spec = PartitionSpec::new(&[&["data"], &[]]);
//! assert_eq!(spec.shard_shape(&[8, 16], &mesh).unwrap(), vec![4, 16]);
//! // Partition 5 sits at data=1, model=1: it holds rows 4..8.
//! assert_eq!(spec.shard_ranges(&[8, 16], &mesh, 5).unwrap(), vec![4..8, 0..16]);
//! ```
#![deny(missing_docs)]

use std::fmt;
use std::ops::Range;

mod hosts;
pub use hosts::HostView;

/// What went wrong building a mesh or applying a spec to a shape.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum MeshError {
    /// The axes' sizes multiply to a different device count than was given.
    #[error("mesh axes {axes} hold {expected} devices but {got} device ids were given")]
    DeviceCount {
        /// The axes as `name=size` text.
        axes: String,
        /// Product of the axis sizes.
        expected: usize,
        /// Device ids given.
        got: usize,
    },
    /// An axis of size zero, or a repeated or empty axis name.
    #[error("invalid mesh axis {0:?}")]
    BadAxis(String),
    /// The same device id appears twice in the mesh.
    #[error("device id {0} appears twice in the mesh")]
    DuplicateDevice(usize),
    /// A spec names an axis the mesh does not have.
    #[error("partition spec names axis {axis:?}, which mesh {mesh} does not have")]
    UnknownAxis {
        /// The unknown axis.
        axis: String,
        /// The mesh's axes.
        mesh: String,
    },
    /// A spec uses one axis for two dimensions.
    #[error("partition spec {0} uses an axis twice")]
    AxisReused(String),
    /// A mesh's partitions cannot be divided among processes as asked.
    #[error("{0}")]
    Hosts(String),
    /// A spec has a different rank than the tensor.
    #[error("partition spec {spec} has {spec_rank} dimensions but the tensor shape {shape:?} has {rank}")]
    RankMismatch {
        /// The spec.
        spec: String,
        /// Its rank.
        spec_rank: usize,
        /// The tensor shape.
        shape: Vec<usize>,
        /// Its rank.
        rank: usize,
    },
    /// A dimension does not divide evenly over the axes it is split over.
    #[error("dimension {dim} of shape {shape:?} (size {size}) does not divide over {axes} ({ways} ways)")]
    NotDivisible {
        /// Which dimension.
        dim: usize,
        /// The whole shape.
        shape: Vec<usize>,
        /// The dimension's size.
        size: usize,
        /// The axes, joined.
        axes: String,
        /// Product of those axes' sizes.
        ways: usize,
    },
    /// A byte buffer does not match the shape and element size.
    #[error("buffer of {got} bytes does not hold shape {shape:?} of {elem_bytes}-byte elements")]
    BufferSize {
        /// Bytes given.
        got: usize,
        /// The shape.
        shape: Vec<usize>,
        /// Bytes per element.
        elem_bytes: usize,
    },
}

/// One named mesh axis.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Axis {
    /// The axis name, e.g. `data`.
    pub name: String,
    /// How many devices lie along it.
    pub size: usize,
}

/// Devices arranged in a named grid. Position `i` (row-major) is SPMD partition `i`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mesh {
    axes: Vec<Axis>,
    device_ids: Vec<usize>,
}

impl Mesh {
    /// A mesh with the given `(name, size)` axes over `device_ids` in row-major order.
    pub fn new(axes: &[(&str, usize)], device_ids: Vec<usize>) -> Result<Mesh, MeshError> {
        let axes: Vec<Axis> = axes.iter().map(|&(name, size)| Axis { name: name.to_string(), size }).collect();
        for (i, axis) in axes.iter().enumerate() {
            if axis.size == 0 || axis.name.is_empty() || axes[..i].iter().any(|a| a.name == axis.name) {
                return Err(MeshError::BadAxis(format!("{}={}", axis.name, axis.size)));
            }
        }
        let expected: usize = axes.iter().map(|a| a.size).product();
        if expected != device_ids.len() {
            return Err(MeshError::DeviceCount { axes: axes_text(&axes), expected, got: device_ids.len() });
        }
        let mut seen = device_ids.clone();
        seen.sort_unstable();
        if let Some(pair) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(MeshError::DuplicateDevice(pair[0]));
        }
        Ok(Mesh { axes, device_ids })
    }

    /// One device (id 0) and no axes: everything is replicated, nothing is split.
    pub fn single_device() -> Mesh {
        Mesh { axes: Vec::new(), device_ids: vec![0] }
    }

    /// The axes, major to minor.
    pub fn axes(&self) -> &[Axis] {
        &self.axes
    }

    /// Size of the named axis, or `None` if the mesh has no such axis.
    pub fn axis_size(&self, name: &str) -> Option<usize> {
        self.axes.iter().find(|a| a.name == name).map(|a| a.size)
    }

    /// Size of the named axis, 1 if absent (an absent axis is a trivial one).
    pub fn axis_size_or_one(&self, name: &str) -> usize {
        self.axis_size(name).unwrap_or(1)
    }

    /// Number of devices (= SPMD partitions).
    pub fn num_devices(&self) -> usize {
        self.device_ids.len()
    }

    /// Device id of each partition, in partition order.
    pub fn device_ids(&self) -> &[usize] {
        &self.device_ids
    }

    /// This mesh, planned over devices `0..n`, on the devices `ids` (device `i` becomes
    /// `ids[i]`): how a plan's mesh is put on a client's or a topology's device ids.
    pub fn renumbered(&self, ids: &[usize]) -> Result<Mesh, MeshError> {
        if let Some(&i) = self.device_ids.iter().find(|&&i| i >= ids.len()) {
            return Err(MeshError::Hosts(format!(
                "mesh {self} names device {i}; only {} devices are given",
                ids.len()
            )));
        }
        let axes: Vec<(&str, usize)> = self.axes.iter().map(|a| (a.name.as_str(), a.size)).collect();
        Mesh::new(&axes, self.device_ids.iter().map(|&i| ids[i]).collect())
    }

    /// The coordinate along each axis of partition `partition`.
    pub fn coords(&self, partition: usize) -> Vec<usize> {
        let mut rest = partition;
        let mut coords = vec![0; self.axes.len()];
        for (i, axis) in self.axes.iter().enumerate().rev() {
            coords[i] = rest % axis.size;
            rest /= axis.size;
        }
        coords
    }

    fn axis_index(&self, name: &str) -> Result<usize, MeshError> {
        self.axes
            .iter()
            .position(|a| a.name == name)
            .ok_or_else(|| MeshError::UnknownAxis { axis: name.to_string(), mesh: self.to_string() })
    }
}

impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}]", axes_text(&self.axes))
    }
}

fn axes_text(axes: &[Axis]) -> String {
    axes.iter().map(|a| format!("{}={}", a.name, a.size)).collect::<Vec<_>>().join(", ")
}

/// Per tensor dimension, the mesh axes (major to minor) that dimension is split over; an
/// empty list means the dimension is not split.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PartitionSpec {
    dims: Vec<Vec<String>>,
}

impl PartitionSpec {
    /// A spec from per-dimension axis lists: `&[&["data"], &[]]` is `P("data", None)`.
    pub fn new(dims: &[&[&str]]) -> PartitionSpec {
        PartitionSpec { dims: dims.iter().map(|axes| axes.iter().map(|a| a.to_string()).collect()).collect() }
    }

    /// A spec from owned per-dimension axis lists.
    pub fn from_dims(dims: Vec<Vec<String>>) -> PartitionSpec {
        PartitionSpec { dims }
    }

    /// A spec that splits nothing, for a tensor of rank `rank`.
    pub fn replicated(rank: usize) -> PartitionSpec {
        PartitionSpec { dims: vec![Vec::new(); rank] }
    }

    /// The per-dimension axis lists.
    pub fn dims(&self) -> &[Vec<String>] {
        &self.dims
    }

    /// Rank of the tensors this spec applies to.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// True when no dimension is split.
    pub fn is_replicated(&self) -> bool {
        self.dims.iter().all(|d| d.is_empty())
    }

    /// Checks the spec against a mesh and a global shape: axes exist, none is used twice,
    /// ranks agree, each split dimension divides evenly.
    pub fn validate(&self, shape: &[usize], mesh: &Mesh) -> Result<(), MeshError> {
        self.shard_shape(shape, mesh).map(|_| ())
    }

    /// In how many pieces dimension `dim` is split on `mesh`.
    pub fn ways(&self, dim: usize, mesh: &Mesh) -> usize {
        self.dims[dim].iter().map(|a| mesh.axis_size_or_one(a)).product()
    }

    /// The shape each device holds.
    pub fn shard_shape(&self, shape: &[usize], mesh: &Mesh) -> Result<Vec<usize>, MeshError> {
        if shape.len() != self.dims.len() {
            return Err(MeshError::RankMismatch {
                spec: self.to_string(),
                spec_rank: self.dims.len(),
                shape: shape.to_vec(),
                rank: shape.len(),
            });
        }
        let mut used: Vec<&str> = Vec::new();
        for axes in &self.dims {
            for axis in axes {
                mesh.axis_index(axis)?;
                if used.contains(&axis.as_str()) {
                    return Err(MeshError::AxisReused(self.to_string()));
                }
                used.push(axis);
            }
        }
        shape
            .iter()
            .enumerate()
            .map(|(dim, &size)| {
                let ways = self.ways(dim, mesh);
                if size % ways != 0 {
                    return Err(MeshError::NotDivisible {
                        dim,
                        shape: shape.to_vec(),
                        size,
                        axes: self.dims[dim].join("*"),
                        ways,
                    });
                }
                Ok(size / ways)
            })
            .collect()
    }

    /// The slice of the global tensor (one range per dimension) held by `partition`.
    pub fn shard_ranges(&self, shape: &[usize], mesh: &Mesh, partition: usize) -> Result<Vec<Range<usize>>, MeshError> {
        let shard = self.shard_shape(shape, mesh)?;
        let coords = mesh.coords(partition);
        let mut ranges = Vec::with_capacity(shape.len());
        for (dim, axes) in self.dims.iter().enumerate() {
            // Index of this partition's piece along `dim`: axes listed major to minor.
            let mut piece = 0;
            for axis in axes {
                let i = mesh.axis_index(axis)?;
                piece = piece * mesh.axes[i].size + coords[i];
            }
            ranges.push(piece * shard[dim]..(piece + 1) * shard[dim]);
        }
        Ok(ranges)
    }

    /// Splits a row-major host buffer of `shape` into one buffer per partition.
    pub fn split(
        &self,
        bytes: &[u8],
        elem_bytes: usize,
        shape: &[usize],
        mesh: &Mesh,
    ) -> Result<Vec<Vec<u8>>, MeshError> {
        (0..mesh.num_devices()).map(|partition| self.shard(bytes, elem_bytes, shape, mesh, partition)).collect()
    }

    /// Partition `partition`'s shard of a row-major host buffer of `shape` (one piece of
    /// [`PartitionSpec::split`], for a process that uploads only its own partitions).
    pub fn shard(
        &self,
        bytes: &[u8],
        elem_bytes: usize,
        shape: &[usize],
        mesh: &Mesh,
        partition: usize,
    ) -> Result<Vec<u8>, MeshError> {
        check_len(bytes.len(), shape, elem_bytes)?;
        let ranges = self.shard_ranges(shape, mesh, partition)?;
        let mut out = Vec::with_capacity(block_len(&ranges) * elem_bytes);
        for_each_row(shape, &ranges, elem_bytes, |src, len| out.extend_from_slice(&bytes[src..src + len]));
        Ok(out)
    }

    /// Reassembles a row-major host buffer of the global `shape` from per-partition buffers
    /// (the inverse of [`PartitionSpec::split`]; replicas are read from the first partition
    /// holding each piece).
    pub fn assemble(
        &self,
        shards: &[&[u8]],
        elem_bytes: usize,
        shape: &[usize],
        mesh: &Mesh,
    ) -> Result<Vec<u8>, MeshError> {
        let shard_shape = self.shard_shape(shape, mesh)?;
        let mut out = vec![0u8; shape.iter().product::<usize>() * elem_bytes];
        let mut filled: Vec<Vec<Range<usize>>> = Vec::new();
        for (partition, shard) in shards.iter().enumerate().take(mesh.num_devices()) {
            check_len(shard.len(), &shard_shape, elem_bytes)?;
            let ranges = self.shard_ranges(shape, mesh, partition)?;
            if filled.contains(&ranges) {
                continue;
            }
            let mut offset = 0;
            for_each_row(shape, &ranges, elem_bytes, |dst, len| {
                out[dst..dst + len].copy_from_slice(&shard[offset..offset + len]);
                offset += len;
            });
            filled.push(ranges);
        }
        Ok(out)
    }
}

impl fmt::Display for PartitionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self
            .dims
            .iter()
            .map(|axes| match axes.len() {
                0 => "None".to_string(),
                1 => format!("{:?}", axes[0]),
                _ => format!("({})", axes.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join(", ")),
            })
            .collect();
        write!(f, "P({})", dims.join(", "))
    }
}

/// The block `block` (one range per dimension) of a row-major array, assembled row-major from
/// non-overlapping `pieces` of it, each a block (its ranges in the array) and its row-major
/// bytes: what a process reads back of an output whose other pieces lie on other processes.
/// Every element of `block` must lie in some piece.
pub fn assemble_block(
    pieces: &[(Vec<Range<usize>>, &[u8])],
    elem_bytes: usize,
    block: &[Range<usize>],
) -> Result<Vec<u8>, MeshError> {
    let block_shape: Vec<usize> = block.iter().map(Range::len).collect();
    let mut out = vec![0u8; block_len(block) * elem_bytes];
    let mut covered = 0;
    for (ranges, bytes) in pieces {
        let piece_shape: Vec<usize> = ranges.iter().map(Range::len).collect();
        check_len(bytes.len(), &piece_shape, elem_bytes)?;
        if ranges.len() != block.len() {
            return Err(MeshError::Hosts(format!(
                "a piece of rank {} for a block of rank {}",
                ranges.len(),
                block.len()
            )));
        }
        // The overlap, in the piece's and in the block's coordinates.
        let overlap: Vec<Range<usize>> =
            ranges.iter().zip(block).map(|(r, b)| r.start.max(b.start)..r.end.min(b.end)).collect();
        if overlap.iter().any(|r| r.start >= r.end) {
            continue;
        }
        let within = |origin: &[Range<usize>]| -> Vec<Range<usize>> {
            overlap.iter().zip(origin).map(|(o, r)| o.start - r.start..o.end - r.start).collect()
        };
        let mut sources = Vec::new();
        for_each_row(&piece_shape, &within(ranges), elem_bytes, |src, len| sources.push((src, len)));
        let mut rows = sources.into_iter();
        for_each_row(&block_shape, &within(block), elem_bytes, |dst, len| {
            if let Some((src, _)) = rows.next() {
                out[dst..dst + len].copy_from_slice(&bytes[src..src + len]);
            }
        });
        covered += block_len(&overlap);
    }
    if covered != block_len(block) {
        return Err(MeshError::Hosts(format!(
            "the pieces cover {covered} of the {} elements of the block {block:?}",
            block_len(block)
        )));
    }
    Ok(out)
}

fn check_len(got: usize, shape: &[usize], elem_bytes: usize) -> Result<(), MeshError> {
    if got != shape.iter().product::<usize>() * elem_bytes {
        return Err(MeshError::BufferSize { got, shape: shape.to_vec(), elem_bytes });
    }
    Ok(())
}

fn block_len(ranges: &[Range<usize>]) -> usize {
    ranges.iter().map(|r| r.len()).product()
}

/// Calls `f(byte offset in the global buffer, byte length)` for each contiguous innermost row
/// of the block `ranges`, in row-major order.
fn for_each_row(shape: &[usize], ranges: &[Range<usize>], elem_bytes: usize, mut f: impl FnMut(usize, usize)) {
    let rank = shape.len();
    if rank == 0 {
        f(0, elem_bytes);
        return;
    }
    let mut strides = vec![elem_bytes; rank];
    for d in (0..rank - 1).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    let row_len = ranges[rank - 1].len() * elem_bytes;
    if ranges.iter().any(|r| r.is_empty()) {
        return;
    }
    let mut index: Vec<usize> = ranges[..rank - 1].iter().map(|r| r.start).collect();
    loop {
        let base: usize =
            index.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>() + ranges[rank - 1].start * elem_bytes;
        f(base, row_len);
        // Odometer increment over the outer dimensions.
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            index[d] += 1;
            if index[d] < ranges[d].end {
                break;
            }
            index[d] = ranges[d].start;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh_2x4() -> Mesh {
        Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap()
    }

    #[test]
    fn coords_are_row_major() {
        let mesh = mesh_2x4();
        assert_eq!(mesh.coords(0), vec![0, 0]);
        assert_eq!(mesh.coords(3), vec![0, 3]);
        assert_eq!(mesh.coords(6), vec![1, 2]);
    }

    #[test]
    fn mesh_rejects_wrong_device_count_and_duplicates() {
        assert!(matches!(
            Mesh::new(&[("data", 2), ("model", 4)], (0..6).collect()),
            Err(MeshError::DeviceCount { expected: 8, got: 6, .. })
        ));
        assert_eq!(Mesh::new(&[("data", 2)], vec![1, 1]), Err(MeshError::DuplicateDevice(1)));
        assert!(matches!(Mesh::new(&[("data", 0)], vec![]), Err(MeshError::BadAxis(_))));
        assert!(matches!(Mesh::new(&[("a", 1), ("a", 1)], vec![0]), Err(MeshError::BadAxis(_))));
    }

    #[test]
    fn spec_errors_name_the_problem() {
        let mesh = mesh_2x4();
        let err = PartitionSpec::new(&[&["model"], &[]]).shard_shape(&[6, 2], &mesh).unwrap_err();
        assert!(err.to_string().contains("does not divide over model (4 ways)"), "{err}");
        let err = PartitionSpec::new(&[&["fsdp"]]).shard_shape(&[8], &mesh).unwrap_err();
        assert!(matches!(err, MeshError::UnknownAxis { .. }));
        let err = PartitionSpec::new(&[&["data"], &["data"]]).shard_shape(&[8, 8], &mesh).unwrap_err();
        assert!(matches!(err, MeshError::AxisReused(_)));
        let err = PartitionSpec::new(&[&[]]).shard_shape(&[8, 8], &mesh).unwrap_err();
        assert!(matches!(err, MeshError::RankMismatch { .. }));
    }

    #[test]
    fn split_then_assemble_is_identity_for_every_spec() {
        let mesh = mesh_2x4();
        let shape = [4, 8, 3];
        let data: Vec<u8> = (0..shape.iter().product::<usize>() as u32).flat_map(|x| x.to_le_bytes()).collect();
        let specs = [
            PartitionSpec::new(&[&[], &[], &[]]),
            PartitionSpec::new(&[&["data"], &["model"], &[]]),
            PartitionSpec::new(&[&[], &["data", "model"], &[]]),
            PartitionSpec::new(&[&["model"], &["data"], &[]]),
        ];
        for spec in specs {
            let shards = spec.split(&data, 4, &shape, &mesh).unwrap();
            assert_eq!(shards.len(), 8);
            let shard_elems: usize = spec.shard_shape(&shape, &mesh).unwrap().iter().product();
            assert!(shards.iter().all(|s| s.len() == shard_elems * 4));
            let views: Vec<&[u8]> = shards.iter().map(|s| s.as_slice()).collect();
            assert_eq!(spec.assemble(&views, 4, &shape, &mesh).unwrap(), data, "{spec}");
        }
    }

    #[test]
    fn split_picks_the_right_slice() {
        let mesh = mesh_2x4();
        // 2x8 matrix of u8 0..16, columns split over model, rows over data.
        let data: Vec<u8> = (0..16).collect();
        let spec = PartitionSpec::new(&[&["data"], &["model"]]);
        let shards = spec.split(&data, 1, &[2, 8], &mesh).unwrap();
        assert_eq!(shards[0], vec![0, 1]);
        assert_eq!(shards[3], vec![6, 7]);
        assert_eq!(shards[5], vec![10, 11]);
        // Two axes on one dimension: data is major.
        let spec = PartitionSpec::new(&[&[], &["data", "model"]]);
        let shards = spec.split(&data, 1, &[2, 8], &mesh).unwrap();
        assert_eq!(shards[1], vec![1, 9]);
        assert_eq!(shards[4], vec![4, 12]);
    }

    #[test]
    fn a_block_assembles_from_the_pieces_over_it() {
        let mesh = mesh_2x4();
        // A 4x8x2 array split over data (rows) and model (columns); rows 2..4 of it.
        let shape = [4, 8, 2];
        let data: Vec<u8> = (0..64).collect();
        let spec = PartitionSpec::new(&[&["data"], &["model"], &[]]);
        let shards = spec.split(&data, 1, &shape, &mesh).unwrap();
        let pieces: Vec<(Vec<Range<usize>>, &[u8])> =
            (0..8).map(|p| (spec.shard_ranges(&shape, &mesh, p).unwrap(), shards[p].as_slice())).collect();
        let block = [1..3, 0..8, 0..2];
        assert_eq!(assemble_block(&pieces, 1, &block).unwrap(), data[16..48].to_vec());
        // Only data=1's pieces: rows 2..4 are there, row 1 is not.
        assert_eq!(assemble_block(&pieces[4..], 1, &[2..4, 0..8, 0..2]).unwrap(), data[32..].to_vec());
        let err = assemble_block(&pieces[4..], 1, &block).unwrap_err();
        assert!(err.to_string().contains("cover 16 of the 32"), "{err}");
        assert_eq!(spec.shard(&data, 1, &shape, &mesh, 5).unwrap(), shards[5]);
    }

    #[test]
    fn display_reads_like_jax() {
        assert_eq!(PartitionSpec::new(&[&["data"], &[]]).to_string(), "P(\"data\", None)");
        assert_eq!(mesh_2x4().to_string(), "[data=2, model=4]");
    }
}
