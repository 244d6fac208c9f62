//! `--outputs`: the model's next-token outputs a command computes on the devices
//! (`siphon_models::NextToken`), as `nll,entropy,topk=K` (any subset, any order).

use anyhow::{Context, bail};
use siphon_models::NextToken;

/// The most log-probabilities `topk=K` keeps per token (vLLM's `max_logprobs` is 20; a
/// teacher's top-k for distillation rarely passes a few hundred).
pub const MAX_TOPK: usize = 1024;

/// `nll,entropy,topk=K` as the outputs it names; each name at most once.
pub fn parse(text: &str) -> anyhow::Result<NextToken> {
    let mut outputs = NextToken::default();
    let mut seen = Vec::new();
    for part in text.split(',').map(str::trim) {
        let (name, value) = part.split_once('=').map_or((part, None), |(n, v)| (n.trim(), Some(v.trim())));
        if seen.contains(&name) {
            bail!("--outputs {text:?} names {name} twice");
        }
        seen.push(name);
        match (name, value) {
            ("nll", None) => outputs.nll = true,
            ("entropy", None) => outputs.entropy = true,
            ("topk", Some(k)) => {
                outputs.topk = k
                    .parse::<usize>()
                    .ok()
                    .filter(|k| (1..=MAX_TOPK).contains(k))
                    .with_context(|| format!("--outputs {text:?}: topk={k} is not a count in 1..={MAX_TOPK}"))?;
            }
            ("topk", None) => bail!("--outputs {text:?}: topk needs its count, as topk=5"),
            _ => bail!("--outputs {text:?}: {part:?} is not an output (nll, entropy, topk=K)"),
        }
    }
    Ok(outputs)
}

/// Whether output `name` is an NLL (the clean stream's, or a spliced or ablated one's), NaN
/// where a token has no next token.
pub fn is_nll(name: &str) -> bool {
    name == "output.nll" || name.starts_with("output.nll.")
}

/// Refuses outputs `config`'s model cannot give: a top-k past its vocabulary.
pub fn check(outputs: &NextToken, config: &siphon_models::ModelConfig) -> anyhow::Result<()> {
    if outputs.topk > config.vocab_size {
        bail!("--outputs topk={}: more than the model's vocabulary of {} tokens", outputs.topk, config.vocab_size);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_parse_by_name_and_refuse_the_rest_naming_it() {
        let all = parse("entropy, nll,topk=5").unwrap();
        assert_eq!(all, NextToken { nll: true, entropy: true, topk: 5, chunk: None });
        assert_eq!(parse("nll").unwrap(), NextToken { nll: true, ..NextToken::default() });
        for (bad, named) in [
            ("nll,nll", "names nll twice"),
            ("topk", "needs its count"),
            ("topk=0", "topk=0 is not a count in 1..=1024"),
            ("topk=1025", "1..=1024"),
            ("topk=-1", "topk=-1"),
            ("logits", "\"logits\" is not an output"),
            ("nll=1", "\"nll=1\" is not an output"),
            ("", "\"\" is not an output"),
        ] {
            let err = format!("{:#}", parse(bad).unwrap_err());
            assert!(err.contains(named), "{bad}: {err}");
        }
    }
}
