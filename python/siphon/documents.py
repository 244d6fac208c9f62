"""The documents' kept columns of a run (``siphon extract --keep-columns label,id``): each shard
holds, in a ``documents`` tensor of JSON lines, the columns of the documents it has rows of;
read back as one pyarrow table per run, joined to rows by ``doc_index``. Needs pyarrow
(``pip install pyarrow``)."""

from __future__ import annotations

import json
from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple

import numpy as np

from ._format import ManifestLine, parse_header
from ._location import Location
from .errors import DatasetError

#: pyarrow's type for each kept column's kind in run.json (``json``: as the values give it).
KINDS = ("int", "float", "bool", "string", "null", "json")


def pyarrow() -> Any:
    """The pyarrow module, or an error saying to install it."""
    try:
        import pyarrow as pa  # type: ignore[import-untyped]
    except ImportError as e:  # pragma: no cover - the test venvs have it
        raise DatasetError("documents and rows tables need pyarrow: pip install pyarrow") from e
    return pa


def kept_columns(run: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """run.json's kept columns: ``(name, kind)`` in order (none for a run without)."""
    return [(str(name), str(kind)) for name, kind in run.get("config", {}).get("keep_columns", [])]


def read_documents(location: Location, shards: Iterable[ManifestLine], columns: Sequence[Tuple[str, str]]) -> Any:
    """Every document a run's committed shards hold rows of, once, in document order: a
    pyarrow table of ``doc_index`` and the kept `columns`, each typed by its kind."""
    pa = pyarrow()
    seen: Dict[int, Mapping[str, Any]] = {}
    for shard in shards:
        header = parse_header(location, shard.rel, shard.bytes)
        info = header.tensors.get("documents")
        if info is None:
            raise DatasetError(f"{location.url}/{shard.rel}: no documents tensor (run.json keeps columns)")
        for line in location.read_range(shard.rel, info.start, info.end).decode("utf-8").splitlines():
            doc, fields = json.loads(line)
            seen.setdefault(int(doc), fields)
    docs = sorted(seen)
    arrays = {"doc_index": pa.array(docs, pa.int64())}
    for name, kind in columns:
        values = [seen[d].get(name) for d in docs]
        arrays[name] = pa.array(values, type=_type(pa, kind))
    return pa.table(arrays)


def joined(index: Mapping[str, np.ndarray], documents: Any) -> Any:
    """The rows' `index` columns (``doc_index`` first) as a pyarrow table, each row with its
    document's kept columns (null for a document without)."""
    pa = pyarrow()
    table = pa.table({name: pa.array(values) for name, values in index.items()})
    if documents is None or documents.num_columns <= 1:
        return table
    at = {int(d): i for i, d in enumerate(documents.column("doc_index").to_pylist())}
    take = pa.array([at.get(int(d)) for d in index["doc_index"]], pa.int64())
    for name in documents.column_names[1:]:
        table = table.append_column(name, documents.column(name).take(take))
    return table


def _type(pa: Any, kind: str) -> Any:
    if kind not in KINDS:
        raise DatasetError(f"run.json keeps a column of kind {kind!r} (known: {', '.join(KINDS)})")
    return {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(), "string": pa.string(),
            "null": pa.null()}.get(kind)
