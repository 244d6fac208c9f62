"""fp8 runs (``siphon extract --dtype fp8``): float8_e4m3fn values with one float32 scale per
token row in ``{hook}.fp8_scale``. The reader's values are checked against the shards' raw
bytes (parsed here, not by siphon), the quantization against numpy/ml_dtypes quantizing the f32
run of the same tokens, and shuffling, filters and resume as for bf16 runs."""

from __future__ import annotations

import json
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, List, Tuple

import ml_dtypes
import numpy as np
import pytest
import torch

import siphon
from siphon.__main__ import main as siphon_cli
from conftest import D_MODEL, FP8_HOOKS, HOOKS, extract
from siphon import DatasetError

E4M3 = ml_dtypes.float8_e4m3fn
HOOK = FP8_HOOKS[0]


def raw_tensors(path: Path) -> Tuple[Dict[str, Tuple[str, List[int], bytes]], Dict[str, str]]:
    """A safetensors file parsed by hand: {name: (dtype, shape, bytes)} and its metadata."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    return {k: (v["dtype"], v["shape"], data[base + v["data_offsets"][0] : base + v["data_offsets"][1]]) for k, v in header.items()}, meta


def shard_paths(run: Path) -> List[Path]:
    """Every committed shard, hosts in order, as the reader orders them."""
    out = []
    for host in sorted(p for p in run.iterdir() if p.name.startswith("machine_")):
        for line in (host / "manifest.jsonl").read_text().splitlines():
            out.append(host / json.loads(line)["shard"])
    return out


def stored_fp8(run: Path, hook: str) -> Tuple[np.ndarray, np.ndarray]:
    """Every committed row of an fp8 hook, from the shards' bytes: the F8_E4M3 bytes ``[n, *shape]``
    and the F32 scales ``[n]``."""
    values, scales = [], []
    for path in shard_paths(run):
        tensors, _ = raw_tensors(path)
        dtype, shape, raw = tensors[hook]
        assert dtype == "F8_E4M3"
        values.append(np.frombuffer(raw, np.uint8).reshape(shape))
        dtype, shape, raw = tensors[f"{hook}.fp8_scale"]
        assert dtype == "F32"
        scales.append(np.frombuffer(raw, "<f4").reshape(shape))
    return np.concatenate(values), np.concatenate(scales)


def dequantized(run: Path, hook: str) -> np.ndarray:
    """ml_dtypes' decoding of the stored bytes times the stored scales, in float32."""
    values, scales = stored_fp8(run, hook)
    return values.view(E4M3).astype(np.float32) * scales.reshape((-1,) + (1,) * (values.ndim - 1))


def same_bits(got, want: np.ndarray) -> None:
    """`got` (numpy or torch) has `want`'s dtype and, value for value, its bits."""
    if isinstance(got, torch.Tensor):
        assert got.dtype == {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
                             np.dtype(ml_dtypes.bfloat16): torch.bfloat16}[want.dtype]
        got = got.view({4: torch.int32, 2: torch.int16}[got.element_size()]).numpy()
    else:
        assert got.dtype == want.dtype
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.view(f"u{want.itemsize}"), want.view(f"u{want.itemsize}"))


def rows(batch, hooks):
    """Each token of a batch as one hashable tuple of every field (float32 values)."""
    cols = [np.asarray(batch["token_ids"]).tolist(), np.asarray(batch["position"]).tolist()]
    for h in hooks:
        x = np.asarray(batch[h], dtype=np.float32)
        cols.append([r.tobytes() for r in x.reshape(len(x), -1)])
    return list(zip(*cols))


def test_an_fp8_run_opens_with_its_hooks_and_verifies(fp8_run):
    ds = siphon.open_dataset(fp8_run)
    run_json = json.loads((fp8_run / "run.json").read_text())
    assert run_json["shard_format"]["dtype"] == "fp8"
    assert list(ds.hooks) == FP8_HOOKS == run_json["hooks"]  # no *.fp8_scale among them
    assert ds.dtype == "float8_e4m3fn" and all(h.dtype == "float8_e4m3fn" for h in ds.hooks.values())
    assert ds.hooks[HOOK].shape == (D_MODEL,)
    assert len(ds.shards) > 4
    for path, line in zip(shard_paths(fp8_run), ds.shards):
        tensors, meta = raw_tensors(path)
        assert meta["dtype"] == "fp8"
        for hook in FP8_HOOKS:
            assert tensors[hook][:2] == ("F8_E4M3", [line.tokens, D_MODEL])
            assert tensors[f"{hook}.fp8_scale"][:2] == ("F32", [line.tokens])
    report = ds.verify()
    assert report.ok and report.shards == len(ds.shards)
    batch = next(iter(ds.batches(batch_size=64)))
    assert set(batch) == set(FP8_HOOKS) | {"token_ids", "position"}
    assert siphon_cli(["verify", str(fp8_run)]) == 0


def test_reads_are_the_stored_bytes_decoded_times_the_scales(fp8_run):
    """float32 by default (numpy and torch), exactly ml_dtypes' decoding times the stored scale;
    bfloat16 and float16 that float32 rounded."""
    ds = siphon.open_dataset(fp8_run)
    want = {h: dequantized(fp8_run, h) for h in FP8_HOOKS}
    as_numpy = ds.read()
    as_torch = ds.read(output="torch")
    for h in FP8_HOOKS:
        same_bits(as_numpy[h], want[h])
        same_bits(as_torch[h], want[h])
        assert np.abs(want[h]).max() > 0
    for h, x in ds.read(dtype="float32").items():
        if h in want:
            same_bits(x, want[h])
    for dtype, np_dtype in [("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16)]:
        got_np = ds.read(FP8_HOOKS[1:], dtype=dtype)
        got_torch = ds.read(FP8_HOOKS[1:], output="torch", dtype=getattr(torch, dtype))
        for h in FP8_HOOKS[1:]:
            same_bits(got_np[h], want[h].astype(np_dtype))
            same_bits(got_torch[h], want[h].astype(np_dtype))
    # Batches in stored order, both outputs, are the same values.
    for output in ("numpy", "torch"):
        parts = list(ds.batches(FP8_HOOKS, batch_size=300, shuffle=False, output=output, unit_tokens=128))
        for h in FP8_HOOKS:
            got = np.concatenate([np.asarray(b[h]) for b in parts])
            same_bits(got, want[h])


def test_scales_and_bytes_are_numpy_quantizing_the_f32_run(fp8_run, f32_run):
    """The fp8 run of the same tokens as the f32 run: scale = amax(|row|) * float32(1/448) and
    bytes = (x / scale).astype(float8_e4m3fn), up to the last bit of the two programs' f32
    values (at most one E4M3 step, rarely)."""
    fp8, f32 = siphon.open_dataset(fp8_run), siphon.open_dataset(f32_run)
    assert list(fp8.hooks) == list(f32.hooks) and fp8.tokens == f32.tokens
    ref = f32.read()
    got = fp8.read()
    np.testing.assert_array_equal(got["token_ids"], ref["token_ids"])
    np.testing.assert_array_equal(got["position"], ref["position"])
    # Every finite E4M3 value, in order (-0 and +0 as one): a value's rank is its step.
    grid = np.unique(np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float32))
    grid = grid[np.isfinite(grid)]
    for h in FP8_HOOKS:
        x = ref[h]
        values, scales = stored_fp8(fp8_run, h)
        amax = np.abs(x).max(axis=1)
        want_scale = np.where(amax > 0, amax * np.float32(1 / 448), np.float32(1))
        assert want_scale.dtype == np.float32
        off = np.abs(scales.astype(np.float64) - want_scale) / want_scale
        assert off.max() <= 2e-7, f"{h}: a scale {off.max():.3g} off amax * float32(1/448)"
        q = (x / scales[:, None]).astype(E4M3).view(np.uint8)
        same = values == q
        assert same.mean() >= 0.999, f"{h}: {same.mean():.5f} of the bytes as numpy quantizes them"
        a, b = values[~same].view(E4M3).astype(np.float32), q[~same].view(E4M3).astype(np.float32)
        steps = np.abs(np.searchsorted(grid, a) - np.searchsorted(grid, b))
        assert ((steps == 1) | ((a == 0) & (b == 0))).all(), f"{h}: bytes more than one E4M3 step away"
        # The dequantized values are close to the f32 ones (E4M3: 3 mantissa bits).
        err = np.abs(got[h] - x).max(axis=1)
        assert (err <= amax / 16 + 1e-30).all()


def test_fp8_hook_bytes_are_half_of_bf16(fp8_run, bf16_run):
    fp8 = {h: 0 for h in FP8_HOOKS}
    scales = 0
    bf16 = {h: 0 for h in FP8_HOOKS}
    for path in shard_paths(fp8_run):
        tensors, _ = raw_tensors(path)
        for h in FP8_HOOKS:
            fp8[h] += len(tensors[h][2])
            scales += len(tensors[f"{h}.fp8_scale"][2])
    for path in shard_paths(bf16_run):
        tensors, _ = raw_tensors(path)
        for h in FP8_HOOKS:
            assert tensors[h][0] == "BF16"
            bf16[h] += len(tensors[h][2])
    tokens = siphon.open_dataset(fp8_run).tokens
    assert tokens == siphon.open_dataset(bf16_run).tokens
    for h in FP8_HOOKS:
        assert fp8[h] == tokens * D_MODEL and bf16[h] == 2 * fp8[h]
    # With the scales, 4 bytes a row: (64 + 4) / 128.
    assert scales == 4 * tokens * len(FP8_HOOKS)
    assert (sum(fp8.values()) + scales) / sum(bf16.values()) == pytest.approx((D_MODEL + 4) / (2 * D_MODEL))


@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_shuffled_filtered_batches_keep_each_row_with_its_scale(fp8_run, output):
    """Shuffled and filtered rows come with their own scales: every token once, with the
    values the unshuffled read gives it."""
    ds = siphon.open_dataset(fp8_run)
    full = ds.read(FP8_HOOKS)
    common = int(np.bincount(full["token_ids"]).argmax())
    keep = (full["token_ids"] != common) & (full["position"] >= 2)
    want = Counter(rows({k: v[keep] for k, v in full.items()}, FP8_HOOKS))
    batches = list(ds.batches(FP8_HOOKS, batch_size=100, seed=3, unit_tokens=128, shuffle_buffer_tokens=400,
                              exclude_token_ids=[common], min_position=2, output=output))
    seen = [r for b in batches for r in rows(b, FP8_HOOKS)]
    assert Counter(seen) == want
    assert seen != [r for r in rows(full, FP8_HOOKS) if r[0] != common and r[1] >= 2]  # shuffled


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_state_after_n_batches_resumes_the_rest_bit_for_bit(fp8_run, shuffle):
    """As for bf16 runs (test_dataset.py): the rest after a saved state is the uninterrupted rest."""
    ds = siphon.open_dataset(fp8_run)
    args = dict(batch_size=48, shuffle=shuffle, seed=7, unit_tokens=100, epochs=2, exclude_token_ids=[32])
    if shuffle:
        args["shuffle_buffer_tokens"] = 250
    for reader in [dict(), dict(rank=1, world_size=2, worker=1, num_workers=2)]:
        whole = list(ds.batches(FP8_HOOKS[:2], **args, **reader))
        assert len(whole) > 8
        it = ds.batches(FP8_HOOKS[:2], **args, **reader)
        states = []
        for _ in whole:
            next(it)
            states.append(json.loads(json.dumps(it.state_dict())))
        assert states[-1]["epoch"] == 2
        for n in [0, 1, len(whole) // 2, len(whole) - 1]:
            rest = list(ds.batches(FP8_HOOKS[:2], **args, **reader, resume=states[n]))
            assert len(rest) == len(whole) - n - 1
            for got, want in zip(rest, whole[n + 1 :]):
                assert got.keys() == want.keys()
                for k in want:
                    if k in FP8_HOOKS:
                        same_bits(got[k], want[k])
                    else:
                        np.testing.assert_array_equal(got[k], want[k])


def test_numpy_without_ml_dtypes_is_a_clear_error_and_torch_needs_none(fp8_run, monkeypatch):
    ds = siphon.open_dataset(fp8_run)
    want = ds.read(FP8_HOOKS[:1], output="torch")[HOOK]
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # `import ml_dtypes` fails
    with pytest.raises(DatasetError, match=r"float8_e4m3fn.*pip install ml_dtypes.*output='torch'"):
        ds.batches(FP8_HOOKS[:1], dtype="float32")
    with pytest.raises(DatasetError, match="pip install ml_dtypes"):
        ds.read(FP8_HOOKS[:1])
    got = ds.read(FP8_HOOKS[:1], output="torch")[HOOK]
    assert got.dtype == torch.float32 and torch.equal(got, want)


def test_verify_and_the_reader_name_missing_scales(fp8_run, tmp_path):
    run = tmp_path / fp8_run.name
    shutil.copytree(fp8_run, run)
    shard = shard_paths(run)[1]
    data = shard.read_bytes()
    n = int.from_bytes(data[:8], "little")
    name = f'"{HOOK}.fp8_scale"'.encode()
    assert name in data[8 : 8 + n]
    # The same header length: the scales renamed away.
    shard.write_bytes(data[:8] + data[8 : 8 + n].replace(name, name[:-2] + b'X"') + data[8 + n :])
    ds = siphon.open_dataset(run)
    report = ds.verify(hashes=False, raise_on_problem=False)
    assert any(f"{shard.parent.name}/{shard.name}: fp8 hook {HOOK}'s scales {HOOK}.fp8_scale: missing" in p
               for p in report.problems), report.problems
    with pytest.raises(DatasetError, match=rf"shard has no tensor '{HOOK}.fp8_scale'"):
        list(ds.batches(FP8_HOOKS[:1], batch_size=64, shuffle=False))


def test_saelens_routes_read_fp8_runs_dequantized(fp8_run, tmp_path):
    """data_provider's tensors (DataLoader workers included) and the SAELens cache export."""
    datasets = pytest.importorskip("datasets")
    import siphon.torch
    from siphon.saelens import export

    stored = siphon.open_dataset(fp8_run).read([HOOK])
    provider = siphon.torch.data_provider(fp8_run, HOOK, batch_size=128, seed=1, num_workers=2, epochs=1)
    got = list(provider)
    assert all(x.dtype == torch.float32 and x.shape[1:] == (D_MODEL,) for x in got)
    assert Counter(r.tobytes() for x in got for r in x.numpy()) == Counter(r.tobytes() for r in stored[HOOK])

    ctx = 16
    summary = export(fp8_run, tmp_path / "cache", hooks=[HOOK], context_size=ctx, shuffle=False)
    assert summary.rows == len(stored[HOOK]) // ctx
    cache = datasets.load_from_disk(str(tmp_path / "cache"))
    cache.set_format("numpy")
    np.testing.assert_array_equal(cache[1][HOOK], stored[HOOK][ctx : 2 * ctx])
    np.testing.assert_array_equal(cache[1]["token_ids"], stored["token_ids"][ctx : 2 * ctx])


def test_a_per_head_hook_shares_one_scale_per_token(runs):
    """hook_z ``[tokens, heads, d_head]``: one scale per token over every head."""
    hook = "blocks.0.attn.hook_z"
    assert hook in HOOKS
    run = extract(runs, "tiny-fp8-heads", dtype="fp8", hooks=[hook], docs=40)
    ds = siphon.open_dataset(run)
    values, scales = stored_fp8(run, hook)
    assert values.shape[1:] == (4, 16) and scales.shape == values.shape[:1]
    got = ds.read([hook])[hook]
    same_bits(got, values.view(E4M3).astype(np.float32) * scales[:, None, None])
    # Each token's largest magnitude over all its heads is E4M3's largest, 448.
    assert (np.abs(values.view(E4M3).astype(np.float32)).reshape(len(values), -1).max(axis=1) == 448).all()
