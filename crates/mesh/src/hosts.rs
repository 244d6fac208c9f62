//! How a mesh over several processes' devices divides among them (issue 24's spanning mesh):
//! each process runs the partitions whose devices it owns, feeds the rows of the batch those
//! partitions' `data` coordinates select, and reads back only its partitions. Processes that
//! hold the same `data` coordinates form a data group: they read the same slice of the corpus,
//! and each row's activations are written once, by the lowest process of its group.
//!
//! Pure index math, like the rest of the crate: the engine and the job's data path ask it, and
//! the tests check that the processes' views together cover every partition and every row once.

use std::ops::Range;

use crate::{Mesh, MeshError};

/// One process's view of a mesh whose partitions are owned by several processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostView {
    mesh: Mesh,
    /// The process owning each partition.
    owners: Vec<usize>,
    process: usize,
}

impl HostView {
    /// `process`'s view of `mesh`, whose partition `i` runs on a device of process
    /// `owners[i]`.
    pub fn new(mesh: &Mesh, owners: Vec<usize>, process: usize) -> Result<HostView, MeshError> {
        if owners.len() != mesh.num_devices() {
            return Err(MeshError::Hosts(format!(
                "{} partition owners for a mesh of {} devices",
                owners.len(),
                mesh.num_devices()
            )));
        }
        if !owners.contains(&process) {
            return Err(MeshError::Hosts(format!("process {process} owns no device of mesh {mesh}")));
        }
        Ok(HostView { mesh: mesh.clone(), owners, process })
    }

    /// The view of process `process` when `processes` processes each own `mesh.num_devices() /
    /// processes` consecutive partitions (device ids numbered host by host, as a multi-host
    /// PJRT client numbers them).
    pub fn contiguous(mesh: &Mesh, processes: usize, process: usize) -> Result<HostView, MeshError> {
        let n = mesh.num_devices();
        if processes == 0 || !n.is_multiple_of(processes) {
            return Err(MeshError::Hosts(format!("{n} devices do not divide over {processes} processes")));
        }
        HostView::new(mesh, (0..n).map(|i| i / (n / processes)).collect(), process)
    }

    /// The partitions this process runs, in partition order.
    pub fn partitions(&self) -> Vec<usize> {
        (0..self.owners.len()).filter(|&i| self.owners[i] == self.process).collect()
    }

    /// Partition `partition`'s coordinate on the `data` axis (0 without one).
    pub fn data_index(&self, partition: usize) -> usize {
        match self.mesh.axes.iter().position(|a| a.name == "data") {
            Some(axis) => self.mesh.coords(partition)[axis],
            None => 0,
        }
    }

    /// The `data` coordinates this process's partitions hold, ascending: its data groups.
    pub fn data_indices(&self) -> Vec<usize> {
        let mut out: Vec<usize> = self.partitions().into_iter().map(|p| self.data_index(p)).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The rows of a global batch of `batch` rows this process feeds, one range per data
    /// group it holds (the batch splits evenly over `data`).
    pub fn rows(&self, batch: usize) -> Vec<Range<usize>> {
        let groups = self.mesh.axis_size_or_one("data");
        let per = batch / groups;
        self.data_indices().into_iter().map(|d| d * per..(d + 1) * per).collect()
    }

    /// This process's reader and the number of readers: processes holding the same data
    /// groups read the same slice of the corpus together, so the corpus is partitioned over
    /// the distinct sets of data groups that processes hold (a process holding whole groups
    /// reads alone; processes sharing a group read its slice together). Sets that overlap
    /// without being equal cannot share a reader and are an error.
    pub fn reader(&self) -> Result<(usize, usize), MeshError> {
        let readers = self.readers()?;
        let count = readers.iter().max().map_or(0, |&r| r + 1);
        Ok((readers[self.process], count))
    }

    /// Every process's reader (see [`HostView::reader`]), by process.
    pub fn readers(&self) -> Result<Vec<usize>, MeshError> {
        let processes = self.owners.iter().max().map_or(0, |&p| p + 1);
        let held: Vec<Vec<usize>> = (0..processes)
            .map(|process| {
                let mut set: Vec<usize> =
                    (0..self.owners.len()).filter(|&p| self.owners[p] == process).map(|p| self.data_index(p)).collect();
                set.sort_unstable();
                set.dedup();
                set
            })
            .collect();
        let mut sets: Vec<&Vec<usize>> = held.iter().filter(|s| !s.is_empty()).collect();
        sets.sort_unstable();
        sets.dedup();
        for (i, set) in sets.iter().enumerate() {
            if let Some(other) = sets[i + 1..].iter().find(|s| s.iter().any(|d| set.contains(d))) {
                return Err(MeshError::Hosts(format!(
                    "a process holds data groups {set:?}, overlapping another process's {other:?}: \
                     processes must hold the same data groups or none in common"
                )));
            }
        }
        Ok(held.iter().map(|s| sets.iter().position(|x| *x == s).unwrap_or(usize::MAX)).collect())
    }

    /// Whether this process writes the activations its reader's rows give: the lowest
    /// process holding its data groups does.
    pub fn writer(&self) -> bool {
        self.data_indices().first().is_some_and(|&d| self.writes(d))
    }

    /// The rows of the global batch when each reader feeds `rows` rows (this process's
    /// share): every data group gets the same number of rows.
    pub fn global_batch(&self, rows: usize) -> Result<usize, MeshError> {
        let held = self.data_indices().len();
        if !rows.is_multiple_of(held) {
            return Err(MeshError::Hosts(format!(
                "a batch of {rows} rows does not split over the {held} data groups process {} holds",
                self.process
            )));
        }
        Ok(rows / held * self.mesh.axis_size_or_one("data"))
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The process this view is of.
    pub fn process(&self) -> usize {
        self.process
    }

    /// Whether this process's partitions are the whole mesh.
    pub fn is_whole(&self) -> bool {
        self.owners.iter().all(|&o| o == self.process)
    }

    /// Whether this process writes the activations of data group `data_index`: the lowest
    /// process holding it does, so each row is written once.
    pub fn writes(&self, data_index: usize) -> bool {
        let lowest = (0..self.owners.len()).filter(|&p| self.data_index(p) == data_index).map(|p| self.owners[p]).min();
        lowest == Some(self.process)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list of one range of rows.
    fn one(rows: Range<usize>) -> Vec<Range<usize>> {
        vec![rows]
    }

    /// Every process's partitions, rows and writes over `mesh` on `processes` processes.
    fn views(mesh: &Mesh, processes: usize) -> Vec<HostView> {
        (0..processes).map(|p| HostView::contiguous(mesh, processes, p).unwrap()).collect()
    }

    /// The partitions are covered once, and every row of a batch of 8 is fed by the processes
    /// of its data group and written by exactly one of them.
    fn check_cover(mesh: &Mesh, processes: usize) {
        let views = views(mesh, processes);
        let mut partitions: Vec<usize> = views.iter().flat_map(|v| v.partitions()).collect();
        partitions.sort_unstable();
        assert_eq!(partitions, (0..mesh.num_devices()).collect::<Vec<_>>());
        let batch = 8;
        let mut written = vec![0; batch];
        for v in &views {
            for (d, rows) in v.data_indices().into_iter().zip(v.rows(batch)) {
                if v.writes(d) {
                    rows.for_each(|r| written[r] += 1);
                }
            }
        }
        assert_eq!(written, vec![1; batch], "{mesh} on {processes} processes");
    }

    #[test]
    fn spanning_layouts_cover_every_partition_and_write_every_row_once() {
        let ids = || (0..8).collect();
        // 1d: all 8 devices on `model`, one data group over 2 or 4 hosts.
        let one_d = Mesh::new(&[("data", 1), ("model", 8)], ids()).unwrap();
        // 2d: data=2 × model=4 — with 2 hosts each host is a data group; with 4 hosts two
        // hosts share each data group.
        let two_d = Mesh::new(&[("data", 2), ("model", 4)], ids()).unwrap();
        // 3d: data=2 × fsdp=2 × model=2.
        let three_d = Mesh::new(&[("data", 2), ("fsdp", 2), ("model", 2)], ids()).unwrap();
        for mesh in [&one_d, &two_d, &three_d] {
            for processes in [2, 4] {
                check_cover(mesh, processes);
            }
        }
        // 4 hosts on data=2 × model=4: hosts 0-1 feed rows 0..4 (host 0 writes them), hosts 2-3
        // rows 4..8 (host 2 writes them).
        let v = views(&two_d, 4);
        assert_eq!((v[1].partitions(), v[1].writes(0)), (vec![2, 3], false));
        assert_eq!(v[1].rows(8), one(0..4));
        assert_eq!(v[2].rows(8), one(4..8));
        assert!(v[2].writes(1));
        // 1d: every host feeds the whole batch; host 0 writes it.
        let v = views(&one_d, 2);
        assert_eq!(v[1].rows(8), one(0..8));
        assert!(v[0].writes(0) && !v[1].writes(0));
        // Readers: each host of the 2d layout on 2 hosts reads alone; on 4 hosts, hosts 0-1 read
        // one slice and 2-3 the other; the 1d layout has one reader.
        assert_eq!(views(&two_d, 2).iter().map(|v| v.reader().unwrap()).collect::<Vec<_>>(), [(0, 2), (1, 2)]);
        let readers: Vec<_> = views(&two_d, 4).iter().map(|v| v.reader().unwrap()).collect();
        assert_eq!(readers, [(0, 2), (0, 2), (1, 2), (1, 2)]);
        assert_eq!(views(&two_d, 4).iter().map(HostView::writer).collect::<Vec<_>>(), [true, false, true, false]);
        assert_eq!(views(&one_d, 4)[3].reader().unwrap(), (0, 1));
        // Each reader feeds 4 rows: 8 in all on data=2 whether a host holds one group or both.
        assert_eq!(views(&two_d, 2)[1].global_batch(4).unwrap(), 8);
        assert_eq!(views(&two_d, 4)[3].global_batch(4).unwrap(), 8);
        assert_eq!(views(&one_d, 2)[0].global_batch(4).unwrap(), 4);
        // One host holding both data groups feeds and writes both.
        let v = HostView::new(&two_d, vec![0; 8], 0).unwrap();
        assert_eq!(v.rows(8), [0..4, 4..8]);
        assert!(v.writes(0) && v.writes(1));
    }

    #[test]
    fn bad_ownership_is_an_error() {
        let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
        assert!(HostView::contiguous(&mesh, 3, 0).is_err());
        assert!(HostView::new(&mesh, vec![0; 7], 0).is_err());
        assert!(HostView::new(&mesh, vec![0; 8], 1).is_err());
        // Process 1 holds data groups 0 and 1, process 0 only group 0.
        let v = HostView::new(&mesh, vec![0, 0, 0, 1, 1, 1, 1, 1], 0).unwrap();
        assert!(v.reader().unwrap_err().to_string().contains("overlapping"));
        let whole = HostView::new(&mesh, vec![0; 8], 0).unwrap();
        assert!(whole.global_batch(3).is_err() && whole.is_whole());
    }
}
