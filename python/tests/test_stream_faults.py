"""A live stream's faults and checkpoints, on 127.0.0.1: a producer killed (-9) and restarted,
a consumer killed (-9) and restarted from its checkpoint, and a reader's state saved after a
third of the stream and restored into a fresh one (iterated directly, under a DataLoader
without workers, under `batch_loader` and under torchdata's StatefulDataLoader with 2 workers)
each deliver exactly the batches an uninterrupted stream does; a producer that does not come
back ends the stream with an error naming it, and a producer waits, holding its bounded
buffer, while its consumer pauses."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Tuple

import numpy as np
import pytest

import siphon
import siphon.torch
from siphon.stream import Stream
from conftest import HOOKS, REPO, Producer, make_corpus

pytest.importorskip("grpc")

HOOK = HOOKS[0]
Key = Tuple[Any, ...]
def slow(ms: int) -> Dict[str, str]:
    """Slows each producer step so that a kill lands mid-stream, on slow machines too."""
    return {"SIPHON_TEST_SLOW_BATCH_MS": str(ms)}


def key(b: Any) -> Key:
    """A batch, comparable across runs: its tokens, positions and the bits of its first hook."""
    x = b[HOOK]
    if not isinstance(x, np.ndarray):  # a torch tensor, bf16 included
        x = x.contiguous().view(-1).view(__import__("torch").uint8).numpy()
    bits = np.ascontiguousarray(x).view(np.uint8).tobytes()
    return tuple(np.asarray(b["token_ids"]).tolist()), tuple(np.asarray(b["position"]).tolist()), bits


@pytest.fixture(scope="module")
def corpus(runs: Path) -> Path:
    path = runs / "stream-faults-corpus"
    make_corpus(path, 80, seed=5)
    return path


def read(url: str, rank: int, world: int, out: List[Key], errors: List[BaseException], **kwargs: Any) -> None:
    """Consumer `rank` of `world`: every batch's key into `out` (a thread's body)."""
    try:
        for b in siphon.stream(url, [HOOK], batch_size=24, rank=rank, world_size=world, seed=rank, dtype="raw",
                               connect_timeout=120, **kwargs):
            out.append(key(b))
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


def uninterrupted(runs: Path, corpus: Path, run: str, world: int) -> List[List[Key]]:
    """Each consumer's batches from a stream nobody interrupts."""
    got: List[List[Key]] = [[] for _ in range(world)]
    errors: List[BaseException] = []
    with Producer(runs, corpus, run, launch=False) as producer:
        threads = [threading.Thread(target=read, args=(producer.url, r, world, got[r], errors)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert producer.process.wait(timeout=60) == 0, producer.log()[-3000:]
    assert not errors, errors
    assert all(len(g) > 6 for g in got), [len(g) for g in got]
    return got


def test_a_producer_killed_and_restarted_delivers_every_batch_once(runs, corpus):
    want = uninterrupted(runs, corpus, "faults-producer", 2)
    got: List[List[Key]] = [[], []]
    errors: List[BaseException] = []
    with Producer(runs, corpus, "faults-producer", launch=False, env=slow(150)) as first:
        threads = [threading.Thread(target=read, args=(first.url, r, 2, got[r], errors),
                                    kwargs={"reconnect_timeout": 120}) for r in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while len(got[0]) < 3 and time.monotonic() < deadline and not errors:
            time.sleep(0.02)
        first.process.kill()
        first.process.wait()
        taken = [len(g) for g in got]
        assert 3 <= taken[0] < len(want[0]), taken
        with Producer(runs, corpus, "faults-producer", url=first.url, launch=False) as again:
            for t in threads:
                t.join(timeout=300)
            assert again.process.wait(timeout=60) == 0, again.log()[-3000:]
            log = again.log()
    assert not errors, errors
    assert got == want
    # The restarted producer made its batches from where the consumers stood, not from the start.
    assert "every consumer pulls first=" in log and "every consumer pulls first=0 " not in log, log[-3000:]


CONSUMER = r"""
import json, os, sys
import numpy as np
import siphon
url, log, hook = sys.argv[1:4]
lines = [json.loads(l) for l in open(log).read().splitlines() if l.endswith("}")] if os.path.exists(log) else []
state = lines[-1]["state"] if lines else None
batches = siphon.stream(url, [hook], batch_size=24, seed=7, dtype="raw", connect_timeout=120, resume=state)
with open(log, "a") as f:
    for b in batches:
        bits = np.ascontiguousarray(np.asarray(b[hook])).view(np.uint8)
        line = {"ids": np.asarray(b["token_ids"]).tolist(), "bits": bits.tobytes().hex(), "state": batches.state_dict()}
        f.write(json.dumps(line) + "\n")
        f.flush()
"""


def test_a_consumer_killed_and_restarted_from_its_checkpoint_gets_the_same_batches(runs, corpus, tmp_path):
    log = tmp_path / "consumer.jsonl"

    def consumer() -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
        return subprocess.Popen([sys.executable, "-c", CONSUMER, producer.url, str(log), HOOK], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def lines() -> List[Dict[str, Any]]:
        text = log.read_text() if log.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    with Producer(runs, corpus, "faults-consumer", launch=False) as producer:
        whole = consumer()
        out, _ = whole.communicate(timeout=300)
        assert whole.returncode == 0, out[-3000:]
        assert producer.process.wait(timeout=60) == 0
    want = [(line["ids"], line["bits"]) for line in lines()]
    assert len(want) > 6
    log.unlink()
    with Producer(runs, corpus, "faults-consumer", launch=False, env=slow(300)) as producer:
        first = consumer()
        deadline = time.monotonic() + 120
        while len(lines()) < 4 and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.02)
        first.kill()
        first.wait()
        assert 4 <= len(lines()) < len(want), len(lines())
        again = consumer()
        out, _ = again.communicate(timeout=300)
        assert again.returncode == 0, out[-3000:]
        assert producer.process.wait(timeout=60) == 0, producer.log()[-3000:]
    assert [(line["ids"], line["bits"]) for line in lines()] == want


def test_a_producer_that_does_not_come_back_ends_the_stream_with_an_error_naming_it(runs, corpus):
    got: List[Key] = []
    errors: List[BaseException] = []
    with Producer(runs, corpus, "faults-gone", launch=False, env=slow(150)) as producer:
        reader = threading.Thread(target=read, args=(producer.url, 0, 1, got, errors), kwargs={"reconnect_timeout": 2})
        reader.start()
        while not got and not errors:
            time.sleep(0.02)
        producer.process.kill()
        reader.join(timeout=60)
    assert len(errors) == 1 and isinstance(errors[0], siphon.DatasetError), errors
    host = producer.url[len("stream://"):]
    assert f"the host on {host} (host 0): it broke off" in str(errors[0]), errors[0]
    assert "was not back within 2 s" in str(errors[0])


def test_a_producer_waits_holding_its_buffer_while_its_consumer_pauses(runs, tmp_path):
    """A consumer process stopped (SIGSTOP) after its first batch: the producer fills its
    `--stream-buffer` and the connection's buffers, then waits instead of making more batches,
    and, the consumer paused past its patience, fails saying so. Batches of 8 MB, so that the
    connection's buffers hold few of them."""
    corpus = tmp_path / "corpus"
    make_corpus(corpus, 24000, seed=3)
    # 256 tokens are past the tiny model's 128 positions: allowed explicitly (only the bytes matter here).
    extra = ["--batch-size", "64", "--seq-len", "256", "--allow-long-context", "--stream-buffer", "2",
             "--stream-keep", "1", "--store-timeout", "4"]
    log = tmp_path / "consumer.jsonl"
    with Producer(runs, corpus, "faults-pause", launch=False, extra=extra) as producer:
        env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
        consumer = subprocess.Popen([sys.executable, "-c", CONSUMER, producer.url, str(log), HOOK], env=env)
        try:
            deadline = time.monotonic() + 120
            while not (log.exists() and log.read_text().endswith("\n")) and time.monotonic() < deadline:
                time.sleep(0.02)
            consumer.send_signal(signal.SIGSTOP)
            code = producer.process.wait(timeout=120)
            out = producer.log()
        finally:
            consumer.kill()
            consumer.wait()
    assert code != 0 and "no consumer took a batch of the stream" in out and "(2 batches wait" in out, out[-3000:]
    assert "stream finished" not in out


Loop = Callable[[siphon.torch.ActivationDataset], Any]


def stream_dataset(url: str) -> siphon.torch.ActivationDataset:
    return siphon.torch.ActivationDataset(Stream(url, connect_timeout=120), [HOOK], batch_size=24, seed=3,
                                          shuffle_buffer_tokens=72)


LOOPS: Dict[str, Tuple[Loop, Callable[[Any, Any], Any], Callable[[Any, Any, Any], None]]] = {
    "dataset": (lambda ds: ds, lambda ds, _: ds.state_dict(), lambda ds, _, s: ds.load_state_dict(s)),
    "dataloader": (
        lambda ds: __import__("torch").utils.data.DataLoader(ds, batch_size=None),
        lambda ds, _: ds.state_dict(),
        lambda ds, _, s: ds.load_state_dict(s),
    ),
    "batch_loader": (
        lambda ds: siphon.torch.batch_loader(ds, num_workers=2),
        lambda ds, _: ds.state_dict(),
        lambda ds, _, s: ds.load_state_dict(s),
    ),
    "stateful_dataloader_2_workers": (
        # A worker that waits past 300 s for a batch fails the test rather than hanging CI (seen
        # once under heavy load: the main process waiting on its workers' queue for good).
        lambda ds: __import__("torchdata.stateful_dataloader").stateful_dataloader.StatefulDataLoader(
            ds, batch_size=None, num_workers=2, timeout=300, multiprocessing_context=siphon.torch.WORKERS_OF_A_STREAM),
        lambda _, it: it.state_dict(),
        lambda _, it, s: it.load_state_dict(s),
    ),
}


@pytest.mark.parametrize("how", list(LOOPS))
def test_a_stream_state_saved_after_a_third_continues_exactly_in_a_fresh_reader(runs, corpus, how):
    """The stream read whole, its state saved after each batch; a fresh reader restored from
    the state after a third of the batches, served by the producer run again (which makes the
    batches again from where the state stands), gives the remaining two thirds."""
    if how.startswith("stateful"):
        pytest.importorskip("torchdata.stateful_dataloader")
    make, save, load = LOOPS[how]
    run = f"faults-state-{how}"
    with Producer(runs, corpus, run, launch=False) as producer:
        ds = stream_dataset(producer.url)
        it = make(ds)
        whole: List[Key] = []
        states: List[bytes] = []
        for b in it:
            whole.append(key(b))
            states.append(pickle.dumps(save(ds, it)))
        assert producer.process.wait(timeout=60) == 0, producer.log()[-3000:]
    stop = len(whole) // 3
    assert stop >= 2
    with Producer(runs, corpus, run, launch=False) as producer:
        resumed = stream_dataset(producer.url)
        it = make(resumed)
        load(resumed, it, pickle.loads(states[stop - 1]))
        rest = [key(b) for b in it]
        assert producer.process.wait(timeout=60) == 0, producer.log()[-3000:]
    assert whole[:stop] + rest == whole


def make_pki(dest: Path) -> Dict[str, Path]:
    """A CA and a certificate it signed for localhost and 127.0.0.1 (openssl)."""
    files = {name: dest / name for name in ("ca.pem", "ca.key", "host.pem", "host.key", "host.csr", "san.ext")}
    files["san.ext"].write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for cmd in (
        ["req", "-x509", *ec, "-keyout", files["ca.key"], "-out", files["ca.pem"], "-days", "1", "-subj", "/CN=test-ca"],
        ["req", *ec, "-keyout", files["host.key"], "-out", files["host.csr"], "-subj", "/CN=localhost"],
        ["x509", "-req", "-in", files["host.csr"], "-CA", files["ca.pem"], "-CAkey", files["ca.key"],
         "-CAcreateserial", "-out", files["host.pem"], "-days", "1", "-extfile", files["san.ext"]],
    ):
        subprocess.run(["openssl", *map(str, cmd)], check=True, capture_output=True)
    return files


def test_over_tls_a_reader_needs_the_ca_and_the_job_token(runs, corpus, tmp_path):
    """The job's token and TLS material (the coordinator's flags, here their variables) close
    the stream as they close the control plane."""
    if subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        pytest.skip("openssl makes the test's certificates")
    pki = make_pki(tmp_path)
    env = {"SIPHON_JOB_TOKEN": "job-secret", "SIPHON_COORDINATOR_CA": str(pki["ca.pem"]),
           "SIPHON_COORDINATOR_CERT": str(pki["host.pem"]), "SIPHON_COORDINATOR_KEY": str(pki["host.key"])}
    with Producer(runs, corpus, "faults-tls", launch=False, env=env) as producer:
        with pytest.raises(siphon.DatasetError, match="refused the reader: missing or wrong job token"):
            siphon.stream(producer.url, token="guess", ca=str(pki["ca.pem"]), tls_name="localhost", connect_timeout=120)
        with pytest.raises(siphon.DatasetError, match="no stream served at .* within 3 s"):
            siphon.stream(producer.url, token="job-secret", connect_timeout=3)
        got = list(siphon.stream(producer.url, [HOOK], token="job-secret", ca=str(pki["ca.pem"]), tls_name="localhost",
                                 batch_size=24, dtype="raw", connect_timeout=120))
        assert producer.process.wait(timeout=60) == 0, producer.log()[-3000:]
    assert sum(len(b["token_ids"]) for b in got) > 500
