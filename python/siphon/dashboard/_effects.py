"""A latents column's effects on the model's outputs and its nearest latents, as siphon's Rust
binary writes them to an effects directory (every part optional)::

    EFFECTS/vocab.json                 a JSON list of token strings indexed by token id
    EFFECTS/{column}.safetensors       per latents column (``{column}``: its name in run.json):
        logits_top_ids        int32   [width, k]  the tokens whose logits the latent's decoder
        logits_top_values     float32 [width, k]    direction raises most, largest first
        logits_bottom_ids     int32   [width, k]  ... and lowers most,
        logits_bottom_values  float32 [width, k]    most negative first
        logits_hist_heights   int32   [width, bins]  the histogram of its logit effects over the
        logits_hist_range     float32 [width, 2]     vocabulary: counts of equal bins between
                                                     the smallest and largest (torch.histc's)
        neighbours_ids        int32   [width, n]  the latents nearest by decoder cosine,
        neighbours_cosine     float32 [width, n]    largest first, the latent itself excluded
        alignment_ids         int32   [width, n]  the largest entries of the unit decoder row,
        alignment_values      float32 [width, n]    largest first (SAEDashboard's neuron
        alignment_l1          float32 [width, n]    alignment), each's share of the row's L1
    EFFECTS/pieces.json                the tokenizer's pieces by token id (``Ġthe``; null: none)

A safetensors file is an 8-byte little-endian header length, a JSON header naming each
tensor's ``dtype``, ``shape`` and ``data_offsets`` (relative to the end of the header), then the
raw little-endian data (read here without the safetensors library). A column without a file has
no effects; a file may hold the logits without the neighbours or the other way round (each
pair is read when both of its tensors are there). A directory with only ``vocab.json`` gives
token strings to the pages.

``siphon dashboard`` and ``siphon export neuronpedia`` (``crates/cli/src/cmd/dashboard/``)
write it: ``vocab.json`` each token id decoded alone by the run's tokenizer, ``pieces.json``
its pieces; and in ``effects.rs``, from each dictionary's decoder
(``siphon_models::dictionary::decoder``), the nearest latents by decoder cosine and the
logit effects through the model's unembedding as TransformerLens processes it
(``siphon_models::Unembedding``, each family's ``FinalNorm`` saying how), computed by XLA on
the CPU plugin in chunks of rows; the alignment only for the Neuronpedia export.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from .._format import read_shard
from ..errors import DatasetError

#: The tensor pairs of a column's effects file: (ids, values) by section.
PAIRS: Dict[str, Tuple[str, str]] = {
    "logits_top": ("logits_top_ids", "logits_top_values"),
    "logits_bottom": ("logits_bottom_ids", "logits_bottom_values"),
    "neighbours": ("neighbours_ids", "neighbours_cosine"),
    "alignment": ("alignment_ids", "alignment_values"),
}


@dataclass
class ColumnEffects:
    """One column's effects: per section of `PAIRS` present, ``(ids int64 [width, k], values
    float32 [width, k])``."""

    name: str
    width: int
    sections: Dict[str, Tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    #: ``(heights int64 [width, bins], range float32 [width, 2])`` where the file has them.
    logits_hist: Optional[Tuple[np.ndarray, np.ndarray]] = None
    #: The alignment's shares of L1 (float32 ``[width, n]``) where the file has them.
    alignment_l1: Optional[np.ndarray] = None

    def latent(self, latent: int) -> Dict[str, List[List[float]]]:
        """Latent `latent`'s sections: each a list of ``[id, value]`` (ids ``< 0`` left out)."""
        out: Dict[str, List[List[float]]] = {}
        for section, (ids, values) in self.sections.items():
            row = [[int(i), float(v)] for i, v in zip(ids[latent], values[latent]) if i >= 0]
            out[section] = row
        return out


@dataclass
class Effects:
    """An effects directory read: its `vocab` (``None`` without ``vocab.json``) and the effects
    of the columns that have a file."""

    vocab: Optional[List[str]]
    columns: Dict[str, ColumnEffects] = field(default_factory=dict)
    #: The tokenizer's pieces (``pieces.json``; ``None`` without; an id without one ``None``).
    pieces: Optional[List[Optional[str]]] = None


def read_vocab(path: Path) -> List[str]:
    """``vocab.json``: a JSON list of strings (a ``null`` entry reads as ``""``)."""
    return ["" if v is None else v for v in read_strings(path, "token strings")]


def read_pieces(path: Path) -> List[Optional[str]]:
    """``pieces.json``: a JSON list of strings or nulls."""
    return read_strings(path, "token pieces")


def read_strings(path: Path, what: str) -> List[Optional[str]]:
    """A JSON file holding a list of strings or nulls (`what` names them in the error)."""
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: not a readable JSON file: {e}") from e
    if not isinstance(items, list) or not all(v is None or isinstance(v, str) for v in items):
        raise DatasetError(f"{path}: expected a JSON list of {what}")
    return items


def read_column(path: Path, name: str, width: int) -> ColumnEffects:
    """The effects of column `name` (`width` latents) in the safetensors file `path`."""
    where = str(path)
    try:
        tensors = read_shard(path.read_bytes(), where)
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise DatasetError(f"{where}: not a readable safetensors file: {e!r}") from e
    out = ColumnEffects(name, width)
    for section, (ids_name, values_name) in PAIRS.items():
        if ids_name not in tensors or values_name not in tensors:
            continue
        ids, values = tensors[ids_name], tensors[values_name]
        if ids.dtype.kind not in "iu" or values.dtype.kind != "f":
            raise DatasetError(f"{where}: {ids_name} must be integers and {values_name} floats, "
                               f"got {ids.dtype} and {values.dtype}")
        if ids.ndim != 2 or ids.shape != values.shape or ids.shape[0] != width:
            raise DatasetError(f"{where}: {ids_name} {list(ids.shape)} and {values_name} {list(values.shape)} "
                               f"must both be [{width}, k] ({name!r} has {width} latents)")
        out.sections[section] = (ids.astype(np.int64), values.astype(np.float32))
    if "logits_hist_heights" in tensors and "logits_hist_range" in tensors:
        heights, ranges = tensors["logits_hist_heights"], tensors["logits_hist_range"]
        if heights.dtype.kind not in "iu" or heights.ndim != 2 or heights.shape[0] != width \
                or ranges.shape != (width, 2) or ranges.dtype.kind != "f":
            raise DatasetError(f"{where}: logits_hist_heights {list(heights.shape)} and logits_hist_range "
                               f"{list(ranges.shape)} must be integers [{width}, bins] and floats [{width}, 2]")
        out.logits_hist = (heights.astype(np.int64), ranges.astype(np.float32))
    if "alignment" in out.sections and "alignment_l1" in tensors:
        shares = tensors["alignment_l1"]
        if shares.shape != out.sections["alignment"][0].shape or shares.dtype.kind != "f":
            raise DatasetError(f"{where}: alignment_l1 {list(shares.shape)} must be floats shaped as alignment_ids")
        out.alignment_l1 = shares.astype(np.float32)
    return out


def read_effects(directory: Union[str, Path], widths: Mapping[str, int]) -> Effects:
    """The effects directory `directory` for the columns `widths` (name -> latents)."""
    root = Path(directory)
    if not root.is_dir():
        raise DatasetError(f"{root}: no effects directory there")
    vocab_path = root / "vocab.json"
    out = Effects(read_vocab(vocab_path) if vocab_path.exists() else None)
    pieces_path = root / "pieces.json"
    if pieces_path.exists():
        out.pieces = read_pieces(pieces_path)
    for name, width in widths.items():
        path = root / f"{name}.safetensors"
        if path.exists():
            out.columns[name] = read_column(path, name, width)
    return out
