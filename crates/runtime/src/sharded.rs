//! Arrays split over a [`Mesh`] by a [`PartitionSpec`]: one device buffer per partition.
//!
//! The index math (which slice each partition holds) is siphon-mesh's, the same the StableHLO
//! builder uses for its `sdy.sharding` annotations, so host-side splitting and XLA's view of
//! the program agree by construction.

use siphon_mesh::{Mesh, PartitionSpec};

use crate::buffer::{Buffer, ElementType, HostArray, Upload, download_many};
use crate::client::Client;
use crate::compile::Executable;
use crate::error::{Error, Result};

/// A global array held as one buffer per mesh partition: buffer `p` is partition `p`'s
/// shard, on device `mesh.device_ids()[p]`.
#[derive(Debug)]
pub struct ShardedArray {
    buffers: Vec<Buffer>,
    element_type: ElementType,
    shape: Vec<usize>,
    spec: PartitionSpec,
    mesh: Mesh,
}

impl ShardedArray {
    /// Wraps per-partition buffers, checking count, element type, shard shapes and devices.
    pub fn from_buffers(
        buffers: Vec<Buffer>,
        shape: &[usize],
        spec: &PartitionSpec,
        mesh: &Mesh,
    ) -> Result<ShardedArray> {
        let shard_shape = spec.shard_shape(shape, mesh)?;
        if buffers.len() != mesh.num_devices() {
            return Err(Error::InvalidArgument(format!(
                "mesh {mesh} has {} partitions but {} buffers were given",
                mesh.num_devices(),
                buffers.len()
            )));
        }
        let Some(first) = buffers.first() else {
            return Err(Error::InvalidArgument(
                "a sharded array needs at least one buffer".into(),
            ));
        };
        let element_type = first.element_type()?;
        for (partition, buffer) in buffers.iter().enumerate() {
            let (dims, dtype, device) =
                (buffer.dims()?, buffer.element_type()?, buffer.device_id()?);
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
            element_type,
            shape: shape.to_vec(),
            spec: spec.clone(),
            mesh: mesh.clone(),
        })
    }

    /// The per-partition buffers.
    pub fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }

    /// Takes the per-partition buffers.
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
    pub fn to_host(&self) -> Result<HostArray> {
        // For each partition, which download holds its piece: replicas share one.
        let mut download_of = Vec::with_capacity(self.buffers.len());
        let mut unique: Vec<(Vec<std::ops::Range<usize>>, usize)> = Vec::new();
        for partition in 0..self.buffers.len() {
            let ranges = self.spec.shard_ranges(&self.shape, &self.mesh, partition)?;
            match unique.iter().position(|(r, _)| *r == ranges) {
                Some(index) => download_of.push(index),
                None => {
                    download_of.push(unique.len());
                    unique.push((ranges, partition));
                }
            }
        }
        let sources: Vec<&Buffer> = unique.iter().map(|&(_, p)| &self.buffers[p]).collect();
        let downloaded = download_many(&sources)?;
        let slices: Vec<&[u8]> = download_of
            .iter()
            .map(|&index| downloaded[index].bytes())
            .collect();
        let bytes = self.spec.assemble(
            &slices,
            self.element_type.size_in_bytes(),
            &self.shape,
            &self.mesh,
        )?;
        HostArray::from_bytes(self.element_type, &self.shape, bytes)
    }

    /// Sum of the shards' on-device sizes.
    pub fn on_device_size_in_bytes(&self) -> Result<usize> {
        self.buffers
            .iter()
            .map(Buffer::on_device_size_in_bytes)
            .sum()
    }
}

impl Client {
    /// Splits `array` by `spec` over `mesh` and uploads partition `p`'s shard to
    /// `mesh.device_ids()[p]`.
    pub fn upload_sharded(
        &self,
        array: &HostArray,
        spec: &PartitionSpec,
        mesh: &Mesh,
    ) -> Result<ShardedArray> {
        let element_type = array.element_type();
        let shard_shape = spec.shard_shape(array.shape(), mesh)?;
        let shards = spec.split(
            array.bytes(),
            element_type.size_in_bytes(),
            array.shape(),
            mesh,
        )?;
        let uploads: Vec<Upload<'_>> = shards
            .iter()
            .zip(mesh.device_ids())
            .map(|(bytes, &device_id)| Upload {
                element_type,
                shape: &shard_shape,
                bytes,
                device_id,
            })
            .collect();
        let buffers = self.upload_many(&uploads)?;
        Ok(ShardedArray {
            buffers,
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
    /// All of `mesh`'s devices must be addressable from this process.
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
        if partition_of_position.len() != mesh.num_devices() {
            return Err(Error::InvalidArgument(format!(
                "the program runs on {} devices, mesh {mesh} has {}",
                partition_of_position.len(),
                mesh.num_devices()
            )));
        }
        let argument_lists: Vec<Vec<&Buffer>> = partition_of_position
            .iter()
            .map(|&partition| arguments.iter().map(|a| &a.buffers()[partition]).collect())
            .collect();
        let outputs = self.execute(&argument_lists)?;

        // Regroup [position][output] into [output][partition].
        let mut by_output: Vec<Vec<Option<Buffer>>> = (0..self.num_outputs())
            .map(|_| (0..mesh.num_devices()).map(|_| None).collect())
            .collect();
        for (position, list) in outputs.into_iter().enumerate() {
            for (output, buffer) in list.into_iter().enumerate() {
                by_output[output][partition_of_position[position]] = Some(buffer);
            }
        }
        by_output
            .into_iter()
            .zip(output_specs)
            .enumerate()
            .map(|(output, (buffers, spec))| {
                let buffers: Vec<Buffer> = buffers.into_iter().flatten().collect();
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
                let shape: Vec<usize> = shard_dims
                    .iter()
                    .enumerate()
                    .map(|(dim, &size)| size * spec.ways(dim, mesh))
                    .collect();
                ShardedArray::from_buffers(buffers, &shape, spec, mesh)
            })
            .collect()
    }
}
