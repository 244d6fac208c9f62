//! The model's next-token outputs in the job (`--outputs`): the store's columns they are
//! ([`columns`]: f32, the ids i32, whatever the run's dtype) and each step's values as a
//! writer takes them ([`for_writer`]). Each token's next token is the one after it in its row
//! as the model reads the row (`siphon_engine::next_in_row`: a packed row's next document's
//! separator included, as the model predicts it there); a row's last real token has none, and
//! its `output.nll` is NaN. Any other value that is not finite stops the job, naming the
//! document and position, unless `--allow-non-finite`.

use anyhow::bail;
use bytes::Bytes;
use siphon_models::{DictionaryHook, NextToken};
use siphon_runtime::HostArray;
use siphon_store::{BatchOutput, OutputColumn, OutputDType};

/// The store's columns of `outputs` and of the splices of `dictionaries`
/// (`output.nll.spliced.<hook>`, …, f32 a token), in the program's result order.
pub fn columns(outputs: Option<NextToken>, dictionaries: &[DictionaryHook]) -> Vec<OutputColumn> {
    let Some(outputs) = outputs else { return Vec::new() };
    let spliced = siphon_models::forward::splice_output_names(dictionaries).into_iter().map(|name| OutputColumn {
        name,
        dtype: OutputDType::F32,
        shape: Vec::new(),
    });
    outputs
        .names()
        .into_iter()
        .map(|name| {
            let topk = name.starts_with("output.topk");
            OutputColumn {
                name: name.to_string(),
                dtype: if name == "output.topk_ids" { OutputDType::I32 } else { OutputDType::F32 },
                shape: if topk { vec![outputs.topk] } else { Vec::new() },
            }
        })
        .chain(spliced)
        .collect()
}

/// A member's outputs of `batch` as the store takes them: the batch's own rows (a short last
/// batch's filler rows dropped), each checked over the tokens the run keeps.
pub fn for_writer(
    columns: &[OutputColumn],
    batch: &siphon_data::Batch,
    results: Vec<(String, HostArray)>,
    allow_non_finite: bool,
) -> anyhow::Result<Vec<BatchOutput>> {
    let tokens = batch.len() * batch.seq_len;
    // Each token's next token in its row (−1: none), where an NLL may be NaN.
    let ids: Vec<i32> = batch.tokens.iter().map(|&t| t as i32).collect();
    let mask: Vec<i32> = batch.attention_mask.iter().map(|&m| i32::from(m)).collect();
    let next = siphon_engine::next_in_row(&ids, &mask, batch.seq_len);
    let mut outputs = Vec::with_capacity(columns.len());
    for (column, (name, array)) in columns.iter().zip(results) {
        debug_assert_eq!(column.name, name);
        let data = Bytes::from(array.into_bytes()).slice(..tokens * column.row_bytes());
        if column.dtype == OutputDType::F32 && !allow_non_finite {
            check_finite(column, batch, &next, &data)?;
        }
        outputs.push(BatchOutput { name: column.name.clone(), data });
    }
    Ok(outputs)
}

/// Refuses a value of `column` that is NaN or ±Inf at a kept token, but an NLL's where the
/// token has no next token in its row (`next` −1).
fn check_finite(column: &OutputColumn, batch: &siphon_data::Batch, next: &[i32], data: &[u8]) -> anyhow::Result<()> {
    let nll = crate::args::outputs::is_nll(&column.name);
    let row_bytes = column.row_bytes();
    for (t, row) in data.chunks_exact(row_bytes).enumerate() {
        if batch.exclude[t] != 0 || (nll && next[t] == -1) {
            continue;
        }
        let finite = row.chunks_exact(4).all(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]).is_finite());
        if !finite {
            bail!(
                "{} is NaN or ±Inf at document {} position {} (row {} of the batch, token {}): the model's weights \
                 or config give it there (--allow-non-finite stores it)",
                column.name,
                batch.doc[t],
                batch.doc_pos[t],
                t / batch.seq_len,
                t % batch.seq_len
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_output_is_a_column_of_its_own_dtype_and_shape() {
        let all = NextToken { nll: true, entropy: true, topk: 7, chunk: None };
        let columns = columns(Some(all), &[]);
        let described: Vec<(&str, OutputDType, &[usize])> =
            columns.iter().map(|c| (c.name.as_str(), c.dtype, c.shape.as_slice())).collect();
        assert_eq!(
            described,
            [
                ("output.nll", OutputDType::F32, &[][..]),
                ("output.entropy", OutputDType::F32, &[][..]),
                ("output.topk_logprobs", OutputDType::F32, &[7][..]),
                ("output.topk_ids", OutputDType::I32, &[7][..]),
            ]
        );
        assert!(super::columns(None, &[]).is_empty());
    }

    /// One row of 4 tokens: BOS (excluded), two words, padding. Only the second word has no
    /// next token; an NLL may be NaN there (and at excluded tokens), nothing else may.
    fn batch() -> siphon_data::Batch {
        siphon_data::Batch {
            index: 0,
            seq_len: 4,
            ids: vec![siphon_data::SeqId { unit: 0, index: 0 }],
            tokens: vec![1, 6, 7, 0],
            attention_mask: vec![1, 1, 1, 0],
            exclude: vec![1, 0, 0, 1],
            doc: vec![-1, 3, 3, -1],
            doc_pos: vec![-1, 0, 1, -1],
            role: vec![0; 4],
            cut: vec![0],
            position: siphon_data::Position { batches: 1, sequences: 1, ..Default::default() },
        }
    }

    fn written(name: &str, values: [f32; 4]) -> anyhow::Result<Vec<BatchOutput>> {
        let column = OutputColumn { name: name.into(), dtype: OutputDType::F32, shape: Vec::new() };
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let array = HostArray::from_bytes(siphon_runtime::ElementType::F32, &[1, 4], bytes).unwrap();
        for_writer(&[column], &batch(), vec![(name.to_string(), array)], false)
    }

    #[test]
    fn an_nll_is_nan_only_where_a_kept_token_has_no_next_token() {
        let nan = f32::NAN;
        for name in ["output.nll", "output.nll.spliced.blocks.0.hook_resid_post"] {
            written(name, [nan, 1.5, nan, nan]).unwrap();
            let err = written(name, [0.0, nan, 2.0, 0.0]).unwrap_err().to_string();
            assert!(err.contains(&format!("{name} is NaN or ±Inf at document 3 position 0")), "{err}");
        }
        let err = written("output.entropy", [0.0, 1.0, nan, 0.0]).unwrap_err().to_string();
        assert!(err.contains("output.entropy is NaN or ±Inf at document 3 position 1"), "{err}");
        written("output.entropy", [nan, 1.0, 2.0, f32::INFINITY]).unwrap();
    }
}
