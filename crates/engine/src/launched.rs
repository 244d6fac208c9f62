//! A batch's run in flight: [`Launched`] holds the device buffers until its activations
//! are downloaded into the caller's host buffers.

use siphon_mesh::HostView;
use siphon_models::{HookPoint, Latents};
use siphon_runtime::{Download, ElementType, HostArray, ShardedArray};

use crate::error::{EngineError, rt};

/// One step launched on the devices ([`Engine::launch`](crate::Engine::launch)): the program's outputs, until each
/// process's rows are copied to the host.
pub struct Launched {
    pub(crate) outputs: Vec<ShardedArray>,
    pub(crate) hooks: Vec<HookPoint>,
    /// How many results the dictionaries' latents take, after the hooks'.
    pub(crate) latent_results: usize,
    /// The next-token results' names, after the latents'.
    pub(crate) next_token: Vec<String>,
    pub(crate) views: Vec<HostView>,
    /// Rows of the global batch.
    pub(crate) rows: usize,
    pub(crate) element_type: ElementType,
}

impl Launched {
    /// Waits until the program has computed every output (the step's device time, when
    /// called right after launching).
    pub fn wait(&self) -> Result<(), EngineError> {
        for (i, output) in self.outputs.iter().enumerate() {
            let what = || match (self.hooks.get(i), i.checked_sub(self.hooks.len() + self.latent_results)) {
                (Some(hook), _) => format!("computing {hook}"),
                (None, Some(j)) => format!("computing {}", self.next_token[j]),
                (None, None) => "computing the dictionaries' latents".to_string(),
            };
            for buffer in output.buffers() {
                rt(what, buffer.wait_ready())?;
            }
        }
        Ok(())
    }

    /// The element type of every output.
    pub fn element_type(&self) -> ElementType {
        self.element_type
    }

    /// Each hook's shape for process `process`'s rows: `[rows, seq, *per-token shape]`.
    pub fn shapes(&self, process: usize) -> Vec<Vec<usize>> {
        let rows: usize = self.views[process].rows(self.rows).iter().map(|r| r.len()).sum();
        self.outputs[..self.hooks.len()].iter().map(|o| local_shape(o, rows)).collect()
    }

    /// Each hook's bytes for process `process`'s rows: the destinations [`Launched::copy_into`]
    /// takes.
    pub fn sizes(&self, process: usize) -> Vec<usize> {
        let size = self.element_type.size_in_bytes();
        self.shapes(process).iter().map(|s| s.iter().product::<usize>() * size).collect()
    }

    /// Starts copying process `process`'s rows of every hook, read from its partitions only,
    /// each into its destination of `dsts` (hook order, [`Launched::sizes`] bytes each).
    pub fn copy_into<'a>(
        &self,
        process: usize,
        dsts: impl IntoIterator<Item = &'a mut [u8]>,
    ) -> Result<Download<'a>, EngineError> {
        let view = self.views.get(process).ok_or_else(|| EngineError::Batch(format!("no process {process}")))?;
        let (rows, from) = (view.rows(self.rows), view.partitions());
        let mut dsts = dsts.into_iter();
        let mut download: Option<Download<'a>> = None;
        for (hook, output) in self.hooks.iter().zip(&self.outputs) {
            let dst = dsts.next().ok_or_else(|| EngineError::Batch(format!("no destination for {hook}")))?;
            let started = rt(|| format!("copying {hook} to the host"), output.rows_into(&rows, &from, dst))?;
            download = Some(match download {
                None => started,
                Some(d) => d.join(started),
            });
        }
        Ok(download.unwrap_or_else(Download::done))
    }

    /// Each dictionary's latents for process `process`'s rows (the program's results after the
    /// hooks', [`Latents::of_results`]), copied from its partitions only straight into host
    /// arrays (as [`Launched::copy_into`] copies the hooks), waiting for the copies,
    /// as the devices left them: a token's firings may exceed the latents kept (see
    /// [`Latents::firings`]): the store refuses those (`siphon_store::kept_firings`: the
    /// extraction's writer for the tokens it stores, `siphon forward` for every token).
    pub fn latents(&self, process: usize) -> Result<Vec<Latents<HostArray>>, EngineError> {
        let first = self.hooks.len();
        let context = || "copying the dictionaries' latents to the host".to_string();
        let results = self.read(process, first..first + self.latent_results, context)?;
        let n = results.len();
        Latents::of_results(results).ok_or_else(|| EngineError::Batch(format!("{n} results after the hooks'")))
    }

    /// The next-token outputs for process `process`'s rows (the program's results after the
    /// latents', `siphon_models::NextToken::names`' order), copied as [`Launched::latents`]
    /// copies them.
    pub fn next_token(&self, process: usize) -> Result<Vec<(String, HostArray)>, EngineError> {
        let first = self.hooks.len() + self.latent_results;
        let context = || "copying the next-token outputs to the host".to_string();
        let results = self.read(process, first..self.outputs.len(), context)?;
        Ok(self.next_token.iter().cloned().zip(results).collect())
    }

    /// The results `range`, process `process`'s rows of each, read from its partitions only
    /// into host arrays, waiting for the copies.
    fn read(
        &self,
        process: usize,
        range: std::ops::Range<usize>,
        context: impl Fn() -> String + Copy,
    ) -> Result<Vec<HostArray>, EngineError> {
        let view = self.views.get(process).ok_or_else(|| EngineError::Batch(format!("no process {process}")))?;
        let (rows, from) = (view.rows(self.rows), view.partitions());
        let local: usize = rows.iter().map(|r| r.len()).sum();
        let read = |output: &ShardedArray| -> Result<HostArray, EngineError> {
            let ty = output.element_type();
            let shape = local_shape(output, local);
            let mut bytes = vec![0u8; shape.iter().product::<usize>() * ty.size_in_bytes()];
            rt(context, rt(context, output.rows_into(&rows, &from, &mut bytes))?.wait())?;
            rt(context, HostArray::from_bytes(ty, &shape, bytes))
        };
        self.outputs[range].iter().map(read).collect()
    }
}

/// `output`'s shape for `rows` of its first dimension (a process's rows).
fn local_shape(output: &ShardedArray, rows: usize) -> Vec<usize> {
    std::iter::once(rows).chain(output.shape()[1..].iter().copied()).collect()
}
