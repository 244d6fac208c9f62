"""Where a run lives: a local directory, or ``s3://``/``gs://``/... through fsspec.

Local paths are read with plain file reads (``os.pread``), remote ones with fsspec range reads,
so reading a few hooks of a shard never downloads the whole shard; several ranges of one
remote object go out as concurrent requests (fsspec's ``cat_ranges``). For ``s3://``, s3fs's
endpoint is ``AWS_ENDPOINT_URL`` or else ``AWS_ENDPOINT``, the variable siphon's Rust side
(object_store) reads, so one environment serves both.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .errors import DatasetError

# fsspec protocol -> the package that implements it, for the error when it is missing.
_PROTOCOL_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}


class Location:
    """A run directory: reads objects and byte ranges relative to it."""

    def __init__(self, url: str, storage_options: Optional[Mapping[str, Any]] = None) -> None:
        self.url = url.rstrip("/")
        self._fs: Any = None
        self._root: str
        if "://" not in url or url.startswith("file://"):
            path = url[len("file://"):] if url.startswith("file://") else url
            self._root = os.path.abspath(os.path.expanduser(path))
            self.local = True
            return
        self.local = False
        protocol = url.split("://", 1)[0].lower()
        options = dict(storage_options or {})
        if protocol in ("s3", "s3a"):
            options = _s3_options_from_env(options)
        try:
            import fsspec  # type: ignore[import-untyped]
        except ImportError as e:  # pragma: no cover - fsspec is a dependency
            raise DatasetError(f"reading {url} needs fsspec: pip install fsspec") from e
        try:
            self._fs, root = fsspec.core.url_to_fs(self.url, **options)
        except (ImportError, ValueError) as e:
            package = _PROTOCOL_PACKAGES.get(protocol)
            hint = f" (pip install {package})" if package else ""
            raise DatasetError(f"cannot open {url}: no filesystem for {protocol}://{hint}: {e}") from e
        self._root = root.rstrip("/")

    def path(self, rel: str) -> str:
        """The full path (local) or fsspec path (remote) of `rel`."""
        return f"{self._root}/{rel}" if rel else self._root

    def local_path(self, rel: str) -> Optional[str]:
        """The path on disk, for local runs."""
        return os.path.join(self._root, rel) if self.local else None

    def read(self, rel: str) -> Optional[bytes]:
        """The whole object, or ``None`` when it does not exist."""
        if self.local:
            try:
                with open(self.path(rel), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                return None
        try:
            return bytes(self._fs.cat_file(self.path(rel)))
        except FileNotFoundError:
            return None

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of an object."""
        if end <= start:
            return b""
        if self.local:
            fd = os.open(self.path(rel), os.O_RDONLY)
            try:
                data = os.pread(fd, end - start, start)
            finally:
                os.close(fd)
        else:
            data = bytes(self._fs.cat_file(self.path(rel), start=start, end=end))
        if len(data) != end - start:
            raise DatasetError(
                f"{self.url}/{rel}: short read at bytes {start}..{end} ({len(data)} bytes): "
                "the object is smaller than its header says"
            )
        return data

    def read_ranges(self, rel: str, ranges: List[Tuple[int, int]]) -> List[bytes]:
        """Several ``(start, end)`` ranges of one object (concurrent requests when remote)."""
        if self.local or len(ranges) <= 1:
            return [self.read_range(rel, s, e) for s, e in ranges]
        path = self.path(rel)
        parts: List[Any] = self._fs.cat_ranges([path] * len(ranges), [s for s, _ in ranges], [e for _, e in ranges])
        for (s, e), part in zip(ranges, parts):
            if isinstance(part, Exception):
                raise DatasetError(f"{self.url}/{rel}: reading bytes {s}..{e}: {part}") from part
            if len(part) != e - s:
                raise DatasetError(f"{self.url}/{rel}: short read at bytes {s}..{e} ({len(part)} bytes)")
        return [bytes(p) for p in parts]

    def size(self, rel: str) -> Optional[int]:
        """Object size, or ``None`` when it does not exist."""
        if self.local:
            try:
                return os.stat(self.path(rel)).st_size
            except FileNotFoundError:
                return None
        try:
            return int(self._fs.size(self.path(rel)))
        except FileNotFoundError:
            return None

    def list_dirs(self) -> List[str]:
        """Names of the directories directly inside the run."""
        if self.local:
            try:
                return sorted(e.name for e in os.scandir(self._root) if e.is_dir())
            except FileNotFoundError:
                return []
        try:
            entries = self._fs.ls(self._root, detail=True, refresh=True)
        except FileNotFoundError:
            return []
        return sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")

    def list_files(self, rel: str) -> List[str]:
        """Names of the objects directly inside directory `rel`."""
        if self.local:
            try:
                return sorted(e.name for e in os.scandir(self.path(rel)) if e.is_file())
            except FileNotFoundError:
                return []
        try:
            entries = self._fs.ls(self.path(rel), detail=True, refresh=True)
        except FileNotFoundError:
            return []
        return sorted(e["name"].rsplit("/", 1)[-1] for e in entries if e.get("type") == "file")


def _s3_options_from_env(options: Dict[str, Any]) -> Dict[str, Any]:
    """siphon's Rust side reads ``AWS_ENDPOINT`` (object_store); s3fs/botocore read
    ``AWS_ENDPOINT_URL``. Honour the former too, so one environment serves both."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT")
    if endpoint and "endpoint_url" not in options and "endpoint_url" not in options.get("client_kwargs", {}):
        options["endpoint_url"] = endpoint
    return options
