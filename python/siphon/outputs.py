"""The model's own outputs stored per token (``siphon extract --outputs nll,entropy,topk=K``).

run.json's ``"outputs"`` lists them; every shard holds each as a dense tensor over the shard's
token rows, whatever the run's stored dtype:

- ``output.nll`` float32 ``[tokens]``: −log p of the token that follows in the row, NaN at a
  row's last token (no next token there);
- ``output.entropy`` float32 ``[tokens]``: the next-token distribution's entropy (nats);
- ``output.topk_logprobs`` float32 ``[tokens, K]`` and ``output.topk_ids`` int32
  ``[tokens, K]``: the K likeliest next tokens, likeliest first.

With dictionaries spliced in (``--sae DIR --splice``), per token and dictionary also
``output.nll.spliced.<hook>[.<dictionary>]``, ``output.kl.spliced.…``, ``output.sq_error.spliced.…``
and per hook ``output.nll.ablated.<hook>``, ``output.kl.ablated.<hook>`` (float32 ``[tokens]``).

`Dataset.outputs` names them (`OutputInfo`); ``Dataset.batches(..., outputs=[...])`` and
``Dataset.read(..., outputs=[...])`` return them beside the hooks for the same tokens, as
stored; `Dataset.output_stats` gives stats.json's per-element counts and means (the mean NLL
is the cross-entropy over the tokens that have a next token); `Dataset.splice_metrics` each
spliced dictionary's SAELens ``run_evals`` metrics over the run (`splice_metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .errors import DatasetError

#: run.json's dtype names, as numpy's and the safetensors header's.
DTYPES = {"f32": ("float32", "F32"), "i32": ("int32", "I32")}


@dataclass(frozen=True)
class OutputInfo:
    """One output column: its name, numpy dtype (``"float32"`` or ``"int32"``) and one token's
    shape (``()`` or ``(K,)``)."""

    name: str
    dtype: str
    shape: Tuple[int, ...]

    @property
    def header_dtype(self) -> str:
        """Its dtype as a safetensors header writes it."""
        return "F32" if self.dtype == "float32" else "I32"


def parse_outputs(run: Mapping[str, Any], where: str) -> Dict[str, OutputInfo]:
    """run.json's ``"outputs"`` (absent: none) as `OutputInfo` by name."""
    entries = run.get("outputs") or []
    if not isinstance(entries, list):
        raise DatasetError(f"{where}/run.json: \"outputs\" is not a list")
    out: Dict[str, OutputInfo] = {}
    for i, entry in enumerate(entries):
        try:
            dtype = DTYPES[str(entry["dtype"])][0]
            info = OutputInfo(str(entry["name"]), dtype, tuple(int(d) for d in entry.get("shape", [])))
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{where}/run.json: outputs[{i}] is not an output column: {e!r}") from e
        out[info.name] = info
    return out


def checked_outputs(names: Optional[Sequence[str]], available: Mapping[str, OutputInfo]) -> List[str]:
    """`names` (a name, names, or ``None`` for none) as a list of the run's outputs, each once;
    otherwise an error naming what is wrong."""
    if names is None:
        return []
    if isinstance(names, str):
        names = [names]
    names = list(names)
    for name in names:
        if name not in available:
            have = ", ".join(available) or "none (extract with --outputs)"
            raise DatasetError(f"unknown output {name!r}: this run's outputs are {have}")
    if len(set(names)) != len(names):
        raise DatasetError(f"outputs {names} name an output twice")
    return names


def header_problems(where: str, tensors: Mapping[str, Any], info: OutputInfo, tokens: int) -> List[str]:
    """What is wrong with a shard header's tensor of output `info`."""
    t = tensors.get(info.name)
    expected = (tokens,) + info.shape
    if t is None:
        return [f"{where}: no tensor for output {info.name}"]
    if t.dtype != info.header_dtype or t.shape != expected:
        return [f"{where}: output {info.name} is {t.dtype} {list(t.shape)}, expected {info.header_dtype} {list(expected)}"]
    return []


def output_stats(stats: Mapping[str, Any], name: str) -> Dict[str, Any]:
    """stats.json's statistics of output `name`: ``count`` (tokens counted) and, for a float
    output, per element ``defined`` (finite values), ``sum``, ``mean`` (of the finite values),
    ``min`` and ``max``, numpy arrays."""
    entry = (stats.get("outputs") or {}).get(name)
    if entry is None:
        raise DatasetError(f"stats.json has no statistics of output {name}")
    out: Dict[str, Any] = {"count": int(entry["count"])}
    if entry.get("sum"):

        def as_float(key: str) -> np.ndarray:
            return np.asarray([np.nan if v is None else v for v in entry[key]], dtype=np.float64)

        defined = np.asarray(entry["defined"], dtype=np.int64)
        total = as_float("sum")
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(defined > 0, total / np.maximum(defined, 1), np.nan)
        out.update(defined=defined, sum=total, mean=mean, min=as_float("min"), max=as_float("max"))
    return out


def splice_metrics(stats: Mapping[str, Any]) -> Dict[str, Dict[str, float]]:
    """Each spliced dictionary's SAELens ``run_evals`` metrics from stats.json, by the name its
    outputs carry (``<hook>[.<dictionary>]``): ``ce_clean``, ``ce_spliced``, ``ce_ablated`` (mean
    NLLs over the tokens with a next token), ``ce_loss_score`` = (ablated − spliced) / (ablated −
    clean), ``kl_spliced``, ``kl_ablated`` (mean KLs over every counted token), ``kl_div_score``
    = (kl_ablated − kl_spliced) / kl_ablated, ``mean_squared_error`` (of the reconstruction) and,
    where the hook itself is stored, ``fvu`` (that over the hook's total variance per token;
    SAELens's explained variance is 1 − fvu)."""
    outputs = stats.get("outputs") or {}

    def mean(name: str) -> float:
        entry = outputs[name]
        return float(entry["sum"][0]) / max(int(entry["defined"][0]), 1)

    ablated = [n[len("output.nll.ablated."):] for n in outputs if n.startswith("output.nll.ablated.")]
    out: Dict[str, Dict[str, float]] = {}
    for name in outputs:
        if not name.startswith("output.nll.spliced."):
            continue
        spliced = name[len("output.nll.spliced."):]
        hooks = [h for h in ablated if spliced == h or spliced.startswith(h + ".")]
        if not hooks:
            continue
        hook = hooks[0]
        m = {
            "ce_clean": mean("output.nll"),
            "ce_spliced": mean(name),
            "ce_ablated": mean(f"output.nll.ablated.{hook}"),
            "kl_spliced": mean(f"output.kl.spliced.{spliced}"),
            "kl_ablated": mean(f"output.kl.ablated.{hook}"),
            "mean_squared_error": mean(f"output.sq_error.spliced.{spliced}"),
        }
        m["ce_loss_score"] = (m["ce_ablated"] - m["ce_spliced"]) / (m["ce_ablated"] - m["ce_clean"])
        m["kl_div_score"] = (m["kl_ablated"] - m["kl_spliced"]) / m["kl_ablated"]
        variance = ((stats.get("hooks") or {}).get(hook) or {}).get("variance")
        if variance:
            m["fvu"] = m["mean_squared_error"] / float(sum(v for v in variance if v is not None))
        out[spliced] = m
    return out
