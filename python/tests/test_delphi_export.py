"""siphon.delphi: a run's latents as delphi's latent cache, checked against what was written
(latent_runs.py), and, when a venv with delphi is there (scripts/setup-python-delphi.sh),
loaded by delphi's own LatentDataset (scripts/delphi_compare.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

import siphon
import siphon.delphi as delphi
from latent_runs import SAE, TRANSCODER, write_run
from siphon import DatasetError
from siphon.__main__ import main

REPO = Path(__file__).resolve().parents[2]


def read_cache(folder: Path):
    """Every split of one hookpoint folder: locations with the start added back (as delphi's
    TensorBuffer does), activations, the tokens of each split, the splits."""
    files = sorted(folder.glob("*.safetensors"), key=lambda p: int(p.stem.split("_")[0]))
    locs, acts, tokens, splits = [], [], [], []
    for f in files:
        start, end = (int(x) for x in f.stem.split("_"))
        t = load_file(str(f))
        loc = t["locations"].astype(np.int64)
        loc[:, 2] += start
        assert ((loc[:, 2] >= start) & (loc[:, 2] <= end)).all()
        locs.append(loc), acts.append(t["activations"]), tokens.append(t["tokens"]), splits.append((start, end))
        assert t["activations"].dtype == np.float16 and t["tokens"].dtype == np.int64
        assert t["locations"].dtype in (np.uint16, np.uint32)
    loc, act = np.concatenate(locs), np.concatenate(acts)
    for l in locs:  # within a split, delphi's order: sequence, position, latent
        assert (np.lexsort((l[:, 2], l[:, 1], l[:, 0])) == np.arange(len(l))).all()
    order = np.lexsort((loc[:, 2], loc[:, 1], loc[:, 0]))
    return loc[order], act[order], tokens, splits


def expected(truth, *, included_only=True):
    """(sequence, position, latent) and float16 values of every firing of whole sequences."""
    dense = truth.dense[SAE]
    keep = truth.mask if included_only else np.ones(len(dense), bool)
    rows, cols = np.nonzero(dense)
    sel = keep[rows] & (np.abs(dense[rows, cols]) > 1e-5)
    rows, cols = rows[sel], cols[sel]
    seq, pos = rows // truth.seq_len, rows % truth.seq_len
    return np.stack([seq, pos, cols], 1), dense[rows, cols].astype(np.float16)


def sort_rows(loc, act):
    order = np.lexsort((loc[:, 2], loc[:, 1], loc[:, 0]))
    return loc[order], act[order]


@pytest.mark.parametrize("width,splits", [(40, 5), (16384, 5), (131072, 7), (24576, 5), (3, 5), (1000, 3), (65536, 1)])
def test_split_bounds_are_torch_linspace(width, splits):
    b = torch.linspace(0, width, steps=splits + 1).long()
    want = [(int(s), int(e)) for s, e in zip(b[:-1], b[1:] - 1)]
    assert delphi.split_bounds(width, splits) == want


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_exact_sequences_of_a_keep_excluded_run(tmp_path, dtype):
    truth = write_run(tmp_path / "run", dtype=dtype, names=(SAE, TRANSCODER), widths=(40, 24))
    out = tmp_path / "latents"
    done = delphi.export(truth.path, out, n_splits=5)
    assert done.hookpoints == {SAE: "layers.1", TRANSCODER: "layers.1.mlp"}
    assert sorted(os.listdir(out)) == ["layers.1", "layers.1.mlp"]
    assert sorted(os.listdir(out / "layers.1")) == sorted(
        ["config.json", "0_7.safetensors", "8_15.safetensors", "16_23.safetensors", "24_31.safetensors", "32_39.safetensors"])
    n_seq = len(truth.token_ids) // truth.seq_len
    assert (done.n_seq, done.ctx_len, done.sequences) == (n_seq, truth.seq_len, "exact")
    loc, act, tokens, splits = read_cache(out / "layers.1")
    want_loc, want_act = expected(truth)
    np.testing.assert_array_equal(loc, want_loc)
    np.testing.assert_array_equal(act, want_act)
    for t in tokens:  # the whole rows, BOS and padding too, in every split
        np.testing.assert_array_equal(t, truth.token_ids.reshape(n_seq, truth.seq_len))
    assert done.entries[SAE] == len(want_loc)
    assert done.left_out[SAE] == int((truth.dense[SAE] != 0).sum()) - len(want_loc)
    config = json.loads((out / "layers.1" / "config.json").read_text())
    assert {k: config[k] for k in ("cache_ctx_len", "n_tokens", "n_splits", "model_name", "dataset_repo", "batch_size")} == {
        "cache_ctx_len": truth.seq_len, "n_tokens": n_seq * truth.seq_len, "n_splits": 5, "model_name": "org/tiny",
        "dataset_repo": "org/corpus", "batch_size": 4}
    assert config["siphon"]["latents"] == SAE and config["siphon"]["sequences"] == "exact"
    # The transcoder's folder: its own splits of 24 latents.
    assert read_cache(out / "layers.1.mlp")[3] == delphi.split_bounds(24, 5)

    # Excluded tokens' latents (BOS, padding) kept when asked: all of them.
    keep = delphi.export(truth.path, tmp_path / "keep", latents=[SAE], excluded_latents="keep")
    loc, act, _, _ = read_cache(tmp_path / "keep" / "layers.1")
    want_loc, want_act = expected(truth, included_only=False)
    np.testing.assert_array_equal(loc, want_loc)
    np.testing.assert_array_equal(act, want_act)
    assert keep.left_out[SAE] == 0


def test_stored_sequences_of_a_run_without_excluded_tokens(tmp_path):
    truth = write_run(tmp_path / "run", keep_excluded=False)
    with pytest.raises(DatasetError, match="--keep-excluded"):
        delphi.export(truth.path, tmp_path / "no")
    done = delphi.export(truth.path, tmp_path / "latents", sequences="stored", ctx_len=8, n_splits=2)
    rows = len(truth.token_ids)
    n_seq = rows // 8
    assert (done.n_seq, done.ctx_len) == (n_seq, 8)
    loc, act, tokens, splits = read_cache(tmp_path / "latents" / "layers.1")
    assert splits == [(0, 19), (20, 39)]
    np.testing.assert_array_equal(tokens[0], truth.token_ids[: n_seq * 8].reshape(n_seq, 8))
    dense = truth.dense[SAE][: n_seq * 8]
    r, c = np.nonzero(dense)
    np.testing.assert_array_equal(loc, np.stack([r // 8, r % 8, c], 1))
    np.testing.assert_array_equal(act, dense[r, c].astype(np.float16))


def test_refusals_name_what_is_wrong(tmp_path):
    truth = write_run(tmp_path / "run", hosts=1)
    with pytest.raises(DatasetError, match="ctx_len 16 needs sequences='stored'"):
        delphi.export(truth.path, tmp_path / "a", ctx_len=16)
    with pytest.raises(DatasetError, match="unknown latents"):
        delphi.export(truth.path, tmp_path / "a", latents=["nope"])
    (tmp_path / "full" / "layers.1").mkdir(parents=True)
    (tmp_path / "full" / "layers.1" / "x").write_text("")
    with pytest.raises(DatasetError, match=r"layers.1: not empty \(a hookpoint's split files go into a new or empty "):
        delphi.export(truth.path, tmp_path / "full")
    shuffled = write_run(tmp_path / "shuffled", hosts=1, shuffle={"window": 4, "seed": 0})
    with pytest.raises(DatasetError, match="shuffled"):
        delphi.export(shuffled.path, tmp_path / "b", sequences="stored")
    two = write_run(tmp_path / "two", hosts=1, names=(SAE, SAE + ".other"), widths=(40, 40))
    with pytest.raises(DatasetError, match="several latents columns map to hookpoint 'layers.1'"):
        delphi.export(two.path, tmp_path / "c")
    done = delphi.export(two.path, tmp_path / "c", hookpoints={SAE + ".other": "layers.1.other"})
    assert done.hookpoints[SAE + ".other"] == "layers.1.other"


def test_sizes_are_refused_before_any_shard_is_read(tmp_path, monkeypatch):
    """--splits past the latents (4e9 took 6 GB), a row longer than the run, and a minimum
    that keeps nothing (NaN, inf) or everything (below 0) are refused naming the flag, before
    the shards' tokens are read; nothing is written."""
    truth = write_run(tmp_path / "run", hosts=1)
    tokens = siphon.open_dataset(str(truth.path)).tokens
    reads = []
    monkeypatch.setattr(delphi.ShardLoader, "load", lambda *a, **k: reads.append(a) or pytest.fail("a shard was read"))
    for kw, message in (
        ({"n_splits": 4_000_000_000}, r"n_splits \(--splits\) must be at most 40 \(the latents of '.*'\), got 4000000000"),
        ({"n_splits": 41}, r"n_splits \(--splits\) must be at most 40"),
        ({"n_splits": 0}, r"n_splits \(--splits\) must be at least 1, got 0"),
        ({"sequences": "stored", "ctx_len": tokens + 1},
         rf"ctx_len \(--ctx-len\) must be at most {tokens} \(the {tokens} tokens .* stores\), got {tokens + 1}"),
        ({"sequences": "stored", "ctx_len": 0}, r"ctx_len \(--ctx-len\) must be at least 1"),
        ({"min_activation": float("nan")}, r"min_activation \(--min-activation\) must be a finite number >= 0, got nan"),
        ({"min_activation": float("inf")}, r"min_activation \(--min-activation\) must be a finite number"),
        ({"min_activation": -1.0}, r"min_activation \(--min-activation\) must be a finite number"),
    ):
        with pytest.raises(DatasetError, match=message):
            delphi.export(truth.path, tmp_path / "out", **kw)
    assert not reads and not (tmp_path / "out").exists()


def test_uint32_locations_past_65536_sequences(tmp_path):
    truth = write_run(tmp_path / "big", keep_excluded=False, hosts=1, shards_per_host=1, seqs_per_shard=9400,
                      seq_len=8, pad_tail=0, widths=(6,), cap=1, with_hook=False)
    rows = len(truth.token_ids)
    assert rows > 65536
    delphi.export(truth.path, tmp_path / "latents", sequences="stored", ctx_len=1, n_splits=1)
    t = load_file(str(tmp_path / "latents" / "layers.1" / "0_5.safetensors"))
    assert t["locations"].dtype == np.uint32 and t["locations"][:, 0].max() >= 65536
    r, c = np.nonzero(truth.dense[SAE])
    np.testing.assert_array_equal(t["locations"].astype(np.int64), np.stack([r, np.zeros_like(r), c], 1))


def test_the_command_line(tmp_path, capsys):
    truth = write_run(tmp_path / "run", hosts=1)
    assert main(["export-delphi", str(truth.path), str(tmp_path / "out"), "--splits", "2",
                 "--hookpoint", f"{SAE}=model.layers.1"]) == 0
    printed = capsys.readouterr().out
    assert "model.layers.1" in printed and "LatentDataset(raw_dir=" in printed
    assert sorted(os.listdir(tmp_path / "out" / "model.layers.1")) == ["0_19.safetensors", "20_39.safetensors", "config.json"]
    assert main(["export-delphi", str(truth.path), str(tmp_path / "out2"), "--hookpoint", "oops"]) == 1
    assert "--hookpoint takes NAME=HOOKPOINT" in capsys.readouterr().err


def delphi_python():
    """A Python with delphi installed (SIPHON_DELPHI_PYTHON, else the venv of
    scripts/setup-python-delphi.sh), or None."""
    for candidate in (os.environ.get("SIPHON_DELPHI_PYTHON"),
                      str(Path.home() / ".cache/siphon/venvs/delphi/bin/python")):
        if candidate and os.access(candidate, os.X_OK):
            probe = subprocess.run([candidate, "-c", "import delphi.latents"], capture_output=True)
            if probe.returncode == 0:
                return candidate
    return None


@pytest.mark.parametrize("sequences", ["exact", "stored"])
def test_delphi_loads_the_export(tmp_path, sequences):
    python = delphi_python()
    if python is None:
        pytest.skip("no Python with delphi (bash scripts/setup-python-delphi.sh)")
    truth = write_run(tmp_path / "run", seq_len=32, seqs_per_shard=4, keep_excluded=sequences == "exact",
                      names=(SAE, TRANSCODER), widths=(40, 24), cap=8)
    out = tmp_path / "latents"
    delphi.export(truth.path, out, sequences=sequences, ctx_len=32 if sequences == "stored" else None)
    result = subprocess.run(
        [python, str(REPO / "scripts/delphi_compare.py"), "load", str(out), "--tokenizer", str(REPO / "fixtures/data/tokenizer.json")],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every latent with firings has its examples" in result.stdout


def hf_latents(token_rows, sae_dir, module, transcode):
    """What delphi's LatentCache computes: the fixture model's (HF AutoModel) `module` output
    (its input for a transcoder) encoded by the SAELens dictionary, dense, every row."""
    from sae_lens import SAE
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(REPO / "fixtures/models/tiny-llama"), dtype=torch.float32).eval()
    sae = SAE.load_from_disk(str(REPO / sae_dir), device="cpu")
    got = {}

    def hook(_, args, output):
        got["x"] = args[0] if transcode else (output[0] if isinstance(output, tuple) else output)

    handle = model.get_submodule(module).register_forward_hook(hook)
    with torch.no_grad():
        model(torch.from_numpy(token_rows.astype(np.int64)))
        latents = sae.encode(got["x"])
    handle.remove()
    return latents.reshape(-1, latents.shape[-1]).numpy()


@pytest.mark.parametrize("excluded", ["drop", "keep"])
def test_matches_delphis_own_cache(tmp_path, excluded):
    """A run holding the latents delphi's LatentCache computes (the fixture model and SAELens
    dictionaries, computed here as delphi does), exported, equals delphi's own cache of the
    export's rows (scripts/delphi_compare.py compare): the rows rebuilt from sample_index and
    position, the locations, float16 activations. The end-to-end check on `siphon extract
    --sae` runs the same comparison on a run siphon computed."""
    python = delphi_python()
    if python is None:
        pytest.skip("no Python with delphi (bash scripts/setup-python-delphi.sh)")
    seqs, seq_len = 2 * 2 * 3, 32
    rows = np.random.default_rng(5).integers(4, 250, (seqs, seq_len))
    rows[:, 0] = 1  # BOS, as the run stores it (masked)
    dicts = {SAE: ("fixtures/dictionaries/saelens-topk", "layers.1", False),
             TRANSCODER: ("fixtures/dictionaries/saelens-transcoder", "layers.1.mlp", True)}
    latents = {name: hf_latents(rows, d, m, t) for name, (d, m, t) in dicts.items()}
    truth = write_run(tmp_path / "run", dtype="f32", hosts=2, shards_per_host=2, seqs_per_shard=3, seq_len=seq_len,
                      names=tuple(dicts), widths=(96, 96), pad_tail=0, token_rows=rows, latents=latents)
    out = tmp_path / "latents"
    delphi.export(truth.path, out, excluded_latents=excluded)
    for name, (sae_dir, module, _) in dicts.items():
        cmd = [python, str(REPO / "scripts/delphi_compare.py"), "compare", "--export", str(out / module),
               "--model", str(REPO / "fixtures/models/tiny-llama"), "--sae", str(REPO / sae_dir),
               "--work", str(tmp_path / "delphi" / excluded)]
        if excluded == "drop":
            cmd += ["--run", str(truth.path)]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "ok: the export equals delphi's own cache" in result.stdout
        assert "only in siphon's export: 0 " in result.stdout


def test_siphon_export_delphi_command(tmp_path):
    """`siphon export delphi` (the Rust binary) runs the same export through this Python."""
    import sys

    from conftest import siphon_binary

    truth = write_run(tmp_path / "run", hosts=1)
    env = dict(os.environ, SIPHON_PYTHON=sys.executable, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [siphon_binary(), "export", "delphi", str(truth.path), str(tmp_path / "out"), "--splits", "2",
         "--hookpoint", f"{SAE}=layers.7", "--keep-excluded-latents", "--min-activation", "0.5"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "out" / "layers.7")) == ["0_19.safetensors", "20_39.safetensors", "config.json"]
    config = json.loads((tmp_path / "out" / "layers.7" / "config.json").read_text())
    assert config["siphon"]["excluded_latents"] == "keep" and config["siphon"]["min_activation"] == 0.5
    bad = subprocess.run([siphon_binary(), "export", "delphi", str(truth.path), str(tmp_path / "x"), "--latents", "nope"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "unknown latents 'nope'" in bad.stderr
    # The 6 GB case of issue 67: refused at once, naming the flag.
    start = time.monotonic()
    bad = subprocess.run([siphon_binary(), "export", "delphi", str(truth.path), str(tmp_path / "x"), "--splits",
                          "4000000000"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "--splits" in bad.stderr and "at most 40" in bad.stderr, bad.stderr
    assert time.monotonic() - start < 10 and not (tmp_path / "x").exists()


def test_hookpoints_are_the_modules_delphi_hooks():
    from siphon.latents import LatentsInfo

    assert delphi.delphi_hookpoint("blocks.3.hook_resid_post", "llama") == "layers.3"
    assert delphi.delphi_hookpoint("blocks.3.hook_resid_post", "gpt2") == "h.3"
    assert delphi.delphi_hookpoint("blocks.3.hook_resid_pre", "qwen2") == "layers.2"
    assert delphi.delphi_hookpoint("blocks.3.ln2.hook_normalized", "llama", transcoder=True) == "layers.3.mlp"
    assert delphi.delphi_hookpoint("blocks.3.hook_mlp_out", "gemma2") == "layers.3.post_feedforward_layernorm"
    assert delphi.delphi_hookpoint("blocks.3.hook_attn_out", "gpt_neox") == "layers.3.attention"
    assert delphi.delphi_hookpoint("blocks.3.attn.hook_z", "llama") is None
    assert delphi.delphi_hookpoint("hook_embed", "llama") is None

    def info(**dictionary):
        return LatentsInfo("n", "blocks.1.ln2.hook_normalized", 96, None, "float32", dictionary)

    # extract --sae describes a dictionary by its source folder: its cfg.json says what it is.
    assert delphi.is_transcoder(info(source=str(REPO / "fixtures/dictionaries/saelens-transcoder")))
    assert delphi.is_transcoder(info(source=str(REPO / "fixtures/dictionaries/sparsify-transcoder/layers.1.mlp")))
    assert not delphi.is_transcoder(info(source=str(REPO / "fixtures/dictionaries/saelens-topk")))
    assert delphi.is_transcoder(info(architecture="jumprelu_transcoder"))
    assert not delphi.is_transcoder(info())
