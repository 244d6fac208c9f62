"""Turning raw batches (numpy, bf16 as uint16 bit patterns) into numpy arrays or torch tensors
of the dtype asked for."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np

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
    """``None`` (keep the stored dtype), ``"raw"`` (bf16 as uint16 bits, internal) or one of
    float32/float16/bfloat16, from a name, a numpy dtype or a torch dtype."""
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


def require_ml_dtypes() -> Any:
    try:
        import ml_dtypes
    except ImportError as e:
        raise DatasetError(
            "this run stores bfloat16, which numpy lacks: pip install ml_dtypes, or ask for "
            "dtype='float32', or output='torch' (bf16 stays torch.bfloat16)"
        ) from e
    return ml_dtypes


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) to float32, exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


class Converter:
    """Raw batch -> output batch (numpy or torch, the wanted dtype, optionally on a device)."""

    def __init__(self, output: str, out_dtype: Optional[str], stored: str, hooks: Sequence[str], device: Any) -> None:
        self.output = output
        self.out = out_dtype
        self.stored = stored
        self.hooks = set(hooks)
        self.device = device
        if output == "torch":
            import torch

            self._torch = torch
            self._torch_dtype = None if out_dtype in (None, "raw") else getattr(torch, out_dtype)
        elif device is not None:
            raise DatasetError("device is only for output='torch'")

    def __call__(self, batch: Dict[str, np.ndarray]) -> Batch:
        if self.output == "torch":
            return Batch({k: self._tensor(k, v) for k, v in batch.items()})
        return Batch({k: self._array(k, v) for k, v in batch.items()})

    def _array(self, name: str, a: np.ndarray) -> np.ndarray:
        if name not in self.hooks or self.out == "raw":
            return a
        if self.stored == "bfloat16":
            if self.out is None or self.out == "bfloat16":
                return a.view(require_ml_dtypes().bfloat16)
            f32 = bf16_bits_to_f32(a)
            return f32 if self.out == "float32" else f32.astype(self.out)
        if self.out is None or self.out == self.stored:
            return a
        if self.out == "bfloat16":
            return a.astype(require_ml_dtypes().bfloat16)
        return a.astype(self.out)

    def _tensor(self, name: str, a: np.ndarray) -> Any:
        torch = self._torch
        if name in self.hooks and self.stored == "bfloat16":
            t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(a)
        if name in self.hooks and self._torch_dtype is not None and t.dtype != self._torch_dtype:
            t = t.to(self._torch_dtype)
        if self.device is not None:
            t = t.to(self.device)
        return t
