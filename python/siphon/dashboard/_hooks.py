"""The run's per-hook statistics (stats.json's ``"hooks"``) for the dashboard's index: per
dimension (the hook's per-token shape flattened row-major) mean, variance, min and max, and the
dimensions whose scale stands out ("massive activations": ``|mean|`` or ``max(|min|, |max|)``
above `FACTOR` times its median over the hook's dimensions, or not finite).

stats.json writes a statistic that is not finite (a run written with ``--allow-non-finite``) as
``null`` (files of earlier siphons: the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``);
``min`` and ``max`` are absent in files written before siphon kept them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from ..errors import DatasetError

#: How many times its median over the dimensions a dimension's scale must exceed to be listed.
FACTOR = 10.0


@dataclass
class HookSummary:
    """One hook's statistics (float64 arrays, one entry per dimension; `min`/`max` ``None``
    where stats.json lacks them) and its `massive` dimensions, ascending."""

    name: str
    shape: List[int]
    count: int
    mean_norm: float
    mean: np.ndarray
    variance: np.ndarray
    min: Optional[np.ndarray]
    max: Optional[np.ndarray]
    massive: np.ndarray

    def dimension(self, d: int) -> Dict[str, Any]:
        """Dimension `d`: its index in the per-token shape and its statistics."""
        index = [int(i) for i in np.unravel_index(d, self.shape)] if self.shape else [d]
        return {
            "dim": d, "index": index, "mean": float(self.mean[d]), "variance": float(self.variance[d]),
            "min": None if self.min is None else float(self.min[d]),
            "max": None if self.max is None else float(self.max[d]),
        }


def read_stats(dataset: Any) -> Optional[Dict[str, Any]]:
    """The run's stats.json, parsed; ``None`` when the run has none yet."""
    raw = dataset._location.read("stats.json")
    if raw is None:
        return None
    try:
        stats: Dict[str, Any] = json.loads(raw)
    except ValueError as e:
        raise DatasetError(f"{dataset.url}/stats.json: not valid JSON: {e}") from e
    return stats


def _floats(values: Any, where: str) -> np.ndarray:
    """A JSON list of numbers (or "NaN", "Infinity", "-Infinity", null) as float64."""
    if not isinstance(values, list):
        raise DatasetError(f"{where}: expected a list of numbers")
    try:
        return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise DatasetError(f"{where}: {e}") from e


def massive_dimensions(mean: np.ndarray, low: Optional[np.ndarray], high: Optional[np.ndarray],
                       factor: float = FACTOR) -> np.ndarray:
    """The dimensions whose ``|mean|``, or ``max(|min|, |max|)`` where known, exceeds `factor`
    times its median over the dimensions, or is not finite (left out of the medians)."""
    scales = [np.abs(mean)]
    if low is not None and high is not None:
        scales.append(np.maximum(np.abs(low), np.abs(high)))
    out = np.zeros(len(mean), dtype=bool)
    for scale in scales:
        finite = scale[np.isfinite(scale)]
        if len(finite):
            out |= scale > factor * float(np.median(finite))
        out |= ~np.isfinite(scale)
    return np.flatnonzero(out)


def hook_summaries(stats: Optional[Mapping[str, Any]], hooks: Mapping[str, Any]) -> List[HookSummary]:
    """The statistics of the run's `hooks` (name -> `siphon.dataset.HookInfo`) that stats.json
    holds, in the run's order."""
    entries = (stats or {}).get("hooks") or {}
    out = []
    for name, info in hooks.items():
        entry = entries.get(name)
        if not isinstance(entry, dict):
            continue
        where = f"stats.json hooks[{name!r}]"
        try:
            mean = _floats(entry["mean"], where + ".mean")
            variance = _floats(entry["variance"], where + ".variance")
            low = _floats(entry["min"], where + ".min") if entry.get("min") is not None else None
            high = _floats(entry["max"], where + ".max") if entry.get("max") is not None else None
            count = int(entry["count"])
            norm = entry.get("mean_norm")
            mean_norm = float("nan") if norm is None else float(norm)
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{where}: malformed: {e!r}") from e
        if low is None or high is None or len(low) != len(mean) or len(high) != len(mean):
            low = high = None
        if len(variance) != len(mean):
            raise DatasetError(f"{where}: mean has {len(mean)} entries, variance {len(variance)}")
        shape = [int(s) for s in (entry.get("shape") or list(getattr(info, "shape", ())) or [len(mean)])]
        if int(np.prod(shape)) != len(mean):
            shape = [len(mean)]
        out.append(HookSummary(name, shape, count, mean_norm, mean, variance, low, high,
                               massive_dimensions(mean, low, high)))
    return out
