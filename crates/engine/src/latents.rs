//! A dictionary's part on the devices: its tensors as the program takes them
//! ([`host_tensors`], replicated after the inputs) and a step's [`Latents`] copied back for one
//! process ([`Launched::latents`]; its results' partitioning is
//! `siphon_models::LatentsInfo::result_specs`). The program's encoder is
//! `siphon_models::dictionary::encoder`.

use siphon_models::{DType, DictionaryHook, HostTensor};
use siphon_runtime::{ElementType, HostArray, ShardedArray};

use crate::error::{EngineError, rt};
use crate::launched::Launched;

/// One dictionary's latents for a batch's rows: each token's largest, sparsely.
#[derive(Debug, Clone)]
pub struct Latents {
    /// `[rows, seq, cap]` s32: latent indices, largest first, `-1` past the token's firings.
    pub indices: HostArray,
    /// `[rows, seq, cap]` f32: their values, 0 past the firings.
    pub values: HostArray,
    /// `[rows, seq]` s32: each token's firings, which may exceed `cap` (what stores them refuses
    /// such a token: `siphon_store::kept_firings`).
    pub firings: HostArray,
}

/// Every dictionary's tensors in the program's order, f32, each with what it is (for errors).
pub(crate) fn host_tensors(
    dictionaries: &[DictionaryHook],
) -> impl Iterator<Item = (String, HostTensor<'static>)> + '_ {
    dictionaries.iter().flat_map(|d| {
        d.dictionary.tensors.iter().map(move |t| {
            let bytes: Vec<u8> = t.values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let what = format!("dictionary {}'s {}", d.dictionary.name, t.name);
            (what, HostTensor { dtype: DType::F32, shape: t.shape.clone(), data: bytes.into() })
        })
    })
}

impl Launched {
    /// Each dictionary's latents for process `process`'s rows, read from its partitions only
    /// (waiting for the copies), as the devices left them: a token's firings may exceed the
    /// latents kept (see [`Latents::firings`]): the store refuses those
    /// (`siphon_store::kept_firings`: the extraction's writer for the tokens it
    /// stores, `siphon forward` for every token).
    pub fn latents(&self, process: usize) -> Result<Vec<Latents>, EngineError> {
        let view = self.views.get(process).ok_or_else(|| EngineError::Batch(format!("no process {process}")))?;
        let (rows, from) = (view.rows(self.rows), view.partitions());
        let local: usize = rows.iter().map(|r| r.len()).sum();
        let outputs = &self.outputs[self.hooks.len()..];
        let mut all = Vec::with_capacity(self.dictionaries.len());
        for (d, parts) in self.dictionaries.iter().zip(outputs.chunks(3)) {
            let name = &d.dictionary.name;
            let read = |output: &ShardedArray, ty: ElementType| -> Result<HostArray, EngineError> {
                let context = || format!("copying dictionary {name}'s latents to the host");
                let shape: Vec<usize> = std::iter::once(local).chain(output.shape()[1..].iter().copied()).collect();
                let mut bytes = vec![0u8; shape.iter().product::<usize>() * ty.size_in_bytes()];
                rt(context, rt(context, output.rows_into(&rows, &from, &mut bytes))?.wait())?;
                rt(context, HostArray::from_bytes(ty, &shape, bytes))
            };
            all.push(Latents {
                indices: read(&parts[0], ElementType::S32)?,
                values: read(&parts[1], ElementType::F32)?,
                firings: read(&parts[2], ElementType::S32)?,
            });
        }
        Ok(all)
    }
}
