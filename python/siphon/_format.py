"""The dataset format as siphon's store writes it (crates/store): run.json, per-host
``manifest.jsonl`` and the safetensors shards.

Layout of a run directory::

    run.json                                   format tag, hooks, hook_shapes, shard_format...
    stats.json                                 per hook statistics
    machine_{m:03}_host_{h:02}/manifest.jsonl  one JSON line per committed shard
    machine_{m:03}_host_{h:02}/shard_{n:06}.safetensors

A shard holds one ``[tokens, *per-token shape]`` tensor per hook, ``token_ids`` (I32),
``position`` (I32), ``doc_index`` (I64), ``sample_index`` (I64) and, for runs with
``keep_excluded``, a ``mask`` (BOOL). A shard belongs to the dataset only once its manifest
line is written, so reading through the manifests sees exactly the committed shards, also while
a run is still being written.

In an fp8 run (``shard_format.dtype`` ``"fp8"``) each hook tensor holds float8_e4m3fn values
(F8_E4M3) and, beside it, ``{hook}.fp8_scale`` (F32, ``[tokens]``) one scale per token row: a
value is ``float32(e4m3) * scale``, computed in float32.

A shard's safetensors header is parsed here by hand (no safetensors library) into each
tensor's absolute byte range in the file (`TensorInfo`), so that a reader asks for the bytes of
the tensors it reads and no others. numpy has no bfloat16 nor float8: bf16 elements are held
as uint16 bit patterns and fp8 ones as uint8 bytes until `siphon._convert` converts them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._location import Location
from .errors import DatasetError

READABLE_FORMATS = ("siphon-activations/1", "siphon-activations/2")
RUN_JSON = "run.json"
MANIFEST = "manifest.jsonl"
HOST_DIR = re.compile(r"^machine_(\d{3})_host_(\d{2})$")
RESERVED = ("token_ids", "doc_index", "position", "sample_index", "mask", "role", "position_first", "count")
# The values of a run's ``role`` tensor (conversations rendered through a chat template).
ROLES = ("template", "system", "user", "assistant", "tool")

#: The logical dtype of an fp8 run's hooks: float8_e4m3fn values, scaled per token row.
FP8 = "float8_e4m3fn"
#: Ends the name of the f32 ``[tokens]`` tensor of an fp8 hook's row scales.
FP8_SCALE_SUFFIX = ".fp8_scale"

# safetensors dtype -> (numpy dtype holding the raw elements, logical dtype name).
# numpy has no bfloat16 nor float8: bf16 elements are held as uint16 bit patterns, fp8 ones as
# uint8 bytes, until converted.
STORED_DTYPES: Dict[str, Tuple[np.dtype, str]] = {
    "F32": (np.dtype("<f4"), "float32"),
    "F16": (np.dtype("<f2"), "float16"),
    "BF16": (np.dtype("<u2"), "bfloat16"),
    "F8_E4M3": (np.dtype("u1"), FP8),
    "I32": (np.dtype("<i4"), "int32"),
    "I64": (np.dtype("<i8"), "int64"),
    "BOOL": (np.dtype("bool"), "bool"),
    "U8": (np.dtype("u1"), "uint8"),
}
# run.json's shard_format.dtype -> logical dtype name.
RUN_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "fp8": FP8}


def fp8_scale_name(hook: str) -> str:
    """The tensor holding an fp8 hook's row scales (as the store names it)."""
    return hook + FP8_SCALE_SUFFIX


def hook_tensors(hooks: Sequence[str], dtype: str) -> List[str]:
    """The shard tensors that hold the rows of `hooks` in a run of logical `dtype`: the hooks
    and, in an fp8 run, each hook's scales after them."""
    return list(hooks) + ([fp8_scale_name(h) for h in hooks] if dtype == FP8 else [])


@dataclass(frozen=True)
class ManifestLine:
    """One committed shard of one host."""

    host: str
    shard: str
    index: int
    bytes: int
    #: CRC32C (8 hex digits) of the shard, or, for shards written before it, their sha256.
    crc32c: Optional[str]
    sha256: Optional[str]
    tokens: int
    included_tokens: int

    @property
    def rel(self) -> str:
        return f"{self.host}/{self.shard}"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a shard: its stored dtype, shape and absolute byte range in the file."""

    dtype: str
    shape: Tuple[int, ...]
    start: int
    end: int

    @property
    def row_bytes(self) -> int:
        rows = self.shape[0] if self.shape else 1
        return (self.end - self.start) // rows if rows else 0


@dataclass
class ShardHeader:
    tensors: Dict[str, TensorInfo]
    metadata: Dict[str, str] = field(default_factory=dict)


def read_run_json(location: Location) -> Dict[str, Any]:
    raw = location.read(RUN_JSON)
    if raw is None:
        raise DatasetError(
            f"{location.url}: no run.json: not a siphon run directory "
            "(open the run itself, {output}/{run}, as given to siphon extract --output/--run)"
        )
    try:
        run: Dict[str, Any] = json.loads(raw)
    except ValueError as e:
        raise DatasetError(f"{location.url}/run.json: not valid JSON: {e}") from e
    tag = run.get("format", "")
    if tag not in READABLE_FORMATS:
        raise DatasetError(
            f"{location.url}/run.json: unsupported dataset format {tag!r} (this siphon reads "
            + " and ".join(READABLE_FORMATS)
            + ")"
        )
    return run


def host_dirs(location: Location) -> List[str]:
    """Host directory names of the run, in (machine, host) order."""
    return sorted(d for d in location.list_dirs() if HOST_DIR.match(d))


def read_manifest(location: Location, host: str) -> List[ManifestLine]:
    """The host's committed shards; empty when it has no manifest yet. Checks that indices run
    0, 1, 2... as the writer commits them."""
    raw = location.read(f"{host}/{MANIFEST}")
    if raw is None:
        return []
    lines: List[ManifestLine] = []
    for number, text in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
            line = ManifestLine(
                host=host,
                shard=obj["shard"],
                index=int(obj["index"]),
                bytes=int(obj["bytes"]),
                crc32c=obj.get("crc32c"),
                sha256=obj.get("sha256"),
                tokens=int(obj["tokens"]),
                included_tokens=int(obj.get("included_tokens", obj["tokens"])),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise DatasetError(f"{location.url}/{host}/{MANIFEST}: line {number}: {e!r}") from e
        if line.index != len(lines):
            raise DatasetError(
                f"{location.url}/{host}/{MANIFEST}: line {number} is shard {line.index}, expected {len(lines)}"
            )
        lines.append(line)
    return lines


def parse_header(location: Location, rel: str, size: int) -> ShardHeader:
    """Reads a shard's safetensors header: one range read of its first 64 KiB, a second one only
    for a larger header. `size` is the object's size (the manifest's ``bytes``)."""
    where = f"{location.url}/{rel}"
    if size < 8:
        raise DatasetError(f"{where}: not a safetensors file ({size} bytes)")
    head = location.read_range(rel, 0, min(size, 65536))
    n = int.from_bytes(head[:8], "little")
    if 8 + n > size:
        raise DatasetError(f"{where}: safetensors header length {n} exceeds the file ({size} bytes)")
    if len(head) < 8 + n:
        head = head + location.read_range(rel, len(head), 8 + n)
    return header_of(head, where)


def header_of(head: bytes, where: str) -> ShardHeader:
    """The header of a shard whose first bytes (at least its header) are `head`."""
    n = int.from_bytes(head[:8], "little")
    try:
        header = json.loads(head[8 : 8 + n])
    except ValueError as e:
        raise DatasetError(f"{where}: bad safetensors header: {e}") from e
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        tensors[name] = TensorInfo(info["dtype"], tuple(info["shape"]), base + start, base + end)
    return ShardHeader(tensors, header.get("__metadata__") or {})


def read_shard(data: bytes, where: str) -> Dict[str, np.ndarray]:
    """Every tensor of a shard held in memory (a stream's batch), as `decode` gives them."""
    if len(data) < 8 or 8 + int.from_bytes(data[:8], "little") > len(data):
        raise DatasetError(f"{where}: not a safetensors file ({len(data)} bytes)")
    header = header_of(data, where)
    out = {}
    for name, info in header.tensors.items():
        if info.end > len(data):
            raise DatasetError(f"{where}: tensor {name} ends past the data ({info.end} of {len(data)} bytes)")
        out[name] = decode(info, data[info.start : info.end], info.shape[0] if info.shape else 1)
    return out


def decode(info: TensorInfo, raw: bytes, rows: int) -> np.ndarray:
    """Raw little-endian bytes of `rows` rows of a tensor as a numpy array ``[rows, *shape[1:]]``
    (bf16 as uint16 bit patterns, fp8 as uint8 bytes)."""
    np_dtype, _ = STORED_DTYPES[info.dtype]
    return np.frombuffer(raw, dtype=np_dtype).reshape((rows,) + tuple(info.shape[1:]))


# numpy dtype -> safetensors dtype, for the files siphon writes (exports).
_SAFETENSORS_DTYPES = {
    "float32": "F32", "float16": "F16", "int64": "I64", "int32": "I32", "int16": "I16",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL",
}


def write_safetensors(path: str, tensors: Dict[str, np.ndarray]) -> None:
    """Writes `tensors` as a safetensors file (little-endian, C order; the header padded with
    spaces to 8 bytes as the safetensors library pads it), without the library."""
    entries: Dict[str, Any] = {}
    arrays = []
    offset = 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        dtype = _SAFETENSORS_DTYPES.get(a.dtype.name)
        if dtype is None:
            raise DatasetError(f"cannot write {name}: no safetensors dtype for {a.dtype}")
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        entries[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        arrays.append(a)
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        for a in arrays:
            a.tofile(f)
