"""Checkpoints wherever the training loop runs: a loop over `ActivationDataset` itself, a
plain ``DataLoader`` without workers, and torchdata's ``StatefulDataLoader`` with 0, 1 or 2
workers. Stopped after N batches (in the first epoch or the second) and restored into a new
dataset or loader, the batches that follow are the uninterrupted run's."""

from __future__ import annotations

import json
import pickle
from typing import Any, Callable, Iterable, List, Tuple

import pytest
import torch
from torch.utils.data import DataLoader

import siphon
import siphon.torch

HOOK = "blocks.0.hook_resid_post"
EPOCHS = 2
Key = Tuple[Any, ...]


def dataset(run: Any) -> siphon.torch.ActivationDataset:
    return siphon.torch.ActivationDataset(run, [HOOK], batch_size=40, seed=3, unit_tokens=100, shuffle_buffer_tokens=200)


def key(b: Any) -> Key:
    return (tuple(b["token_ids"].tolist()), tuple(b["position"].tolist()), b[HOOK].view(torch.int16).sum().item())


def epochs_of(ds: siphon.torch.ActivationDataset, batches: Callable[[], Iterable[Any]], first: int) -> Iterable[Any]:
    """The training loop: `set_epoch` then the epoch's batches, from epoch `first`."""
    for e in range(first, EPOCHS):
        ds.set_epoch(e)
        yield from batches()


def check_resumes(run: Any, loader: Callable[[siphon.torch.ActivationDataset], Any], save: Callable[[Any, Any], Any],
                  load: Callable[[Any, Any, Any], None]) -> None:
    """`save(ds, loader)` after N batches; `load(ds, loader, state)` into new ones; the batches
    that follow are the uninterrupted run's."""
    ds = dataset(run)
    it = loader(ds)
    whole: List[Key] = [key(b) for b in epochs_of(ds, lambda: it, 0)]
    per_epoch = len(whole) // EPOCHS
    assert per_epoch > 3 and len(whole) == EPOCHS * per_epoch
    for stop in [1, per_epoch // 2 + 1, per_epoch, per_epoch + 2]:
        ds = dataset(run)
        it = loader(ds)
        got, state, epoch = [], None, 0
        for b in epochs_of(ds, lambda: it, 0):
            got.append(key(b))
            if len(got) == stop:
                state, epoch = save(ds, it), ds.epoch
                break
        assert got == whole[:stop]
        resumed = dataset(run)
        it = loader(resumed)
        load(resumed, it, state)
        rest = [key(b) for b in epochs_of(resumed, lambda: it, epoch)]
        assert got + rest == whole, f"stopped after {stop} of {len(whole)}"


@pytest.mark.parametrize("how", ["dataset", "dataloader"])
def test_a_loop_without_workers_checkpoints_through_the_dataset(bf16_run, how):
    def loader(ds):
        return ds if how == "dataset" else DataLoader(ds, batch_size=None)

    def save(ds, _):
        return json.loads(json.dumps(ds.state_dict()))

    def load(ds, _, state):
        ds.load_state_dict(state)

    check_resumes(bf16_run, loader, save, load)


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_torchdatas_stateful_dataloader_checkpoints_with_workers(bf16_run, workers):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def loader(ds):
        return stateful.StatefulDataLoader(ds, batch_size=None, num_workers=workers)

    def save(_, it):
        return pickle.loads(pickle.dumps(it.state_dict()))

    def load(_, it, state):
        it.load_state_dict(state)

    check_resumes(bf16_run, loader, save, load)


def test_a_plain_dataloader_with_workers_is_refused_by_name(bf16_run):
    ds = dataset(bf16_run)
    assert ds.state_dict()["readers"] == {}, "before any batch: the start of the epoch"
    for _ in DataLoader(ds, batch_size=None, num_workers=1):
        break
    with pytest.raises(siphon.DatasetError, match="StatefulDataLoader"):
        ds.state_dict()
    # The dataset iterated in this process again: its state follows.
    next(iter(ds))
    assert ds.state_dict()["readers"]["0"]["offset"] >= 0
