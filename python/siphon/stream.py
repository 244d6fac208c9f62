"""Live activations: the batches ``siphon extract --output stream://HOST:PORT`` serves, read
while the extraction runs, with no disk between (needs ``grpcio`` and ``protobuf``).

Example::

    import siphon
    for batch in siphon.stream("stream://10.0.0.5:7070", ["blocks.10.hook_resid_post"],
                               batch_size=4096, output="torch"):
        x = batch["blocks.10.hook_resid_post"]          # [4096, 576]

Every host of the extraction serves its own stream (host ``h`` on ``PORT+h``); a reader given
any one reads them all, a batch of each in turn. A host sends batch ``k`` of its extraction to
consumer ``k mod world_size``: over ``world_size`` ranks every token comes once. Each consumer
shuffles its rows within windows of `shuffle_buffer_tokens` rows. Batches are `Batch` dicts
as `Dataset.batches` gives them.

Not yet: resuming a consumer or a producer (a batch sent is gone), hosts on several machines,
TLS. A producer that stops before its last batch ends the stream with an error, never
as if it were complete.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np

from . import _convert
from ._format import RUN_DTYPES, hook_tensors, read_shard
from ._convert import Batch
from ._ranks import ranks
from .errors import DatasetError

SCHEME = "stream://"
#: The rows of a shuffle window when none is given, as a multiple of the batch size.
DEFAULT_WINDOW_BATCHES = 4


def _messages() -> Dict[str, Any]:
    """The messages of ``crates/stream/proto/stream.proto``, built from their descriptor (no
    generated code; a test compares them with the .proto)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]

    f = descriptor_pb2.FileDescriptorProto(name="siphon_stream.proto", package="siphon.stream", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    fields = {
        "DescribeRequest": [],
        "Description": [("run_json", T.TYPE_STRING)],
        "PullRequest": [("consumer", T.TYPE_UINT32), ("consumers", T.TYPE_UINT32)],
        "Batch": [("index", T.TYPE_UINT64), ("shard", T.TYPE_BYTES)],
    }
    for name, message_fields in fields.items():
        m = f.message_type.add(name=name)
        for number, (field, kind) in enumerate(message_fields, start=1):
            m.field.add(name=field, number=number, type=kind, label=T.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"siphon.stream.{name}")) for name in fields}


def stream(
    url: str,
    hooks: Optional[Sequence[str]] = None,
    *,
    batch_size: int = 4096,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    shuffle: bool = True,
    seed: int = 0,
    shuffle_buffer_tokens: Optional[int] = None,
    drop_last: bool = False,
    output: str = "numpy",
    dtype: Any = None,
    device: Any = None,
    connect_timeout: float = 600.0,
) -> Iterator[Batch]:
    """Shuffled `Batch`es of `hooks` (default: every hook) from the host serving `url`
    (``stream://HOST:PORT``), as consumer `rank` of `world_size` (default: torch.distributed's,
    else 0 of 1). Rows are shuffled within windows of `shuffle_buffer_tokens` (default
    ``4 * batch_size``), seeded by (`seed`, `rank`, window). `output`, `dtype` and `device` as
    `Dataset.batches`. Waits up to `connect_timeout` seconds for the host to serve."""
    if not url.startswith(SCHEME):
        raise DatasetError(f"{url!r} is not a stream: give stream://HOST:PORT, as siphon extract --output has it")
    if batch_size <= 0:
        raise DatasetError(f"batch_size must be positive, got {batch_size}")
    rank, world_size = ranks(rank, world_size)
    if not 0 <= rank < world_size:
        raise DatasetError(f"rank {rank} is out of range for world_size {world_size} (0 <= rank < world_size)")
    window = shuffle_buffer_tokens or DEFAULT_WINDOW_BATCHES * batch_size
    if shuffle and window < batch_size:
        raise DatasetError(f"shuffle_buffer_tokens ({window}) must be at least batch_size ({batch_size})")
    try:
        import grpc  # type: ignore[import-untyped]
    except ImportError as e:
        raise DatasetError("reading a stream needs grpcio and protobuf: pip install grpcio protobuf") from e
    messages = _messages()

    def channel(target: str) -> Any:
        return grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", -1)])

    first = channel(url[len(SCHEME) :])
    describe = first.unary_unary(
        "/siphon.stream.Stream/Describe",
        request_serializer=messages["DescribeRequest"].SerializeToString,
        response_deserializer=messages["Description"].FromString,
    )
    try:
        run = json.loads(describe(messages["DescribeRequest"](), wait_for_ready=True, timeout=connect_timeout).run_json)
    except grpc.RpcError as e:
        raise DatasetError(f"{url}: no stream served there within {connect_timeout} s: {e.details()}") from e
    finally:
        first.close()
    served: List[str] = run["hooks"]
    hooks = list(served) if hooks is None else list(hooks)
    unknown = [h for h in hooks if h not in served]
    if unknown or not hooks or len(set(hooks)) != len(hooks):
        raise DatasetError(f"hooks {hooks}: name some of the stream's hooks, each once: {served}")
    stored = RUN_DTYPES[run["format"]["dtype"]]
    convert = _convert.Converter(output, _convert.resolve_dtype(dtype, output), stored, hooks, device)
    roles = bool(run["format"].get("roles"))
    names = hook_tensors(hooks, stored) + ["token_ids", "position"] + (["role"] if roles else [])
    request = messages["PullRequest"](consumer=rank, consumers=world_size)
    channels = [channel(target) for target in run["producers"]]
    pulls = [
        c.unary_stream(
            "/siphon.stream.Stream/Pull",
            request_serializer=messages["PullRequest"].SerializeToString,
            response_deserializer=messages["Batch"].FromString,
        )(request, wait_for_ready=True)
        for c in channels
    ]
    return _batches(channels, _in_turn(pulls), url, names, convert, batch_size, shuffle, seed, rank, window, drop_last)


def _in_turn(streams: List[Iterator[Any]]) -> Iterator[Any]:
    """A message of each stream in turn (those that ended left out): the same order on every
    run, whatever the hosts' pace."""
    live = list(streams)
    while live:
        for s in list(live):
            try:
                yield next(s)
            except StopIteration:
                live.remove(s)


def _batches(
    channels: List[Any],
    calls: Iterator[Any],
    url: str,
    names: List[str],
    convert: _convert.Converter,
    batch_size: int,
    shuffle: bool,
    seed: int,
    rank: int,
    window: int,
    drop_last: bool,
) -> Iterator[Batch]:
    import grpc

    pending: List[Dict[str, np.ndarray]] = []
    have = 0
    windows = 0

    def emit(final: bool) -> Iterator[Batch]:
        nonlocal pending, have, windows
        rows = {n: np.concatenate([p[n] for p in pending]) for n in names}
        if shuffle:
            order = np.random.default_rng([seed, rank, windows]).permutation(have)
            rows = {n: a[order] for n, a in rows.items()}
        windows += 1
        full = have - have % batch_size
        for start in range(0, full, batch_size):
            yield convert({n: a[start : start + batch_size] for n, a in rows.items()})
        rest = {n: a[full:] for n, a in rows.items()}
        pending, have = [rest], have - full
        if final and have and not drop_last:
            yield convert(rest)

    try:
        for message in calls:
            tensors = read_shard(message.shard, f"{url} batch {message.index}")
            keep = tensors.get("mask")
            pending.append({n: tensors[n] if keep is None else tensors[n][keep] for n in names})
            have += len(pending[-1]["token_ids"])
            if have >= (window if shuffle else batch_size):
                yield from emit(False)
        if have:
            yield from emit(True)
    except grpc.RpcError as e:
        raise DatasetError(f"{url}: the stream broke off: {e.details()}") from e
    finally:
        for c in channels:
            c.close()


__all__ = ["stream"]
