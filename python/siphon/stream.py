"""Live activations: the batches ``siphon extract --output stream://HOST:PORT`` serves, read
while the extraction runs, with no disk between (needs ``grpcio`` and ``protobuf``).

Example::

    import siphon
    for batch in siphon.stream("stream://10.0.0.5:7070", ["blocks.10.hook_resid_post"],
                               batch_size=4096, output="torch"):
        x = batch["blocks.10.hook_resid_post"]          # [4096, 576]

Every host of the extraction serves its own stream (host ``h`` on ``PORT+h``); a reader given
any one reads them all, a message of each in turn, each host's on a thread of its own. A host
sends batch ``k`` of its extraction to consumer ``k mod n`` of the ``n`` readers (ranks ×
DataLoader workers): over them every token comes once. Each reader shuffles its rows within
windows of `shuffle_buffer_tokens` rows; its batches are consecutive rows of those windows, so
the position after a batch (window, rows of it read, and where each host's stream stood when
the window began) is all it takes to continue exactly (`StreamBatches.state_dict`).

Faults: a reader whose host goes away (killed, preempted) pulls again when it is back, from
the batch it needs next, and fails with an error naming the host when it is not back within
`reconnect_timeout`. A restarted host waits until every reader pulls and makes its batches
again from the earliest one they need; a reader restored from a checkpoint pulls from its
window's start, which the host still holds (its last ``--stream-keep`` batches sent) or makes
again when restarted. The job token and TLS as the control plane's (`Stream`). A run of several
machines (each with its own coordinator, so each lists only its hosts) is read through one
address of each: ``stream://HOST0:PORT,HOST1:PORT``.

Code: `Stream` is a stream opened by URL (its run, hooks and access; it holds no connection,
so it pickles to DataLoader workers), and `Stream.batches` gives `StreamBatches`, the disk
reader's twin (`Dataset.batches`'s arguments, `state_dict` and ``resume=``, so that
`siphon.torch`'s `ActivationDataset` and SAELens provider read streams too). `_Merge` takes a
message of each host in turn, each host pulled by a `_Puller` thread that pulls again when its
host comes back. A reader's windows are whole messages (taken until the window holds at least
`shuffle_buffer_tokens` rows; one message without shuffle), permuted by (seed, reader, readers,
window); its batches are consecutive rows of them, so (window, offset, the `_Cursor` at the
window's start) continues exactly.

Transport: grpcio, its fork support turned on (``GRPC_ENABLE_FORK_SUPPORT``, unless already
set) when siphon is imported, so that DataLoader workers forked after earlier readers do not
inherit a lock a gRPC thread held (that alone still hung under load: `siphon.torch.batch_loader`
starts a stream's workers from a fork server, ``siphon.torch.WORKERS_OF_A_STREAM``); the protobuf messages are built from a descriptor, no
generated code, and a test (``python/tests/test_stream.py``) checks them against
``crates/stream/proto/stream.proto``.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import _convert
from ._convert import Batch
from ._format import RUN_DTYPES, hook_tensors, read_shard
from ._ranks import check_reader, ranks
from .dataset import HookInfo, checked_hooks
from .outputs import OutputInfo, checked_outputs, parse_outputs
from .errors import DatasetError

# DataLoader workers are forked from a process whose earlier readers left gRPC's threads
# running; without gRPC's fork support a worker can block for ever on a lock one of them held
# at the fork (seen in the stream tests' two-worker loaders, about one run in two). gRPC reads
# the variable when it is first imported, so it is set when siphon is; a user's own wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "true")

SCHEME = "stream://"
#: The rows of a shuffle window when none is given, as a multiple of the batch size.
DEFAULT_WINDOW_BATCHES = 4
#: Messages a host's thread receives ahead of the reader.
AHEAD = 2
#: Status codes after which a host may come back: the reader pulls again.
_TRANSIENT = ("UNAVAILABLE", "ABORTED", "CANCELLED", "INTERNAL", "UNKNOWN")


def _messages() -> Dict[str, Any]:
    """The messages of ``crates/stream/proto/stream.proto``, built from their descriptor (no
    generated code; a test compares them with the .proto)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]

    f = descriptor_pb2.FileDescriptorProto(name="siphon_stream.proto", package="siphon.stream", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    fields = {
        "DescribeRequest": [],
        "Description": [("run_json", T.TYPE_STRING)],
        "PullRequest": [("consumer", T.TYPE_UINT32), ("consumers", T.TYPE_UINT32), ("start", T.TYPE_UINT64),
                        ("position", T.TYPE_STRING)],
        "Batch": [("index", T.TYPE_UINT64), ("shard", T.TYPE_BYTES), ("position", T.TYPE_STRING)],
    }
    for name, message_fields in fields.items():
        m = f.message_type.add(name=name)
        for number, (field_name, kind) in enumerate(message_fields, start=1):
            m.field.add(name=field_name, number=number, type=kind, label=T.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"siphon.stream.{name}")) for name in fields}


def _grpc() -> Any:
    try:
        import grpc  # type: ignore[import-untyped]
    except ImportError as e:
        raise DatasetError("reading a stream needs grpcio and protobuf: pip install grpcio protobuf") from e
    return grpc


#: The metadata key of the job token (the coordinator's, ``crates/stream``'s ``TOKEN_HEADER``).
TOKEN_HEADER = "x-siphon-job-token"


@dataclass(frozen=True)
class _Access:
    """How a reader reaches the hosts: the job token its calls carry, and over TLS the CA
    certificate (PEM) the hosts' certificate is checked against and the name it must hold."""

    token: Optional[str] = None
    ca: Optional[bytes] = None
    tls_name: Optional[str] = None

    def channel(self, target: str) -> Any:
        grpc = _grpc()
        options: List[Tuple[str, Any]] = [("grpc.max_receive_message_length", -1)]
        if self.ca is None:
            return grpc.insecure_channel(target, options=options)
        if self.tls_name:
            options.append(("grpc.ssl_target_name_override", self.tls_name))
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=self.ca), options=options)

    @property
    def metadata(self) -> Tuple[Tuple[str, str], ...]:
        return ((TOKEN_HEADER, self.token),) if self.token else ()

    def describe(self, channel: Any, timeout: float) -> Dict[str, Any]:
        """The run a host serves, waiting up to `timeout` seconds for it to answer."""
        m = _messages()
        call = channel.unary_unary(
            "/siphon.stream.Stream/Describe",
            request_serializer=m["DescribeRequest"].SerializeToString,
            response_deserializer=m["Description"].FromString,
        )
        reply = call(m["DescribeRequest"](), wait_for_ready=True, timeout=timeout, metadata=self.metadata)
        run: Dict[str, Any] = json.loads(reply.run_json)
        return run


class Stream:
    """A live stream, opened by the URL of any of its hosts (``stream://HOST:PORT``; a run of
    several machines, each with its own coordinator: one host of each,
    ``stream://HOST0:PORT,HOST1:PORT``): the run its hosts serve (`hooks`, `dtype`), and
    `batches` to read it. Waits up to `connect_timeout`
    seconds for the host to answer; a reader waits up to `reconnect_timeout` seconds for a host
    that went away to come back. Holds no connection: it can be handed to DataLoader workers.

    As the job's control plane: `token` (default ``SIPHON_JOB_TOKEN``) is the job token, which
    the hosts ask for when the job was given one; `ca` (default ``SIPHON_COORDINATOR_CA``), a
    PEM file, reads the stream over TLS, the hosts' certificate (the coordinator's) checked
    against it and against `tls_name` (default ``SIPHON_COORDINATOR_TLS_NAME``, else the host
    the URL names)."""

    def __init__(self, url: str, *, connect_timeout: float = 600.0, reconnect_timeout: float = 600.0,
                 token: Optional[str] = None, ca: Optional[str] = None, tls_name: Optional[str] = None) -> None:
        if not url.startswith(SCHEME):
            raise DatasetError(f"{url!r} is not a stream: give stream://HOST:PORT, as siphon extract --output has it")
        grpc = _grpc()
        ca = ca or os.environ.get("SIPHON_COORDINATOR_CA")
        try:
            pem = None if ca is None else open(ca, "rb").read()
        except OSError as e:
            raise DatasetError(f"cannot read the CA certificate {ca}: {e}") from e
        self._access = _Access(token or os.environ.get("SIPHON_JOB_TOKEN"), pem,
                               tls_name or os.environ.get("SIPHON_COORDINATOR_TLS_NAME"))
        runs = [(target, self._describe(url, target, connect_timeout)) for target in url[len(SCHEME) :].split(",")]
        self.run = runs[0][1]
        self.url = url
        self.connect_timeout = connect_timeout
        self.reconnect_timeout = reconnect_timeout
        #: Where each host is reached, host ``h`` of machine ``m`` after every host of machines
        #: before ``m``.
        self.producers: List[str] = [p for _, _, hosts in sorted(_machines(url, runs)) for p in hosts]
        self.dtype: str = RUN_DTYPES[self.run["format"]["dtype"]]
        self.hooks: Dict[str, HookInfo] = {
            name: HookInfo(name, tuple(int(d) for d in shape), self.dtype)
            for name, shape in zip(self.run["hooks"], self.run["hook_shapes"])
        }
        #: Whether batches hold each token's role (a run of conversations).
        self.has_roles = bool(self.run["format"].get("roles"))
        #: The model's outputs each batch holds (``extract --outputs``), by name.
        self.outputs: Dict[str, OutputInfo] = parse_outputs(self.run, url)

    def _describe(self, url: str, target: str, timeout: float) -> Dict[str, Any]:
        """The run the host at `target` serves."""
        grpc = _grpc()
        channel = self._access.channel(target)
        try:
            run = self._access.describe(channel, timeout)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise DatasetError(f"{url} refused the reader: {e.details()} (give token= or SIPHON_JOB_TOKEN)") from e
            raise DatasetError(f"{url}: no stream served at {target} within {timeout} s: {e.details()}") from e
        finally:
            channel.close()
        return run

    @property
    def name(self) -> str:
        """The run name."""
        return str(self.run["run"])

    def __repr__(self) -> str:
        return f"Stream({self.url!r}, run={self.name!r}, hosts={len(self.producers)}, hooks={list(self.hooks)})"

    def _check_hooks(self, hooks: Optional[Sequence[str]]) -> List[str]:
        return checked_hooks(hooks, list(self.hooks))

    def batches(
        self,
        hooks: Optional[Sequence[str]] = None,
        *,
        batch_size: int = 4096,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        worker: int = 0,
        num_workers: int = 1,
        output: str = "numpy",
        dtype: Any = None,
        device: Any = None,
        shuffle_buffer_tokens: Optional[int] = None,
        drop_last: bool = False,
        epoch: int = 0,
        epochs: Optional[int] = 1,
        resume: Optional[Mapping[str, Any]] = None,
        outputs: Optional[Sequence[str]] = None,
    ) -> "StreamBatches":
        """Shuffled `Batch`es of `hooks` (default: every hook) for reader ``rank * num_workers +
        worker`` of ``world_size * num_workers``, as `Dataset.batches` gives them. Rows are
        shuffled within windows of `shuffle_buffer_tokens` rows (default ``4 * batch_size``),
        seeded by (`seed`, reader, readers, window). A stream is one pass: `epoch` is 0, and
        `epochs` 1 or ``None`` read it once. `resume`: a state ``state_dict()`` gave; the
        batches continue exactly from there. Nothing is pulled before the first batch.
        `outputs`: the model's outputs to return beside the hooks, as `Dataset.batches`."""
        wanted = checked_outputs(outputs, self.outputs)
        hooks = [] if hooks is None and not self.hooks and wanted else self._check_hooks(hooks)
        check_reader(batch_size, rank, world_size, worker, num_workers)
        if epoch != 0 or epochs not in (None, 1):
            raise DatasetError(f"a stream is read once: it has no epoch {epoch} (epochs={epochs})")
        window = shuffle_buffer_tokens or DEFAULT_WINDOW_BATCHES * batch_size
        if shuffle and window < batch_size:
            raise DatasetError(f"shuffle_buffer_tokens ({window}) must be at least batch_size ({batch_size})")
        names = hook_tensors(hooks, self.dtype) + wanted + ["token_ids", "position"]
        names += ["role"] if self.has_roles else []
        plan = _Plan(
            stream=self,
            names=names,
            convert=_convert.Converter(output, _convert.resolve_dtype(dtype, output), self.dtype, hooks, device),
            consumer=rank * num_workers + worker,
            consumers=world_size * num_workers,
            batch_size=batch_size,
            window=window if shuffle else 1,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
        return StreamBatches(plan, plan.start_of(resume))


def _machines(url: str, runs: List[Tuple[str, Dict[str, Any]]]) -> List[Tuple[int, str, List[str]]]:
    """Each machine's hosts, as (machine, address reached, where each host is reached), from
    the runs described at each address of `url`: one per machine of the same run."""
    machines = int(runs[0][1].get("machines", 1))
    found = [(int(r.get("machine", 0)), at, [_reachable(p, at) for p in r["producers"]]) for at, r in runs]
    names = {r["run"] for _, r in runs}
    if len(names) > 1:
        raise DatasetError(f"{url}: the addresses serve different runs ({', '.join(sorted(names))})")
    if sorted(m for m, _, _ in found) != list(range(machines)):
        given = ", ".join(f"machine {m} at {at}" for m, at, _ in found)
        raise DatasetError(
            f"{url}: run {runs[0][1]['run']!r} streams from {machines} machine(s), each serving its own hosts; "
            f"give each machine's address once (stream://HOST0:PORT,HOST1:PORT,...): got {given}"
        )
    return found


def _reachable(producer: str, via: str) -> str:
    """`producer` (``HOST:PORT`` as its host advertises it) with a wildcard host (hosts that
    listen everywhere on the VM the reader reached) replaced by the host of `via`, the
    ``HOST:PORT`` the reader was given."""
    host, _, port = producer.rpartition(":")
    if host.strip("[]") in ("0.0.0.0", "::"):
        return f"{via.rpartition(':')[0]}:{port}"
    return producer


def stream(
    url: str,
    hooks: Optional[Sequence[str]] = None,
    *,
    batch_size: int = 4096,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    connect_timeout: float = 600.0,
    reconnect_timeout: float = 600.0,
    token: Optional[str] = None,
    ca: Optional[str] = None,
    tls_name: Optional[str] = None,
    **kwargs: Any,
) -> "StreamBatches":
    """`Stream.batches` of the stream `url` (``stream://HOST:PORT``), as reader `rank` of
    `world_size` (default: torch.distributed's, else 0 of 1). `token`, `ca`, `tls_name` and the
    timeouts as `Stream`; keyword arguments as `Stream.batches` (shuffle, seed,
    shuffle_buffer_tokens, drop_last, output, dtype, device, resume, outputs)."""
    if not url.startswith(SCHEME):
        raise DatasetError(f"{url!r} is not a stream: give stream://HOST:PORT, as siphon extract --output has it")
    rank, world_size = ranks(rank, world_size)
    if not 0 <= rank < world_size:
        raise DatasetError(f"rank {rank} is out of range for world_size {world_size} (0 <= rank < world_size)")
    opened = Stream(url, connect_timeout=connect_timeout, reconnect_timeout=reconnect_timeout, token=token, ca=ca,
                    tls_name=tls_name)
    return opened.batches(hooks, batch_size=batch_size, rank=rank, world_size=world_size, **kwargs)


@dataclass(frozen=True)
class _Cursor:
    """Where a reader stands in its hosts' streams: per host the next batch it takes, the data
    position of the batch before (what a restarted host reads from) and whether the host's
    stream has ended; and the host whose turn is next."""

    next: Tuple[int, ...]
    positions: Tuple[str, ...]
    ended: Tuple[bool, ...]
    turn: int = 0

    def as_json(self) -> Dict[str, Any]:
        return {"next": list(self.next), "positions": list(self.positions), "ended": list(self.ended), "turn": self.turn}


#: Where a reader continues: (window, rows of it already read, the cursor at the window's
#: start), or ``None`` after the last batch.
_Position = Optional[Tuple[int, int, _Cursor]]
_END = object()


@dataclass(frozen=True, eq=False)
class _Plan:
    """Everything one reader's pass over a stream needs (`Stream.batches` checks it)."""

    stream: Stream
    names: List[str]
    convert: _convert.Converter
    consumer: int
    consumers: int
    batch_size: int
    #: Rows of a shuffle window (1 without shuffle: each message is a window, in order).
    window: int
    shuffle: bool
    seed: int
    drop_last: bool

    @property
    def hosts(self) -> int:
        return len(self.stream.producers)

    def fingerprint(self) -> str:
        """What decides the order of the rows, for checking that a saved position fits."""
        key = [self.stream.name, self.hosts, self.shuffle, self.seed, self.batch_size, self.window,
               self.drop_last]
        return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]

    def begin(self) -> _Cursor:
        h = self.hosts
        return _Cursor(next=(self.consumer,) * h, positions=("",) * h, ended=(False,) * h)

    def state(self, position: _Position) -> Dict[str, Any]:
        state: Dict[str, Any] = {
            "version": 1, "kind": "stream", "reader": self.consumer, "readers": self.consumers,
            "settings": self.fingerprint(), "done": position is None,
        }
        if position is not None:
            window, offset, cursor = position
            state.update(window=window, offset=offset, cursor=cursor.as_json())
        return state

    def start_of(self, resume: Optional[Mapping[str, Any]]) -> _Position:
        """The position a saved state continues from, checked against the reader's settings."""
        if resume is None:
            return 0, 0, self.begin()
        if resume.get("version") != 1 or resume.get("kind") != "stream":
            raise DatasetError(f"unknown state {dict(resume)!r}: not one a siphon stream reader saved")
        if (resume.get("reader"), resume.get("readers")) != (self.consumer, self.consumers):
            raise DatasetError(
                f"the state is reader {resume.get('reader')} of {resume.get('readers')}; this is reader "
                f"{self.consumer} of {self.consumers} (rank x worker)"
            )
        if resume.get("settings") != self.fingerprint():
            raise DatasetError(
                "the state was saved with other settings (run, hosts, seed, batch size, shuffle buffer or "
                "drop_last): restore it with the arguments it was saved with"
            )
        if resume["done"]:
            return None
        c = resume["cursor"]
        cursor = _Cursor(tuple(int(k) for k in c["next"]), tuple(str(p) for p in c["positions"]),
                         tuple(bool(e) for e in c["ended"]), int(c["turn"]))
        return int(resume["window"]), int(resume["offset"]), cursor

    def batches(self, start: _Position) -> Iterator[Tuple[Batch, _Position]]:
        """The batches from `start` on, each with the position after it."""
        if start is None:
            return
        w, offset, cursor = start
        messages = _Merge(self, cursor)
        b = self.batch_size
        pending: List[Dict[str, np.ndarray]] = []
        have = 0
        try:
            more = True
            while more:
                at_start = cursor
                parts: List[Dict[str, np.ndarray]] = []
                rows = 0
                while rows < self.window:
                    item = messages.next()
                    if item is None:
                        more = False
                        break
                    message, cursor = item
                    parts.append(self.rows_of(message))
                    rows += len(parts[-1]["token_ids"])
                if not parts:
                    break
                window = {n: np.concatenate([p[n] for p in parts]) for n in self.names}
                if self.shuffle:
                    order = np.random.default_rng([self.seed, self.consumer, self.consumers, w]).permutation(rows)
                    window = {n: a[order] for n, a in window.items()}
                i, offset = offset, 0
                while i < rows:
                    take = min(b - have, rows - i)
                    pending.append({n: a[i : i + take] for n, a in window.items()})
                    have += take
                    i += take
                    if have == b:
                        after: _Position = (w, i, at_start) if i < rows else (w + 1, 0, cursor)
                        yield self.convert(_concat(pending)), after
                        pending, have = [], 0
                w += 1
            if have and not self.drop_last:
                yield self.convert(_concat(pending)), None
        finally:
            messages.close()

    def rows_of(self, message: Any) -> Dict[str, np.ndarray]:
        tensors = read_shard(message.shard, f"{self.stream.url} batch {message.index}")
        keep = tensors.get("mask")
        return {n: tensors[n] if keep is None else tensors[n][keep] for n in self.names}


def _concat(parts: List[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return {n: np.concatenate([p[n] for p in parts]) for n in parts[0]}


class StreamBatches(Iterator[Batch]):
    """The iterator `Stream.batches` returns: `Batch`es, and `state_dict` — where it stands
    after the last batch it gave, to continue exactly from there with
    ``Stream.batches(..., resume=state)`` (the same arguments otherwise)."""

    def __init__(self, plan: _Plan, start: _Position) -> None:
        self._plan = plan
        self._position = start
        self._items: Optional[Iterator[Tuple[Batch, _Position]]] = None

    def __iter__(self) -> "StreamBatches":
        return self

    def __next__(self) -> Batch:
        if self._items is None:
            self._items = self._plan.batches(self._position)
        batch, self._position = next(self._items)
        return batch

    def state_dict(self) -> Dict[str, Any]:
        """A small JSON-serialisable state: the position after the last batch given."""
        return self._plan.state(self._position)

    def close(self) -> None:
        """Stops reading: the hosts' threads end and their connections close."""
        if self._items is not None:
            self._items.close()  # type: ignore[attr-defined]


class _Merge:
    """A reader's messages, a host's in turn (a host whose stream ended left out): the same
    order on every run, whatever the hosts' pace. Each host is pulled on a thread of its own,
    `AHEAD` messages ahead."""

    def __init__(self, plan: _Plan, cursor: _Cursor) -> None:
        self._plan = plan
        self._cursor = cursor
        self._stop = threading.Event()
        self._queues: List["queue.Queue[Any]"] = [queue.Queue(AHEAD) for _ in range(plan.hosts)]
        self._pullers = [
            _Puller(plan, h, cursor.next[h], cursor.positions[h], self._queues[h], self._stop)
            for h in range(plan.hosts)
            if not cursor.ended[h]
        ]
        for p in self._pullers:
            p.thread.start()

    def next(self) -> Optional[Tuple[Any, _Cursor]]:
        """The next message and the cursor after it; ``None`` when every host's stream ended."""
        c = self._cursor
        while not all(c.ended):
            h = c.turn
            if c.ended[h]:
                c = replace(c, turn=(h + 1) % len(c.ended))
                continue
            item = self._queues[h].get()
            if item is _END:
                c = replace(c, ended=c.ended[:h] + (True,) + c.ended[h + 1 :], turn=(h + 1) % len(c.ended))
                continue
            if isinstance(item, BaseException):
                raise item
            c = replace(
                c,
                next=c.next[:h] + (c.next[h] + self._plan.consumers,) + c.next[h + 1 :],
                positions=c.positions[:h] + (item.position,) + c.positions[h + 1 :],
                turn=(h + 1) % len(c.ended),
            )
            self._cursor = c
            return item, c
        self._cursor = c
        return None

    def close(self) -> None:
        self._stop.set()
        for p in self._pullers:
            p.cancel()


class _Puller:
    """Pulls one host's messages for a reader into `out`, ending with `_END` or an error; when
    the host goes away, pulls again (from the batch after the last one received) once it is
    back, within the stream's `reconnect_timeout`."""

    def __init__(self, plan: _Plan, host: int, start: int, position: str, out: "queue.Queue[Any]",
                 stop: threading.Event) -> None:
        self.plan, self.host, self.start, self.position = plan, host, start, position
        self.target = plan.stream.producers[host]
        self.out, self.stop = out, stop
        self.call: Any = None
        self.thread = threading.Thread(target=self.run, name=f"siphon-stream-{host}", daemon=True)

    def cancel(self) -> None:
        call = self.call
        if call is not None:
            call.cancel()

    def put(self, item: Any) -> bool:
        """Hands `item` on, unless the reader stopped first."""
        while not self.stop.is_set():
            try:
                self.out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run(self) -> None:
        grpc = _grpc()
        plan, stream = self.plan, self.plan.stream
        where = f"{stream.url}: the host on {self.target} (host {self.host})"
        m = _messages()
        access = stream._access
        channel = access.channel(self.target)
        pull = channel.unary_stream(
            "/siphon.stream.Stream/Pull",
            request_serializer=m["PullRequest"].SerializeToString,
            response_deserializer=m["Batch"].FromString,
        )
        patience, broke = stream.connect_timeout, "it did not answer"
        try:
            while not self.stop.is_set():
                try:
                    run = access.describe(channel, patience)
                except grpc.RpcError as e:
                    if not self.stop.is_set():
                        self.put(DatasetError(f"{where}: {broke}, and was not back within {patience} s ({e.details()})"))
                    return
                if run.get("run") != stream.name:
                    self.put(DatasetError(f"{where} serves run {run.get('run')!r}, not {stream.name!r}"))
                    return
                request = m["PullRequest"](consumer=plan.consumer, consumers=plan.consumers, start=self.start,
                                           position=self.position)
                self.call = pull(request, metadata=access.metadata)
                try:
                    for message in self.call:
                        self.start, self.position = self.start + plan.consumers, message.position
                        if not self.put(message):
                            return
                    self.put(_END)
                    return
                except grpc.RpcError as e:
                    if self.stop.is_set():
                        return
                    if e.code().name not in _TRANSIENT:
                        self.put(DatasetError(f"{where} refused the stream: {e.details()}"))
                        return
                    patience, broke = stream.reconnect_timeout, f"it broke off ({e.details()})"
        finally:
            channel.close()


__all__ = ["Stream", "StreamBatches", "stream"]
