"""A live stream (`siphon extract --output stream://127.0.0.1:PORT`) from 1 and 2 hosts, read
by 1 and 2 consumers, holds the tokens, and the activations, that the same command writes to
disk; SAELens trains from it as from disk."""

from __future__ import annotations

import re
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

import siphon
from siphon.stream import _messages
from conftest import HOOKS, REPO, Producer, _free_port, _free_ports, extract, extract_command, make_corpus

pytest.importorskip("grpc")


def rows(batches: List[Any]) -> Counter:
    """Each row as (token id, position, its hooks' bf16 bits): a multiset comparable across
    orders."""
    out: Counter = Counter()
    for b in batches:
        hooks = [np.asarray(b[h]).reshape(len(b["token_ids"]), -1).view(np.uint16) for h in HOOKS]
        for i, (t, p) in enumerate(zip(b["token_ids"].tolist(), b["position"].tolist())):
            out[(t, p) + tuple(bytes(h[i]) for h in hooks)] += 1
    return out


@pytest.fixture(scope="module")
def corpus(runs: Path) -> Path:
    path = runs / "stream-corpus"
    make_corpus(path, 120, seed=11)
    return path


def disk(runs: Path, corpus: Path, hosts: int) -> Path:
    """The streams' command with `hosts` hosts, writing to disk (once)."""
    run = runs / f"stream-disk-{hosts}"
    return run if run.exists() else extract(runs, run.name, hosts=hosts, corpus=corpus)


@pytest.fixture(scope="module")
def disk_run(runs: Path, corpus: Path) -> Path:
    return disk(runs, corpus, 1)


def on_disk(runs: Path, corpus: Path, hosts: int) -> Counter:
    return rows(list(siphon.open_dataset(disk(runs, corpus, hosts)).batches(batch_size=64, shuffle=False, dtype="raw")))


@pytest.mark.parametrize("consumers", [1, 2])
@pytest.mark.parametrize("hosts", [1, 2])
def test_a_live_stream_holds_what_the_same_command_writes_to_disk(runs, corpus, hosts, consumers):
    want = on_disk(runs, corpus, hosts)
    got: Dict[int, List[Any]] = {}
    errors: List[BaseException] = []
    with Producer(runs, corpus, f"stream-live-{hosts}-{consumers}", hosts) as producer:

        def consume(rank: int) -> None:
            try:
                got[rank] = list(siphon.stream(producer.url, batch_size=24, rank=rank, world_size=consumers, seed=rank,
                                               dtype="raw", connect_timeout=120))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=consume, args=(r,)) for r in range(consumers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        log = producer.log()
    assert not errors, errors
    assert producer.process.returncode == 0, log[-4000:]
    assert log.count("stream finished") == hosts
    # Every row once over the consumers, each a full batch but for its last.
    assert sum((rows(got[r]) for r in range(consumers)), Counter()) == want
    for r in range(consumers):
        assert all(len(b["token_ids"]) == 24 for b in got[r][:-1]), [len(b["token_ids"]) for b in got[r]]
    assert not (runs / f"stream-live-{hosts}-{consumers}").exists(), "nothing is written to disk"


def test_bad_streams_are_refused_by_name(runs):
    with pytest.raises(siphon.DatasetError, match="not a stream"):
        siphon.stream(str(runs))
    with pytest.raises(siphon.DatasetError, match="no stream served at"):
        siphon.stream(f"stream://127.0.0.1:{_free_port()}", connect_timeout=1)
    with pytest.raises(siphon.DatasetError, match="out of range"):
        siphon.stream("stream://127.0.0.1:1", rank=2, world_size=2)


def test_the_messages_are_those_of_the_proto():
    """The Python side builds its messages from a descriptor: the same fields, numbers and
    types as crates/stream/proto/stream.proto."""
    proto = (REPO / "crates/stream/proto/stream.proto").read_text()
    declared = {
        name: sorted((int(n), f, t) for t, f, n in re.findall(r"(\w+) (\w+) = (\d+);", body))
        for name, body in re.findall(r"message (\w+) \{([^}]*)\}", proto)
    }
    kinds = {"string": 9, "uint32": 13, "uint64": 4, "bytes": 12}
    built = {
        name: sorted((f.number, f.name, next(k for k, v in kinds.items() if v == f.type)) for f in cls.DESCRIPTOR.fields)
        for name, cls in _messages().items()
    }
    assert built == declared


def test_saelens_trains_from_a_live_stream_as_from_the_same_tokens_on_disk(runs, corpus, disk_run):
    """A TopK SAE trained by SAELens's SAETrainer from the stream reaches the FVU of the same
    training from the same tokens on disk, within the spread of two disk runs' shuffles."""
    pytest.importorskip("sae_lens")
    import torch
    from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.config import SAETrainerConfig
    from sae_lens.training.sae_trainer import SAETrainer

    import siphon.torch

    hook, batch, steps = HOOKS[0], 128, 32

    def trained(provider: Any) -> Any:
        torch.manual_seed(0)
        sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=64, d_sae=128, k=8))
        cfg = SAETrainerConfig(total_training_samples=batch * steps, train_batch_size_samples=batch, lr=1e-2,
                               lr_end=1e-2, device="cpu", n_batches_for_norm_estimate=2)
        return SAETrainer(cfg, sae, data_provider=provider).fit()

    x = next(siphon.torch.data_provider(disk_run, hook, batch_size=2048, seed=99))

    def fvu(sae: Any) -> float:
        with torch.no_grad():
            return float(((sae(x) - x) ** 2).sum() / ((x - x.mean(0)) ** 2).sum())

    disk = [fvu(trained(siphon.torch.data_provider(disk_run, hook, batch_size=batch, seed=s))) for s in (1, 2)]
    with Producer(runs, corpus, "stream-saelens") as producer:
        live = fvu(trained(siphon.torch.stream_provider(producer.url, hook, batch_size=batch, seed=1,
                                                        connect_timeout=120)))
        producer.process.kill()  # the trainer took what it needed; the rest of the stream is not read
    assert live < 0.5, f"the SAE learned little: FVU {live}"
    assert abs(live - disk[0]) <= 3 * abs(disk[0] - disk[1]) + 0.02, (live, disk)


def test_an_fp8_stream_gives_the_disk_runs_dequantized_values(runs, corpus):
    """fp8 (values and a scale per token row, quantized on the device): the stream's rows,
    dequantized, are the disk run's."""
    from conftest import FP8_HOOKS

    run = runs / "stream-disk-fp8"
    if not run.exists():
        extract(runs, run.name, hosts=1, corpus=corpus, dtype="fp8", hooks=FP8_HOOKS)

    def keyed(batches: List[Any]) -> Counter:
        out: Counter = Counter()
        for b in batches:
            values = [np.asarray(b[h], dtype=np.float32).reshape(len(b["token_ids"]), -1) for h in FP8_HOOKS]
            for i, (t, p) in enumerate(zip(b["token_ids"].tolist(), b["position"].tolist())):
                out[(t, p) + tuple(v[i].tobytes() for v in values)] += 1
        return out

    want = keyed(list(siphon.open_dataset(run).batches(batch_size=64, shuffle=False)))
    url = f"stream://127.0.0.1:{_free_port()}"
    cmd, env = extract_command(runs, "stream-live-fp8", hosts=1, corpus=corpus, dtype="fp8", hooks=FP8_HOOKS, output=url)
    producer = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        got = keyed(list(siphon.stream(url, batch_size=32, connect_timeout=120)))
        log, _ = producer.communicate(timeout=120)
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait()
    assert producer.returncode == 0, log[-4000:]
    assert sum(want.values()) > 1000 and got == want


def test_hosts_listening_everywhere_are_reached_at_the_host_the_reader_was_given(runs, corpus):
    """`stream://0.0.0.0:PORT` on 2 hosts of one VM: the description keeps the wildcard (the
    coordinator is on this VM's loopback) and readers reach every host at their URL's host."""
    port = _free_ports(2)
    with Producer(runs, corpus, "stream-wildcard", hosts=2, url=f"stream://0.0.0.0:{port}") as producer:
        opened = siphon.Stream(f"stream://127.0.0.1:{port}", connect_timeout=120)
        assert opened.run["producers"] == [f"0.0.0.0:{port}", f"0.0.0.0:{port + 1}"]
        assert opened.producers == [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"]
        got = rows(list(opened.batches(batch_size=24, dtype="raw")))
        assert producer.process.wait(timeout=120) == 0, producer.log()[-3000:]
    assert got == on_disk(runs, corpus, 2)


def test_a_stream_of_two_machines_holds_what_they_write_to_disk(runs, corpus):
    """Two machines (each with its own coordinator, here one host each), read through one host
    of each: exactly the rows the two write to disk; one machine's address alone is refused."""

    def machine(m: int) -> List[str]:
        return ["--machine-id", str(m), "--total-machines", "2"]

    disk_run = runs / "stream-machines-disk"
    if not disk_run.exists():
        commands = [extract_command(runs, disk_run.name, hosts=1, corpus=corpus, launch=False, extra=machine(m))
                    for m in range(2)]
        writers = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                   for cmd, env in commands]
        assert [w.wait(timeout=300) for w in writers] == [0, 0]
    want = rows(list(siphon.open_dataset(disk_run).batches(batch_size=64, shuffle=False, dtype="raw")))
    got: Dict[int, List[Any]] = {}
    producers = [Producer(runs, corpus, "stream-machines-live", launch=False, extra=machine(m)) for m in range(2)]
    try:
        one = producers[1].url
        with pytest.raises(siphon.DatasetError, match="streams from 2 machine"):
            siphon.Stream(one, connect_timeout=120)
        url = producers[0].url + "," + one[len("stream://"):]
        threads = [threading.Thread(target=lambda r=r: got.__setitem__(
            r, list(siphon.stream(url, batch_size=24, rank=r, world_size=2, dtype="raw", connect_timeout=120))))
            for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert [p.process.wait(timeout=120) for p in producers] == [0, 0]
    finally:
        for p in producers:
            p.__exit__()
    assert sum((rows(got[r]) for r in range(2)), Counter()) == want


def test_a_mesh_spanning_hosts_streams_each_data_groups_rows(runs, corpus):
    """A 2d mesh (data 2 × fsdp 2 × model 2) over 4 hosts, simulated in one process: the host
    that writes for each of the 2 data groups serves that group's stream (on PORT and PORT+1),
    and the two hold exactly the rows the same command writes to disk."""
    mesh = ["--simulate-hosts", "4", "--cpu-devices", "8", "--mesh", "2d", "--data", "2", "--fsdp", "2",
            "--model-parallel", "2"]
    disk_run = runs / "stream-mesh-disk"
    if not disk_run.exists():
        extract(runs, disk_run.name, hosts=1, corpus=corpus, launch=False, extra=mesh)
    want = rows(list(siphon.open_dataset(disk_run).batches(batch_size=64, shuffle=False, dtype="raw")))
    url = f"stream://127.0.0.1:{_free_ports(2)}"
    with Producer(runs, corpus, "stream-mesh-live", url=url, launch=False, extra=mesh) as producer:
        opened = siphon.Stream(url, connect_timeout=120)
        assert len(opened.producers) == 2
        got = rows(list(opened.batches(batch_size=24, dtype="raw")))
        assert producer.process.wait(timeout=120) == 0, producer.log()[-3000:]
    assert got == want
