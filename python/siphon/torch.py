"""PyTorch adapters: an ``IterableDataset`` for ``DataLoader`` (ranks × workers split without
overlap or gap), and the tensor iterators SAELens's ``SAETrainer(data_provider=...)`` and
dictionary_learning's ``trainSAE(data=...)`` take.

Example::

    import siphon, siphon.torch
    from torch.utils.data import DataLoader
    ds = siphon.torch.ActivationDataset("out/demo/smollm2-shakespeare",
                                        hooks=["blocks.10.hook_resid_post"], batch_size=4096)
    for batch in DataLoader(ds, batch_size=None, num_workers=2):
        x = batch["blocks.10.hook_resid_post"]      # [4096, 576] torch.bfloat16

Hooks keep their stored dtype unless `dtype` says otherwise, except an fp8 run's, which come
dequantized (each value times its row's scale) as float32, or as the `dtype` asked for.

Checkpoints, wherever the loop runs: ``ds.state_dict()`` after iterating the dataset itself or
a ``DataLoader(ds, batch_size=None)`` without workers, or `batch_loader`'s loader with any;
``loader.state_dict()`` of torchdata's ``StatefulDataLoader`` with any workers (each worker's
iterator says where its reader stands). Restored (``load_state_dict``) on a new dataset or
loader of the same arguments, the batches continue exactly.

How: `ActivationDataset` reads its DataLoader worker (``get_worker_info()``) and
``torch.distributed`` rank, and keeps its epoch in shared memory, so that `set_epoch` reaches
persistent workers. ``iter(dataset)`` is a `_Reader`, stateful as ``StatefulDataLoader`` asks
of an iterable dataset's iterator in each worker: it starts reading at its first batch, from
the position loaded by then. Iterated in the main process (a loop over the dataset, a
DataLoader without workers) the dataset keeps its own state. `batch_loader` gives an
`EpochLoader`: a DataLoader that moves to the next epoch at each iteration and records which
worker's reader gave each batch and where that reader then stands, for the dataset's
`state_dict`; restored, its workers are rotated so that the round robin over them continues
in the uninterrupted order. A plain DataLoader's workers mark the state as unknown (in shared
memory), so ``ds.state_dict()`` then refuses rather than guess. `data_provider` gives a
`Provider` (for SAELens's ``SAETrainer`` and dictionary_learning) read by a `batch_loader`
loader, with the same state. All of them read a live stream too (a `siphon.Stream` or its
``stream://`` URL; `stream_provider`).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torch.utils.data import Dataset as TorchDataset

from ._ranks import ranks
from .dataset import Batches, Dataset, open_dataset
from .errors import DatasetError
from .stream import SCHEME, Stream, StreamBatches


class ActivationDataset(IterableDataset[Any]):
    """A siphon run as a ``torch.utils.data.IterableDataset`` of whole batches.

    Use it with ``DataLoader(ds, batch_size=None, num_workers=W)``: each DataLoader worker of
    each rank reads its own units (`Dataset.batches` with ``worker``/``num_workers`` from
    ``get_worker_info()``), so over ``world_size`` ranks × ``W`` workers every token comes once
    per epoch. `rank`/`world_size` default to ``torch.distributed``'s when it is initialized.
    Call `set_epoch` between epochs to reshuffle, or iterate `batch_loader`'s loader, which
    does it: the epoch lives in shared memory, so it reaches DataLoader workers whether they
    are started for each epoch or kept (``persistent_workers=True``). With `tensors`, one hook
    is yielded as bare ``[n, width]`` tensors instead of dicts.
    """

    def __init__(
        self,
        dataset: Union[Dataset, Stream, str, "os.PathLike[str]"],
        hooks: Optional[Sequence[str]] = None,
        *,
        batch_size: int = 4096,
        shuffle: bool = True,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        dtype: Any = None,
        epochs: Optional[int] = 1,
        tensors: bool = False,
        storage_options: Optional[Mapping[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.dataset = _opened(dataset, storage_options)
        self.hooks = self.dataset._check_hooks(hooks)
        if tensors and len(self.hooks) != 1:
            raise DatasetError(f"tensors=True yields one hook's tensors; got hooks {self.hooks}")
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.dtype = dtype
        self.epochs = epochs
        self.tensors = tensors
        # Shared memory: workers forked or spawned by a DataLoader, persistent ones included,
        # read the value the main process's set_epoch writes.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        # Set by EpochLoader: workers wrap each item with the reader and its position.
        self._tagged = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        # Set by a DataLoader worker that iterates untagged: the main process then cannot say
        # where the iteration stands, unless it iterates the dataset itself again.
        self._in_workers = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        # (workers, each reader's state after its last delivered batch, the last reader).
        self._delivered: Optional[Tuple[int, Dict[int, Dict[str, Any]], int]] = None
        self._restored: Optional[Dict[str, Any]] = None
        self.kwargs = kwargs
        # Fail now, not in a worker, on bad arguments.
        r, w = ranks(rank, world_size)
        self._batches(rank=r, world_size=w)

    def _batches(self, **where: Any) -> Union[Batches, StreamBatches]:
        """`Dataset.batches` with this dataset's settings, for the reader `where` names."""
        return self.dataset.batches(
            self.hooks,
            batch_size=self.batch_size,
            shuffle=self.shuffle,
            seed=self.seed,
            output="torch",
            dtype=self.dtype,
            **where,
            **self.kwargs,
        )

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads (its shuffle)."""
        return int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch the next iteration reads (its shuffle), in every DataLoader worker."""
        self._epoch.fill_(int(epoch))

    def __iter__(self) -> "_Reader":
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world_size = ranks(self.rank, self.world_size)
        epoch = self.epoch
        # A restored epoch: the readers continue where the state left them, and DataLoader
        # worker 0 hosts the reader whose batch came next, so that the round robin over the
        # workers hands out the batches in the uninterrupted order.
        restored = self._restored if self._restored is not None and self._restored["epoch"] == epoch else None
        if restored is not None and restored["readers"] and int(restored["workers"]) != num_workers:
            raise DatasetError(f"the state was saved with {restored['workers']} reader(s) (DataLoader workers); "
                               f"this iteration has {num_workers}")
        slot = (worker + restored["next"]) % num_workers if restored is not None else worker
        state = restored["readers"].get(str(slot)) if restored is not None else None
        tagged = bool(self._tagged)
        here = info is None and not tagged
        if here:
            # Iterated in this process (a loop over the dataset, a DataLoader without workers):
            # state_dict() follows the batches as they are handed out.
            self._in_workers.fill_(0)
            self._delivered = (1, {0: state} if state is not None else {}, 0)
        elif info is not None and not tagged:
            self._in_workers.fill_(1)
        where = dict(rank=rank, world_size=world_size, epochs=self.epochs, worker=slot, num_workers=num_workers)
        return _Reader(self, where, epoch, state, tagged=tagged, here=here)

    # ----------------------------------------------------------------------------- state

    def state_dict(self) -> Dict[str, Any]:
        """Where the iteration stands after the last batch it gave: the epoch, and each
        reader's (DataLoader worker's) position and which one gives the next batch. It follows
        a loop over the dataset itself, a ``DataLoader`` without workers and `batch_loader`'s
        loader with any (a plain ``DataLoader`` with workers does not say which worker gave a
        batch: iterate `batch_loader`'s, or torchdata's ``StatefulDataLoader``, whose own
        ``state_dict`` holds each worker's reader). Before any batch: the start of the epoch.
        Small and JSON-serialisable; `load_state_dict` on a new dataset (the same arguments,
        the same rank and number of workers) continues with exactly the batches that would
        have come next."""
        info = get_worker_info()
        if info is not None:
            # A StatefulDataLoader's worker saving its dataset beside its iterator, which holds
            # the reader's position.
            return _start(self.epoch, info.num_workers)
        if bool(self._in_workers):
            raise DatasetError(
                "state_dict() cannot follow a plain DataLoader with workers (it does not say which worker "
                "gave a batch): iterate siphon.torch.batch_loader's loader, or torchdata's "
                "StatefulDataLoader and save its state_dict()"
            )
        if self._delivered is None:
            return _start(self.epoch, 1)
        workers, readers, last = self._delivered
        return {
            "version": 1, "epoch": self.epoch, "workers": workers, "next": (last + 1) % workers,
            "readers": {str(k): v for k, v in readers.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues from `state` (`state_dict`): the next iteration resumes its epoch
        exactly. Call it before iterating."""
        if state.get("version") != 1 or not isinstance(state.get("readers"), Mapping):
            raise DatasetError(f"not a state siphon.torch.ActivationDataset saved: {dict(state)!r}")
        self.set_epoch(int(state["epoch"]))
        self._restored = dict(state)
        readers = {int(k): dict(v) for k, v in state["readers"].items()}
        self._delivered = (int(state["workers"]), readers, (int(state["next"]) - 1) % int(state["workers"]))


#: How `batch_loader` starts the DataLoader workers of a stream's dataset: not forked from a
#: process whose earlier readers left gRPC's threads running (a forked worker can block for ever
#: on a lock one of them held, gRPC's fork support notwithstanding: seen under load in CI), but
#: from a fresh server process, as Python 3.14 does by default. Pass ``multiprocessing_context``
#: to a DataLoader of your own likewise.
WORKERS_OF_A_STREAM = "forkserver"


def _opened(
    dataset: Union[Dataset, Stream, str, "os.PathLike[str]"], storage_options: Optional[Mapping[str, Any]]
) -> Union[Dataset, Stream]:
    """A dataset or stream as given, or opened from its URL (``stream://HOST:PORT``: a stream)."""
    if isinstance(dataset, (Dataset, Stream)):
        return dataset
    if str(dataset).startswith(SCHEME):
        return Stream(str(dataset))
    return open_dataset(dataset, storage_options)


def _start(epoch: int, workers: int) -> Dict[str, Any]:
    """The state at the start of `epoch`, before any reader gave a batch."""
    return {"version": 1, "epoch": epoch, "workers": workers, "next": 0, "readers": {}}


class _Reader(Iterator[Any]):
    """One reader's batches of an `ActivationDataset`: what ``iter(dataset)`` gives, in each
    DataLoader worker. Its `state_dict` / `load_state_dict` say and set where the reader
    stands, as torchdata's ``StatefulDataLoader`` asks of a dataset's iterator in each worker;
    reading starts at the first batch asked for, from the position loaded by then."""

    def __init__(
        self, dataset: ActivationDataset, where: Dict[str, Any], epoch: int, resume: Optional[Dict[str, Any]], *,
        tagged: bool, here: bool,
    ) -> None:
        self._dataset, self._where, self._epoch, self._resume = dataset, where, epoch, resume
        self._tagged, self._here = tagged, here
        self._batches: Optional[Union[Batches, StreamBatches]] = None
        hook = dataset.hooks[0]
        self._hook, self._width = hook, dataset.dataset.hooks[hook].width

    def __iter__(self) -> "_Reader":
        return self

    def __next__(self) -> Any:
        if self._batches is None:
            self._batches = self._dataset._batches(epoch=self._epoch, resume=self._resume, **self._where)
        b = next(self._batches)
        state = self._batches.state_dict()
        if self._here:
            self._dataset._delivered = (1, {0: state}, 0)
        item = b[self._hook].reshape(b[self._hook].shape[0], self._width) if self._dataset.tensors else b
        return _Tagged(item, self._where["worker"], state) if self._tagged else item

    def state_dict(self) -> Dict[str, Any]:
        """The reader's epoch and its position after the last batch it gave (``None``: the
        epoch's start)."""
        reader = self._batches.state_dict() if self._batches is not None else self._resume
        return {"version": 1, "epoch": self._epoch, "reader": reader}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues from `state` (`state_dict`); before the first batch."""
        if self._batches is not None:
            raise DatasetError("load_state_dict() must come before the reader's first batch")
        if state.get("version") != 1 or "reader" not in state:
            raise DatasetError(f"not a state a siphon reader saved: {dict(state)!r}")
        self._epoch = int(state["epoch"])
        self._resume = None if state["reader"] is None else dict(state["reader"])


class Provider(Iterator[torch.Tensor]):
    """The iterator `data_provider` returns: ``[batch_size, d]`` tensors of one hook, read by a
    `batch_loader` loader, with the dataset's `state_dict` / `load_state_dict` to stop a
    training run and continue it with exactly the batches that came next."""

    def __init__(self, dataset: ActivationDataset, num_workers: int, device: Any) -> None:
        self.dataset = dataset
        self._loader = batch_loader(dataset, num_workers=num_workers, persistent_workers=False)
        self._items: Optional[Iterator[Any]] = None
        self._device = device

    def __iter__(self) -> "Provider":
        return self

    def __next__(self) -> torch.Tensor:
        if self._items is None:
            self._items = iter(self._loader)
        x: torch.Tensor = next(self._items)
        return x if self._device is None else x.to(self._device)

    def state_dict(self) -> Dict[str, Any]:
        """Where the batches handed out so far leave the reading (`ActivationDataset.state_dict`)."""
        return self.dataset.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues from `state`; call it before the first batch."""
        if self._items is not None:
            raise DatasetError("load_state_dict() must come before the first batch")
        self.dataset.load_state_dict(state)


def data_provider(
    dataset: Union[Dataset, Stream, str, "os.PathLike[str]"],
    hook: str,
    batch_size: int = 4096,
    *,
    device: Any = None,
    dtype: Any = "float32",
    num_workers: int = 0,
    epochs: Optional[int] = None,
    **kwargs: Any,
) -> Provider:
    """An endless (by default) iterator of shuffled ``[batch_size, d]`` tensors of one hook: the
    ``data_provider`` of SAELens's ``SAETrainer`` and the ``data`` of dictionary_learning's
    ``trainSAE``. Epochs are reshuffled; with `num_workers`, a DataLoader reads in worker
    processes. Keyword arguments as `Dataset.batches` (seed, rank, world_size,
    exclude_token_ids, ...). Its `state_dict()`, saved beside the trainer's checkpoint, and
    `load_state_dict()` on a new provider resume a preempted training run exactly. From a
    live stream (`Stream`, or its ``stream://HOST:PORT``), one pass: ask the trainer for at
    most its tokens."""
    ds = ActivationDataset(dataset, [hook], batch_size=batch_size, dtype=dtype, epochs=epochs, tensors=True, **kwargs)
    return Provider(ds, num_workers, device)


def stream_provider(
    url: str,
    hook: str,
    batch_size: int = 4096,
    *,
    connect_timeout: float = 600.0,
    reconnect_timeout: float = 600.0,
    **kwargs: Any,
) -> Provider:
    """`data_provider` of a live stream (``siphon extract --output stream://HOST:PORT``):
    trained while siphon extracts, resumable from its `state_dict()` as from disk. Keyword
    arguments as `data_provider` and `Stream.batches` (rank, world_size, seed,
    shuffle_buffer_tokens, ...)."""
    opened = Stream(url, connect_timeout=connect_timeout, reconnect_timeout=reconnect_timeout)
    return data_provider(opened, hook, batch_size, **kwargs)


class _Tagged:
    """An item from a DataLoader worker with the reader that made it and its position after."""

    __slots__ = ("item", "slot", "state")

    def __init__(self, item: Any, slot: int, state: Dict[str, Any]) -> None:
        self.item, self.slot, self.state = item, slot, state


class EpochLoader(DataLoader[Any]):
    """A ``DataLoader`` of an `ActivationDataset` whose every iteration after the first reads
    the next epoch (``set_epoch(epoch + 1)`` before it starts), persistent workers included,
    and which records where each worker's reader stands, for the dataset's `state_dict`."""

    dataset: ActivationDataset

    def __init__(self, dataset: ActivationDataset, **kwargs: Any) -> None:
        if kwargs.get("num_workers", 0) > 0 and isinstance(dataset.dataset, Stream):
            kwargs.setdefault("multiprocessing_context", WORKERS_OF_A_STREAM)
        super().__init__(dataset, **kwargs)
        self._iterated = False

    def __iter__(self) -> Any:
        ds = self.dataset
        workers = max(1, self.num_workers)
        restored = ds._restored
        if self._iterated or restored is None:
            if self._iterated:
                ds.set_epoch(ds.epoch + 1)
            ds._delivered = (workers, {}, workers - 1)
        elif restored["readers"] and int(restored["workers"]) != workers:
            raise DatasetError(f"the state was saved with {restored['workers']} DataLoader workers; this loader has {workers}")
        self._iterated = True
        ds._tagged.fill_(1)
        return self._track(super().__iter__())

    def _track(self, items: Any) -> Iterator[Any]:
        try:
            for tagged in items:
                workers, readers, _ = self.dataset._delivered or (1, {}, 0)
                readers[tagged.slot] = tagged.state
                self.dataset._delivered = (workers, readers, tagged.slot)
                yield tagged.item
        finally:
            # A plain DataLoader over the same dataset later gets plain items.
            self.dataset._tagged.fill_(0)


def batch_loader(dataset: ActivationDataset, num_workers: int = 2, **kwargs: Any) -> EpochLoader:
    """``DataLoader(dataset, batch_size=None, num_workers=num_workers, ...)`` (batches are
    already built by the dataset) that moves to the next epoch at each new iteration."""
    return EpochLoader(dataset, batch_size=None, num_workers=num_workers, **kwargs)


__all__ = ["ActivationDataset", "EpochLoader", "Provider", "data_provider", "batch_loader", "stream_provider"]


class LabeledRows(TorchDataset[Tuple[torch.Tensor, Any]]):
    """``(x, y)`` pairs: row ``i`` of `x` and its label (`Dataset.labeled`)."""

    def __init__(self, x: torch.Tensor, labels: Sequence[Any]) -> None:
        if len(labels) != x.shape[0]:
            raise ValueError(f"{x.shape[0]} rows and {len(labels)} labels")
        self.x, self.labels = x, list(labels)

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, Any]:
        return self.x[i], self.labels[i]
