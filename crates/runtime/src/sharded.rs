//! Arrays split over a [`Mesh`] by a [`PartitionSpec`]: one device buffer per partition.
//!
//! The index math (which slice each partition holds) is siphon-mesh's, the same the StableHLO
//! builder uses for its `sdy.sharding` annotations, so host-side splitting and XLA's view of
//! the program agree by construction.
//!
//! In a multi-process job a mesh spans devices of several processes; each process holds only
//! the partitions on its addressable devices (its *local* partitions). In a single process
//! every partition is local.

use std::ops::Range;

use siphon_mesh::{Mesh, PartitionSpec};

use crate::buffer::{Buffer, Download, ElementType, HostArray, Upload, download_many};
use crate::client::Client;
use crate::compile::Executable;
use crate::error::{Error, Result};

/// A global array split over a mesh, as this process's shards: `buffers()[i]` is mesh
/// partition `partitions()[i]`, on device `mesh.device_ids()[partitions()[i]]`.
#[derive(Debug)]
pub struct ShardedArray {
    buffers: Vec<Buffer>,
    partitions: Vec<usize>,
    element_type: ElementType,
    shape: Vec<usize>,
    spec: PartitionSpec,
    mesh: Mesh,
}

/// One shard copied to the host by [`ShardedArray::local_shards_to_host`].
#[derive(Debug, Clone, PartialEq)]
pub struct HostShard {
    /// The mesh partition.
    pub partition: usize,
    /// The slice of the global array it holds, one range per dimension.
    pub ranges: Vec<Range<usize>>,
    /// Its contents.
    pub array: HostArray,
}

/// A slice of an array (its ranges per dimension) and the local buffer holding it.
type LocalSlice<'a> = (Vec<Range<usize>>, &'a Buffer);

impl ShardedArray {
    /// Wraps one buffer per mesh partition (`buffers[p]` is partition `p`), checking count,
    /// element type, shard shapes and devices.
    pub fn from_buffers(
        buffers: Vec<Buffer>,
        shape: &[usize],
        spec: &PartitionSpec,
        mesh: &Mesh,
    ) -> Result<ShardedArray> {
        if buffers.len() != mesh.num_devices() {
            return Err(Error::InvalidArgument(format!(
                "mesh {mesh} has {} partitions but {} buffers were given",
                mesh.num_devices(),
                buffers.len()
            )));
        }
        let partitions = (0..buffers.len()).collect();
        ShardedArray::from_local_buffers(buffers, partitions, shape, spec, mesh)
    }

    /// Wraps the buffers of some partitions (this process's, in a multi-process job):
    /// `buffers[i]` is partition `partitions[i]`. Partitions must be distinct and ascending.
    pub fn from_local_buffers(
        buffers: Vec<Buffer>,
        partitions: Vec<usize>,
        shape: &[usize],
        spec: &PartitionSpec,
        mesh: &Mesh,
    ) -> Result<ShardedArray> {
        let shard_shape = spec.shard_shape(shape, mesh)?;
        if buffers.len() != partitions.len() {
            return Err(Error::InvalidArgument(format!(
                "{} buffers for {} partitions",
                buffers.len(),
                partitions.len()
            )));
        }
        if partitions.windows(2).any(|w| w[0] >= w[1]) || partitions.last().is_some_and(|&p| p >= mesh.num_devices()) {
            return Err(Error::InvalidArgument(format!(
                "partitions {partitions:?} must be distinct, ascending and below {}",
                mesh.num_devices()
            )));
        }
        let Some(first) = buffers.first() else {
            return Err(Error::InvalidArgument("a sharded array needs at least one buffer".into()));
        };
        let element_type = first.element_type()?;
        for (buffer, &partition) in buffers.iter().zip(&partitions) {
            let (dims, dtype, device) = (buffer.dims()?, buffer.element_type()?, buffer.device_id()?);
            if dims != shard_shape || dtype != element_type {
                return Err(Error::InvalidArgument(format!(
                    "partition {partition} holds {dtype}{dims:?}; spec {spec} of {element_type}{shape:?} on {mesh} needs {element_type}{shard_shape:?}"
                )));
            }
            if device != mesh.device_ids()[partition] {
                return Err(Error::InvalidArgument(format!(
                    "partition {partition} is on device {device}, the mesh puts it on device {}",
                    mesh.device_ids()[partition]
                )));
            }
        }
        Ok(ShardedArray {
            buffers,
            partitions,
            element_type,
            shape: shape.to_vec(),
            spec: spec.clone(),
            mesh: mesh.clone(),
        })
    }

    /// This process's shard buffers, in ascending partition order (all partitions in a
    /// single-process job, so `buffers()[p]` is partition `p` there).
    pub fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }

    /// The mesh partition of each buffer.
    pub fn partitions(&self) -> &[usize] {
        &self.partitions
    }

    /// Whether this process holds every partition.
    pub fn is_complete(&self) -> bool {
        self.partitions.len() == self.mesh.num_devices()
    }

    /// The buffer of `partition`, if this process holds it.
    pub fn buffer(&self, partition: usize) -> Option<&Buffer> {
        self.partitions.binary_search(&partition).ok().map(|i| &self.buffers[i])
    }

    /// Takes the shard buffers.
    pub fn into_buffers(self) -> Vec<Buffer> {
        self.buffers
    }

    /// The global shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub fn element_type(&self) -> ElementType {
        self.element_type
    }

    /// How the array is split.
    pub fn spec(&self) -> &PartitionSpec {
        &self.spec
    }

    /// The mesh it is split over.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// Downloads the shards and assembles the global row-major array. Replicated pieces are
    /// downloaded once (from the first partition holding them); all copies run concurrently.
    /// Fails when a piece of the array lies only on other processes' devices.
    pub fn to_host(&self) -> Result<HostArray> {
        let num_partitions = self.mesh.num_devices();
        // Each distinct piece, and the local partition it is downloaded from.
        let mut pieces: Vec<(Vec<Range<usize>>, Option<usize>)> = Vec::new();
        let mut piece_of = Vec::with_capacity(num_partitions);
        for partition in 0..num_partitions {
            let ranges = self.spec.shard_ranges(&self.shape, &self.mesh, partition)?;
            let index = match pieces.iter().position(|(r, _)| *r == ranges) {
                Some(index) => index,
                None => {
                    pieces.push((ranges, None));
                    pieces.len() - 1
                }
            };
            if pieces[index].1.is_none() && self.buffer(partition).is_some() {
                pieces[index].1 = Some(partition);
            }
            piece_of.push(index);
        }
        let mut sources = Vec::with_capacity(pieces.len());
        for (ranges, local) in &pieces {
            let partition = local.ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "the slice {ranges:?} of this {}{:?} array lies on another process's devices; \
                     use local_shards_to_host",
                    self.element_type, self.shape
                ))
            })?;
            let buffer = self
                .buffer(partition)
                .ok_or_else(|| Error::Unexpected(format!("local partition {partition} has no buffer")))?;
            sources.push(buffer);
        }
        let downloaded = download_many(&sources)?;
        let slices: Vec<&[u8]> = piece_of.iter().map(|&i| downloaded[i].bytes()).collect();
        let bytes = self.spec.assemble(&slices, self.element_type.size_in_bytes(), &self.shape, &self.mesh)?;
        HostArray::from_bytes(self.element_type, &self.shape, bytes)
    }

    /// Rows `rows` (ranges of the first dimension, in order) of the global array, downloaded
    /// from the partitions `from` (one copy of each distinct slice over them, all
    /// concurrently) and concatenated: what a process of a mesh spanning processes reads back
    /// of an output split by rows, from its own partitions. Fails when some of those rows lie
    /// only on other partitions, or `from` names one this array does not hold here.
    pub fn rows_to_host(&self, rows: &[Range<usize>], from: &[usize]) -> Result<HostArray> {
        let Some((&first, rest)) = self.shape.split_first() else {
            return Err(Error::InvalidArgument("rows of a scalar array".into()));
        };
        let blocks: Vec<Vec<Range<usize>>> =
            rows.iter().map(|r| std::iter::once(r.clone()).chain(rest.iter().map(|&n| 0..n)).collect()).collect();
        if let Some(r) = rows.iter().find(|r| r.end > first) {
            return Err(Error::InvalidArgument(format!("rows {r:?} of an array of {first} rows")));
        }
        let pieces = self.pieces_meeting(rows, from)?;
        let sources: Vec<&Buffer> = pieces.iter().map(|(_, b)| *b).collect();
        let downloaded = download_many(&sources)?;
        let pieces: Vec<(Vec<Range<usize>>, &[u8])> =
            pieces.iter().zip(&downloaded).map(|((r, _), a)| (r.clone(), a.bytes())).collect();
        let elem = self.element_type.size_in_bytes();
        let mut bytes = Vec::new();
        for block in &blocks {
            let part = siphon_mesh::assemble_block(&pieces, elem, block).map_err(|e| {
                Error::InvalidArgument(format!(
                    "rows {:?} of this {}{:?} array: {e} of partitions {from:?}",
                    block[0], self.element_type, self.shape
                ))
            })?;
            bytes.extend_from_slice(&part);
        }
        let shape: Vec<usize> =
            std::iter::once(rows.iter().map(Range::len).sum()).chain(rest.iter().copied()).collect();
        HostArray::from_bytes(self.element_type, &shape, bytes)
    }

    /// [`ShardedArray::rows_to_host`] into `dst` (which must hold exactly those rows) instead
    /// of new memory: where each slice the partitions `from` hold is whole rows inside the
    /// requested ones (an output split by rows over `data`, or replicated), every slice is
    /// copied straight to its place in `dst`, all at once; otherwise the rows are assembled
    /// first and copied in.
    pub fn rows_into<'a>(&self, rows: &[Range<usize>], from: &[usize], dst: &'a mut [u8]) -> Result<Download<'a>> {
        let Some((_, rest)) = self.shape.split_first() else {
            return Err(Error::InvalidArgument("rows of a scalar array".into()));
        };
        let row_bytes = rest.iter().product::<usize>() * self.element_type.size_in_bytes();
        let wanted: usize = rows.iter().map(Range::len).sum();
        if dst.len() != wanted * row_bytes {
            return Err(Error::InvalidArgument(format!(
                "a {}-byte destination for {wanted} rows of {row_bytes} bytes",
                dst.len()
            )));
        }
        // Where row `row` goes in `dst`, counted in rows, if it is requested.
        let place = |row: usize| {
            let mut before = 0;
            for r in rows {
                if r.contains(&row) {
                    return Some(before + row - r.start);
                }
                before += r.len();
            }
            None
        };
        // Each distinct slice meeting a requested row, with its buffer and its place.
        struct Piece<'b> {
            ranges: Vec<Range<usize>>,
            buffer: &'b Buffer,
            /// The row of `dst` it starts at, when it can be copied there as it is.
            at: Option<usize>,
        }
        let mut pieces: Vec<Piece<'_>> = self
            .pieces_meeting(rows, from)?
            .into_iter()
            .map(|(ranges, buffer)| {
                let whole_rows = ranges[1..].iter().zip(rest).all(|(r, &n)| *r == (0..n));
                let inside = rows.iter().any(|r| r.start <= ranges[0].start && ranges[0].end <= r.end);
                let at = (whole_rows && inside).then(|| place(ranges[0].start)).flatten();
                Piece { ranges, buffer, at }
            })
            .collect();
        let covered: usize = pieces.iter().map(|p| p.ranges[0].len()).sum();
        if covered != wanted || pieces.iter().any(|p| p.at.is_none()) {
            let array = self.rows_to_host(rows, from)?;
            dst.copy_from_slice(array.bytes());
            return Ok(Download::done());
        }
        // Disjoint slices of `dst`, one per piece, in order of place.
        pieces.sort_by_key(|p| p.at);
        let mut download = Download::done();
        let mut rest_of_dst = dst;
        let mut offset = 0;
        for Piece { ranges, buffer, at } in pieces {
            let start = at.expect("checked above") * row_bytes;
            let (_, tail) = std::mem::take(&mut rest_of_dst).split_at_mut(start - offset);
            let (piece, tail) = tail.split_at_mut(ranges[0].len() * row_bytes);
            download = download.join(buffer.to_host_into(piece)?);
            rest_of_dst = tail;
            offset = start + ranges[0].len() * row_bytes;
        }
        Ok(download)
    }

    /// One local partition of `from` per distinct slice that meets a requested row: the slice's
    /// ranges and its buffer, in the order of `from`. Fails when `from` names a partition this
    /// array does not hold here.
    fn pieces_meeting(&self, rows: &[Range<usize>], from: &[usize]) -> Result<Vec<LocalSlice<'_>>> {
        let mut pieces: Vec<LocalSlice<'_>> = Vec::new();
        for &partition in from {
            let buffer = self
                .buffer(partition)
                .ok_or_else(|| Error::InvalidArgument(format!("partition {partition} is not held by this process")))?;
            let ranges = self.spec.shard_ranges(&self.shape, &self.mesh, partition)?;
            let meets = rows.iter().any(|r| r.start < ranges[0].end && ranges[0].start < r.end);
            if meets && !pieces.iter().any(|(r, _)| *r == ranges) {
                pieces.push((ranges, buffer));
            }
        }
        Ok(pieces)
    }

    /// One array from the shards of several processes' views of it (disjoint partitions of
    /// the same global array): how one process stands in for several in a simulation of a
    /// mesh spanning processes.
    pub fn merge(parts: Vec<ShardedArray>) -> Result<ShardedArray> {
        let Some(first) = parts.first() else {
            return Err(Error::InvalidArgument("merging no arrays".into()));
        };
        let (shape, spec, mesh) = (first.shape.clone(), first.spec.clone(), first.mesh.clone());
        let mut shards = Vec::new();
        for part in parts {
            if part.shape != shape || part.spec != spec || part.mesh != mesh {
                return Err(Error::InvalidArgument(format!(
                    "merging {:?} split by {} with {shape:?} split by {spec}",
                    part.shape, part.spec
                )));
            }
            shards.extend(part.partitions.into_iter().zip(part.buffers));
        }
        shards.sort_by_key(|(p, _)| *p);
        let (partitions, buffers): (Vec<usize>, Vec<Buffer>) = shards.into_iter().unzip();
        ShardedArray::from_local_buffers(buffers, partitions, &shape, &spec, &mesh)
    }

    /// Downloads this process's shards (all concurrently), each with the slice of the global
    /// array it holds.
    pub fn local_shards_to_host(&self) -> Result<Vec<HostShard>> {
        let buffers: Vec<&Buffer> = self.buffers.iter().collect();
        let arrays = download_many(&buffers)?;
        self.partitions
            .iter()
            .zip(arrays)
            .map(|(&partition, array)| {
                let ranges = self.spec.shard_ranges(&self.shape, &self.mesh, partition)?;
                Ok(HostShard { partition, ranges, array })
            })
            .collect()
    }

    /// Sum of the shards' on-device sizes.
    pub fn on_device_size_in_bytes(&self) -> Result<usize> {
        self.buffers.iter().map(Buffer::on_device_size_in_bytes).sum()
    }
}

impl Client {
    /// Splits `array` by `spec` over `mesh` and uploads partition `p`'s shard to
    /// `mesh.device_ids()[p]`, for every partition on a device this process can address
    /// (all of them in a single-process job). Every mesh device must exist in the client.
    pub fn upload_sharded(&self, array: &HostArray, spec: &PartitionSpec, mesh: &Mesh) -> Result<ShardedArray> {
        let mut partitions = Vec::new();
        for (partition, &device_id) in mesh.device_ids().iter().enumerate() {
            if self.inner.device(device_id)?.info.addressable {
                partitions.push(partition);
            }
        }
        self.upload_partitions(array, spec, mesh, partitions)
    }

    /// Splits `array` by `spec` over `mesh` and uploads the shards of `partitions` only
    /// (ascending), each to its device: one process's share of an array on a mesh spanning
    /// processes.
    pub fn upload_partitions(
        &self,
        array: &HostArray,
        spec: &PartitionSpec,
        mesh: &Mesh,
        partitions: Vec<usize>,
    ) -> Result<ShardedArray> {
        if partitions.windows(2).any(|w| w[0] >= w[1]) || partitions.last().is_some_and(|&p| p >= mesh.num_devices()) {
            return Err(Error::InvalidArgument(format!(
                "partitions {partitions:?} must be distinct, ascending and below {}",
                mesh.num_devices()
            )));
        }
        let element_type = array.element_type();
        let shard_shape = spec.shard_shape(array.shape(), mesh)?;
        let elem = element_type.size_in_bytes();
        let shards = partitions
            .iter()
            .map(|&p| spec.shard(array.bytes(), elem, array.shape(), mesh, p))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let uploads: Vec<Upload<'_>> = partitions
            .iter()
            .zip(&shards)
            .map(|(&p, bytes)| Upload { element_type, shape: &shard_shape, bytes, device_id: mesh.device_ids()[p] })
            .collect();
        let buffers = self.upload_many(&uploads)?;
        Ok(ShardedArray {
            buffers,
            partitions,
            element_type,
            shape: array.shape().to_vec(),
            spec: spec.clone(),
            mesh: mesh.clone(),
        })
    }
}

impl Executable {
    /// Runs an SPMD program compiled for `mesh` (e.g. with [`crate::CompileOptions::spmd`]) on
    /// sharded arguments, and wraps output `o` as a sharded array split by `output_specs[o]`
    /// (its global shape is the per-device shape times the split of each dimension).
    ///
    /// The program runs on this process's devices of the mesh; every argument must hold the
    /// partitions on them.
    pub fn execute_sharded(
        &self,
        mesh: &Mesh,
        arguments: &[&ShardedArray],
        output_specs: &[PartitionSpec],
    ) -> Result<Vec<ShardedArray>> {
        if output_specs.len() != self.num_outputs() {
            return Err(Error::InvalidArgument(format!(
                "the program has {} outputs but {} output specs were given",
                self.num_outputs(),
                output_specs.len()
            )));
        }
        for (index, argument) in arguments.iter().enumerate() {
            if argument.mesh() != mesh {
                return Err(Error::InvalidArgument(format!(
                    "argument {index} is split over mesh {} with devices {:?}, not {mesh} with devices {:?}",
                    argument.mesh(),
                    argument.mesh().device_ids(),
                    mesh.device_ids()
                )));
            }
        }
        // Execution position i runs device_ids()[i]; find the mesh partition on that device.
        let mut partition_of_position = Vec::with_capacity(self.device_ids().len());
        for &device in self.device_ids() {
            let partition = mesh.device_ids().iter().position(|&d| d == device).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "the program runs on device {device}, which mesh {mesh} (devices {:?}) does not hold",
                    mesh.device_ids()
                ))
            })?;
            partition_of_position.push(partition);
        }
        let mut argument_lists: Vec<Vec<&Buffer>> = Vec::with_capacity(partition_of_position.len());
        for &partition in &partition_of_position {
            let mut list = Vec::with_capacity(arguments.len());
            for (index, argument) in arguments.iter().enumerate() {
                list.push(argument.buffer(partition).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "argument {index} has no shard for partition {partition} (device {})",
                        mesh.device_ids()[partition]
                    ))
                })?);
            }
            argument_lists.push(list);
        }
        let outputs = self.execute(&argument_lists)?;

        // Regroup [position][output] into [output] lists sorted by partition.
        let mut by_output: Vec<Vec<(usize, Buffer)>> = (0..self.num_outputs()).map(|_| Vec::new()).collect();
        for (position, list) in outputs.into_iter().enumerate() {
            for (output, buffer) in list.into_iter().enumerate() {
                by_output[output].push((partition_of_position[position], buffer));
            }
        }
        by_output
            .into_iter()
            .zip(output_specs)
            .enumerate()
            .map(|(output, (mut shards, spec))| {
                shards.sort_by_key(|(partition, _)| *partition);
                let (partitions, buffers): (Vec<usize>, Vec<Buffer>) = shards.into_iter().unzip();
                let shard_dims = buffers
                    .first()
                    .ok_or_else(|| Error::Unexpected(format!("output {output} has no buffers")))?
                    .dims()?;
                if shard_dims.len() != spec.rank() {
                    return Err(Error::InvalidArgument(format!(
                        "output {output} has rank {} but its spec {spec} has rank {}",
                        shard_dims.len(),
                        spec.rank()
                    )));
                }
                let shape: Vec<usize> =
                    shard_dims.iter().enumerate().map(|(dim, &size)| size * spec.ways(dim, mesh)).collect();
                ShardedArray::from_local_buffers(buffers, partitions, &shape, spec, mesh)
            })
            .collect()
    }
}
