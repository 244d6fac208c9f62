"""`siphon extract --sae`: dictionaries saved by SAELens encode the hooks they read on the
devices, and the shards hold each stored token's firings as CSR rows. The reference is SAELens's
own `SAE.encode` run here on the hook values the same run stored in f32: the same tokens, the
same numbers in. (sparsify's and Gemma Scope's encoders are compared through the engine's tests,
`crates/engine/tests/dictionaries.rs`, whose goldens those libraries made.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import REPO, extract

DICTS = REPO / "fixtures/dictionaries"
# (directory, the hook it reads, its latents column's name)
SAES = [
    ("saelens-topk", "blocks.1.hook_resid_post", "blocks.1.hook_resid_post.hook_sae_acts_post.saelens-topk"),
    ("saelens-jumprelu", "blocks.1.hook_resid_post", "blocks.1.hook_resid_post.hook_sae_acts_post.saelens-jumprelu"),
    ("saelens-transcoder", "blocks.1.ln2.hook_normalized", "blocks.1.ln2.hook_normalized.hook_sae_acts_post"),
]
CAP = 96


def shards(run: Path) -> List[Dict[str, np.ndarray]]:
    out = []
    for host in sorted(run.glob("machine_*")):
        for line in (host / "manifest.jsonl").read_text().splitlines():
            out.append(load_file(str(host / json.loads(line)["shard"])))
    return out


def csr_dense(shard: Dict[str, np.ndarray], name: str, width: int) -> np.ndarray:
    indptr, indices, values = (shard[f"{name}.{part}"] for part in ("indptr", "indices", "values"))
    dense = np.zeros((len(indptr) - 1, width), dtype=np.float32)
    for row in range(len(indptr) - 1):
        span = slice(indptr[row], indptr[row + 1])
        assert np.all(np.diff(indices[span]) > 0), f"{name}: row {row}'s latents do not ascend"
        dense[row, indices[span]] = values[span]
    return dense


@pytest.fixture(scope="module")
def sae_run(runs: Path) -> Path:
    saes = ",".join(str(DICTS / d) for d, _, _ in SAES)
    hooks = ["blocks.1.hook_resid_post", "blocks.1.ln2.hook_normalized"]
    return extract(runs, "tiny-sae", dtype="f32", hooks=hooks, extra=["--sae", saes, "--latent-cap", str(CAP)])


def test_latents_equal_saelens_encode_of_the_stored_hooks(sae_run: Path) -> None:
    torch = pytest.importorskip("torch")
    sae_lens = pytest.importorskip("sae_lens")
    run_json = json.loads((sae_run / "run.json").read_text())
    columns = {c["name"]: c for c in run_json["latents"]}
    assert set(columns) == {name for _, _, name in SAES}
    stats = json.loads((sae_run / "stats.json").read_text())["latents"]
    for directory, hook, name in SAES:
        sae = sae_lens.SAE.load_from_disk(str(DICTS / directory), device="cpu")
        width = columns[name]["width"]
        assert width == sae.cfg.d_sae and columns[name]["hook"] == hook
        firings = np.zeros(width, dtype=np.int64)
        tokens = 0
        for shard in shards(sae_run):
            x = torch.from_numpy(shard[hook].astype(np.float32))
            with torch.no_grad():
                want = sae.encode(x).numpy()
            got = csr_dense(shard, name, width)
            scale = float(np.abs(want).max())
            assert np.abs(got - want).max() <= 1e-4 * scale, name
            # The same set of firings wherever a value is away from the threshold.
            away = np.abs(want) > 1e-4 * scale
            assert np.array_equal((got > 0) & away, (want > 0) & away), name
            firings += (got > 0).sum(axis=0)
            tokens += got.shape[0]
        assert stats[name]["count"] == tokens
        assert stats[name]["firings"] == firings.tolist(), name
        assert firings.sum() > tokens, f"{name}: the test needs tokens that fire"


def test_latents_alone_in_bf16_are_the_f32_run_rounded(sae_run: Path, runs: Path) -> None:
    """No hook stored, values in bf16: each firing of the f32 run, rounded. Shards of the
    default size (a step of no hook rows once sized the host buffers' pool by dividing by zero
    bytes)."""
    import subprocess

    import ml_dtypes

    from conftest import extract_command

    topk, hook, name = SAES[0]
    cmd, env = extract_command(runs, "tiny-sae-bf16", dtype="bf16", hooks=[], extra=["--sae", str(DICTS / topk)])
    cmd[cmd.index("--shard-size-mb") + 1] = "256"
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = runs / "tiny-sae-bf16"
    name = "blocks.1.hook_resid_post.hook_sae_acts_post"
    run_json = json.loads((run / "run.json").read_text())
    assert run_json["hooks"] == [] and run_json["latents"][0]["name"] == name
    width = run_json["latents"][0]["width"]
    f32 = np.concatenate([csr_dense(s, SAES[0][2], width) for s in shards(sae_run)])
    bf16 = np.concatenate([csr_dense(s, name, width) for s in shards(run)])
    rounded = f32.astype(ml_dtypes.bfloat16).astype(np.float32)
    # Another run of the same tokens: the same rows, and no hook tensor in its shards.
    assert bf16.shape == f32.shape
    assert np.abs(bf16 - rounded).max() <= 1e-2 * float(np.abs(f32).max())
    assert all(hook not in s for s in shards(run))


def test_a_run_killed_mid_way_resumes_to_the_same_shards(runs: Path) -> None:
    """kill -9 after the first committed shard; the same command resumes, and every shard, the
    manifest and the statistics equal an uninterrupted run's (elsewhere), byte for byte."""
    import os
    import signal
    import subprocess
    import time

    from conftest import extract_command

    from conftest import make_corpus

    topk = str(DICTS / SAES[0][0])
    corpus = runs / "tiny-sae-kill-corpus"
    make_corpus(corpus, 120)
    kwargs = dict(dtype="bf16", hooks=["blocks.1.hook_resid_post"], hosts=1, launch=False, corpus=corpus,
                  extra=["--sae", topk, "--shuffle-tokens-window", "2"])
    # The same run (its name is in every shard) in two places.
    reference = extract(runs, "kill", output=runs / "reference", **kwargs) and runs / "reference" / "kill"
    killed = runs / "killed" / "kill"
    cmd, env = extract_command(runs, "kill", output=runs / "killed", **kwargs)
    process = subprocess.Popen(cmd, env={**env, "SIPHON_TEST_SLOW_BATCH_MS": "150"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        manifest = killed / "machine_000_host_00" / "manifest.jsonl"
        deadline = time.monotonic() + 120
        while not (manifest.exists() and manifest.read_text().strip()):
            assert process.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no shard committed in time"
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = len(manifest.read_text().splitlines())
    reference_lines = len((reference / "machine_000_host_00" / "manifest.jsonl").read_text().splitlines())
    assert 1 <= lines < reference_lines, "killed mid-way"
    extract(runs, "kill", output=runs / "killed", **kwargs)

    def files(run: Path) -> Dict[str, bytes]:
        # Each session's timing (timing/) is its own.
        return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*"))
                if p.is_file() and p.relative_to(run).parts[0] != "timing"}

    got, want = files(killed), files(reference)
    assert sorted(got) == sorted(want)
    for name in want:
        # run.json records each run's --output.
        if name != "run.json":
            assert got[name] == want[name], name


def test_an_extracted_cache_exported_for_delphi_equals_delphis_own(runs: Path, tmp_path: Path) -> None:
    """`siphon extract --sae` (a sparsify dictionary, every position stored), `siphon export
    delphi`, then delphi's own LatentCache on the export's token rows with the same model and
    sparsify's own encoder (scripts/delphi_compare.py, in delphi's venv): the same firings at the
    same places, activations within float16 rounding, and delphi's loader finds every latent's
    examples."""
    import os
    import subprocess
    import sys

    from conftest import siphon_binary
    from test_delphi_export import delphi_python

    python = delphi_python()
    if python is None:
        pytest.skip("no Python with delphi (bash scripts/setup-python-delphi.sh)")
    sae = DICTS / "sparsify" / "layers.1"
    run = extract(runs, "tiny-sae-delphi", dtype="f32", hooks=[], extra=["--sae", str(sae), "--keep-excluded"])
    out = tmp_path / "latents"
    env = dict(os.environ, SIPHON_PYTHON=sys.executable, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([siphon_binary(), "export", "delphi", str(run), str(out)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    model = runs.parent / "tiny-llama-264"
    compare = [python, str(REPO / "scripts/delphi_compare.py")]
    result = subprocess.run([*compare, "compare", "--export", str(out / "layers.1"), "--model", str(model),
                             "--sae", str(sae), "--run", str(run), "--work", str(tmp_path / "delphi")],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok: the export equals delphi's own cache" in result.stdout
    assert "only in siphon's export: 0 " in result.stdout
    loads = subprocess.run([*compare, "load", str(out), "--tokenizer", str(REPO / "fixtures/data/tokenizer.json")],
                           capture_output=True, text=True, timeout=600)
    assert loads.returncode == 0, loads.stdout + loads.stderr
    assert "every latent with firings has its examples" in loads.stdout


def test_inspect_lists_each_dictionarys_latents(sae_run: Path) -> None:
    import subprocess

    from conftest import siphon_binary

    done = subprocess.run([siphon_binary(), "inspect", str(sae_run), "--json"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    stats = json.loads((sae_run / "stats.json").read_text())["latents"]
    assert [c["name"] for c in report["latents"]] == [name for _, _, name in SAES]
    for column in report["latents"]:
        s = stats[column["name"]]
        assert column["l0"] == pytest.approx(sum(s["firings"]) / s["count"])
        # A TopK keeps its k (6) whatever the larger --latent-cap.
        cap = 6 if column["name"].endswith("saelens-topk") else CAP
        assert column["dead"] == sum(f == 0 for f in s["firings"]) and column["cap"] == cap
