"""Turning raw batches (numpy, bf16 as uint16 bit patterns, fp8 as uint8 bytes beside their
row scales) into numpy arrays or torch tensors of the dtype asked for (`Converter`), as a
`Batch`: a dict of each hook's rows and ``token_ids``, ``position`` (and ``role``), those three
also as properties.

fp8 rows are always dequantized: ``float32(e4m3) * scale`` in float32, then rounded to the
dtype asked for; ``dtype=None`` gives that float32 (the exact value the run stores)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np

from ._format import FP8, fp8_scale_name
from .errors import DatasetError

_NAMES = {
    "float32": "float32", "f32": "float32", "float": "float32",
    "float16": "float16", "f16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "raw": "raw",
}


class Batch(Dict[str, Any]):
    """One batch: each requested hook's ``[n, *shape]`` rows and, for the same ``n`` tokens,
    ``token_ids`` and ``position`` (and ``role`` in a run of conversations), as numpy arrays
    or torch tensors. A dict keyed by those names, with the fixed ones as properties."""

    @property
    def token_ids(self) -> Any:
        """``[n]`` token ids."""
        return self["token_ids"]

    @property
    def position(self) -> Any:
        """``[n]`` positions in their documents."""
        return self["position"]

    @property
    def role(self) -> Any:
        """``[n]`` roles (indices into ``siphon.ROLES``); only in a run of conversations."""
        return self["role"]


def resolve_dtype(dtype: Any, output: str) -> Optional[str]:
    """``None`` (keep the stored dtype; float32 for fp8), ``"raw"`` (bf16 as uint16 bits, fp8
    as bytes with their scales: internal) or one of float32/float16/bfloat16, from a name, a
    numpy dtype or a torch dtype."""
    if dtype is None:
        return None
    name = str(dtype).lower()
    name = name.replace("torch.", "")
    if name not in _NAMES:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            pass
    if name not in _NAMES:
        raise DatasetError(f"unsupported dtype {dtype!r}: use float32, float16 or bfloat16 (or None for the stored dtype)")
    return _NAMES[name]


def require_ml_dtypes(stored: str = "bfloat16") -> Any:
    """The ml_dtypes module, or a `DatasetError` saying what needs it: reading a run that
    stores `stored` (bfloat16 or float8_e4m3fn) in numpy, or asking for bfloat16 arrays."""
    try:
        import ml_dtypes
    except ImportError as e:
        if stored == FP8:
            why = (
                "this run stores float8_e4m3fn (fp8), which numpy lacks: pip install ml_dtypes, or "
                "output='torch' (fp8 rows are dequantized by torch)"
            )
        elif stored == "bfloat16":
            why = (
                "this run stores bfloat16, which numpy lacks: pip install ml_dtypes, or ask for "
                "dtype='float32', or output='torch' (bf16 stays torch.bfloat16)"
            )
        else:
            why = "numpy has no bfloat16: pip install ml_dtypes, or ask for dtype='float32', or output='torch'"
        raise DatasetError(why) from e
    return ml_dtypes


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) to float32, exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def fp8_to_f32(values: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float8_e4m3fn bytes (uint8) ``[n, *shape]`` and their rows' float32 scales ``[n]`` to the
    values they stand for: ``float32(e4m3) * scale``, computed in float32 (ml_dtypes decodes)."""
    e4m3: np.dtype = np.dtype(require_ml_dtypes(FP8).float8_e4m3fn)
    f32 = values.view(e4m3).astype(np.float32)
    f32 *= scales.astype(np.float32, copy=False).reshape((-1,) + (1,) * (values.ndim - 1))
    return f32


class Converter:
    """Raw batch -> output batch (numpy or torch, the wanted dtype, optionally on a device).

    In an fp8 run the raw batch also holds each hook's ``{hook}.fp8_scale`` rows; they are
    consumed here (the output holds the dequantized hooks only), except for ``"raw"``."""

    def __init__(self, output: str, out_dtype: Optional[str], stored: str, hooks: Sequence[str], device: Any) -> None:
        self.output = output
        self.out = out_dtype
        self.stored = stored
        self.hooks = set(hooks)
        self.device = device
        #: hook -> its scale tensor, for an fp8 run read as values (not "raw").
        self.scales = {h: fp8_scale_name(h) for h in hooks} if stored == FP8 and out_dtype != "raw" else {}
        if output == "torch":
            import torch

            self._torch = torch
            # fp8 is dequantized to float32 unless another dtype is asked for.
            default = "float32" if stored == FP8 else None
            name = default if out_dtype is None else out_dtype
            self._torch_dtype = None if name in (None, "raw") else getattr(torch, name)
        elif device is not None:
            raise DatasetError("device is only for output='torch'")
        elif out_dtype != "raw" and (
            stored == FP8 or out_dtype == "bfloat16" or (stored == "bfloat16" and out_dtype is None)
        ):
            require_ml_dtypes(stored)  # fail now, not at the first batch

    def __call__(self, batch: Dict[str, np.ndarray]) -> Batch:
        scales: Dict[str, np.ndarray] = {}
        if self.scales:
            batch = dict(batch)
            scales = {h: batch.pop(s) for h, s in self.scales.items()}
        if self.output == "torch":
            return Batch({k: self._tensor(k, v, scales.get(k)) for k, v in batch.items()})
        return Batch({k: self._array(k, v, scales.get(k)) for k, v in batch.items()})

    def _array(self, name: str, a: np.ndarray, scales: Optional[np.ndarray]) -> np.ndarray:
        if name not in self.hooks or self.out == "raw":
            return a
        if scales is not None:
            f32 = fp8_to_f32(a, scales)
            if self.out is None or self.out == "float32":
                return f32
            return f32.astype(require_ml_dtypes(FP8).bfloat16 if self.out == "bfloat16" else self.out)
        if self.stored == "bfloat16":
            if self.out is None or self.out == "bfloat16":
                return a.view(require_ml_dtypes().bfloat16)
            f32 = bf16_bits_to_f32(a)
            return f32 if self.out == "float32" else f32.astype(self.out)
        if self.out is None or self.out == self.stored:
            return a
        if self.out == "bfloat16":
            return a.astype(require_ml_dtypes(self.stored).bfloat16)
        return a.astype(self.out)

    def _tensor(self, name: str, a: np.ndarray, scales: Optional[np.ndarray]) -> Any:
        torch = self._torch
        if name in self.hooks and scales is not None:
            # Dequantized where the tensor goes (1 byte a value crosses to a device, not 4).
            t, s = torch.from_numpy(a), torch.from_numpy(scales)
            if self.device is not None:
                t, s = t.to(self.device), s.to(self.device)
            t = t.view(torch.float8_e4m3fn).to(torch.float32).mul_(s.reshape((-1,) + (1,) * (t.dim() - 1)))
            return t if self._torch_dtype in (None, torch.float32) else t.to(self._torch_dtype)
        if name in self.hooks and self.stored == "bfloat16":
            t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(a)
        if name in self.hooks and self._torch_dtype is not None and t.dtype != self._torch_dtype:
            t = t.to(self._torch_dtype)
        if self.device is not None:
            t = t.to(self.device)
        return t
