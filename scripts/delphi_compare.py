#!/usr/bin/env python3
"""siphon's delphi export against delphi itself (EleutherAI/delphi, PyPI eai-delphi). Run it
in the venv of scripts/setup-python-delphi.sh:

    PY=~/.cache/siphon/venvs/delphi/bin/python

    # (a) delphi's own LatentDataset + constructor + sampler load an export: every latent with
    #     firings gets its record and examples, each example's activations those of the cache.
    $PY scripts/delphi_compare.py load OUT [--modules layers.1,...] [--tokenizer tokenizer.json]

    # (b) delphi's own LatentCache on the export's token rows (an HF model directory and the
    #     dictionary: a sparsify hookpoint folder or a SAELens folder), then the two caches
    #     compared: same tokens, same set of (sequence, position, latent), activations within
    #     float16 rounding (or --rtol, e.g. 2**-8 for a bf16 run).
    $PY scripts/delphi_compare.py compare --export OUT/layers.1 --model MODEL_DIR \
        --sae fixtures/dictionaries/sparsify/layers.1 [--hookpoint layers.1] [--run RUN] [--work DIR]
    # a transcoder on blocks.1.ln2.hook_normalized (before the norm's gain; delphi hooks the
    # MLP's input, after it):
    $PY scripts/delphi_compare.py compare --export OUT/layers.1.mlp --model MODEL_DIR \
        --sae fixtures/dictionaries/saelens-transcoder --norm-gain layers.1.post_attention_layernorm --run RUN

From Python (this file's directory on sys.path): `check_loads(raw_dir, ...)`,
`delphi_cache(tokens, model_dir, sae_dir, hookpoint, out_dir, ...)` and
`compare_with_delphi(export_dir, model_dir, sae_dir, ...)`, which returns a `Comparison`
(``ok``, and what differs). With ``--run`` (or ``included=``), only the positions the run
includes are compared: an export leaves excluded tokens' latents out unless asked to keep
them, and padding differs (siphon masks it, delphi's cache runs the model without a mask).
Prints one line per check; exits non-zero when one fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))


# ------------------------------------------------------------------------------ reading caches


def read_cache(folder: Path) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One hookpoint folder of a delphi cache, read as delphi's TensorBuffer reads it
    (``to_int64_tensor``, the split's start added back): locations [N, 3] int64 (sorted by
    sequence, position, latent), activations [N] float16, tokens [n_seq, ctx]."""
    from delphi.utils import to_int64_tensor
    from safetensors.numpy import load_file

    locs: List[np.ndarray] = []
    acts: List[np.ndarray] = []
    tokens: Optional[np.ndarray] = None
    files = sorted(folder.glob("*.safetensors"), key=lambda p: int(p.stem.split("_")[0]))
    if not files:
        raise SystemExit(f"{folder}: no split files")
    for f in files:
        data = load_file(str(f))
        loc = to_int64_tensor(data["locations"]).numpy().copy()
        loc[:, 2] += int(f.stem.split("_")[0])
        locs.append(loc)
        acts.append(data["activations"])
        t = data["tokens"].astype(np.int64)
        if tokens is not None and not np.array_equal(tokens, t):
            raise SystemExit(f"{f}: its tokens differ from the other splits'")
        tokens = t
    loc = np.concatenate(locs)
    act = np.concatenate(acts)
    order = np.lexsort((loc[:, 2], loc[:, 1], loc[:, 0]))
    assert tokens is not None
    return loc[order], act[order], tokens


# ------------------------------------------------------------------------------ (a) loading


def check_loads(
    raw_dir: Path,
    modules: Optional[List[str]] = None,
    tokenizer: Optional[str] = None,
    example_ctx_len: Optional[int] = None,
) -> List[str]:
    """Loads `raw_dir` with delphi's LatentDataset (constructor: windows of `example_ctx_len`,
    default min(32, the cache's ctx_len); min_examples 1; sampler: top examples) and checks
    that each latent with firings in the files comes out as a record with one example per
    window it fires in, each example's activations those the cache holds. Returns the
    problems found (empty: all good)."""
    from delphi.config import ConstructorConfig, SamplerConfig
    from delphi.latents import LatentDataset
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    modules = modules or sorted(p.name for p in raw_dir.iterdir() if p.is_dir())
    tok: Any
    if tokenizer and tokenizer.endswith(".json"):
        tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer)
    elif tokenizer:
        tok = AutoTokenizer.from_pretrained(tokenizer)
    else:
        tok = None  # delphi loads config.json's model_name
    problems: List[str] = []
    for module in modules:
        loc, act, tokens = read_cache(raw_dir / module)
        ctx = tokens.shape[1]
        window = example_ctx_len or min(32, ctx)
        if ctx % window:
            problems.append(f"{module}: ctx_len {ctx} is not a multiple of example_ctx_len {window}")
            continue
        dataset = LatentDataset(
            raw_dir=str(raw_dir),
            sampler_cfg=SamplerConfig(n_examples_train=1000, n_examples_test=0, train_type="top"),
            constructor_cfg=ConstructorConfig(example_ctx_len=window, min_examples=1, n_non_activating=0,
                                              non_activating_source="random", center_examples=True),
            tokenizer=tok,
            modules=[module],
        )
        records = {int(r.latent.latent_index): r for r in dataset}
        fired = np.unique(loc[:, 2])
        if sorted(records) != fired.tolist():
            missing = sorted(set(fired.tolist()) - set(records))[:5]
            extra = sorted(set(records) - set(fired.tolist()))[:5]
            problems.append(f"{module}: records for {len(records)} latents, {len(fired)} fired (missing {missing}, extra {extra})")
        flat_tokens = tokens.reshape(-1, window)
        for latent, record in records.items():
            mine = loc[:, 2] == latent
            flat = loc[mine, 0] * ctx + loc[mine, 1]
            windows = np.unique(flat // window)
            if len(record.examples) != len(windows):
                problems.append(f"{module} latent {latent}: {len(record.examples)} examples, fires in {len(windows)} windows")
                continue
            want = np.zeros((len(windows), window), dtype=np.float32)
            want[np.searchsorted(windows, flat // window), flat % window] = act[mine].astype(np.float32)
            got = {(tuple(e.tokens.tolist()), tuple(e.activations.float().tolist())) for e in record.examples}
            expect = {(tuple(flat_tokens[w].tolist()), tuple(want[i].tolist())) for i, w in enumerate(windows)}
            if got != expect:
                problems.append(f"{module} latent {latent}: examples differ from the cache's windows")
            if not record.train:
                problems.append(f"{module} latent {latent}: the sampler gave no training examples")
        print(f"{module}: {len(records)} latents with firings loaded by delphi's LatentDataset, "
              f"{len(loc)} firings, tokens {list(tokens.shape)}")
    return problems


# ------------------------------------------------------------------------------ (b) delphi's own cache


def sparse_encoder(sae_dir: Path, hookpoint: str, model: Any, device: str) -> Tuple[Callable[[Any], Any], bool]:
    """delphi's encode function for the dictionary in `sae_dir` and whether it transcodes: a
    sparsify folder (cfg.json + sae.safetensors) through delphi's own loader
    (``load_sparsify_hooks``, or its ``sae_dense_latents`` when the folder is not named after
    the hookpoint); a SAELens folder (cfg.json + sae_weights.safetensors) through SAELens's
    ``SAE.load_from_disk(...).encode`` (delphi has no SAELens loader: this is what a user
    passes it as ``hookpoint_to_sparse_encode``)."""
    from functools import partial

    cfg = json.loads((sae_dir / "cfg.json").read_text())
    if (sae_dir / "sae.safetensors").exists():
        from delphi.sparse_coders.load_sparsify import load_sparsify_hooks, sae_dense_latents
        from sparsify import SparseCoder

        transcode = bool(cfg.get("transcode") or cfg.get("skip_connection"))
        if sae_dir.name == hookpoint:
            hooks, transcode = load_sparsify_hooks(model, str(sae_dir.parent), [hookpoint], device=device)
            return hooks[hookpoint], transcode
        coder = SparseCoder.load_from_disk(sae_dir, device=device)
        return partial(sae_dense_latents, sae=coder), transcode
    if (sae_dir / "sae_weights.safetensors").exists():
        from sae_lens import SAE

        sae = SAE.load_from_disk(str(sae_dir), device=device)
        transcode = "transcoder" in str(cfg.get("architecture", ""))

        def encode(x: Any) -> Any:
            return sae.encode(x.to(sae.W_enc.dtype))

        return encode, transcode
    raise SystemExit(f"{sae_dir}: neither a sparsify (sae.safetensors) nor a SAELens (sae_weights.safetensors) folder")


def delphi_cache(
    tokens: np.ndarray,
    model_dir: str,
    sae_dir: str,
    hookpoint: str,
    out_dir: Path,
    *,
    n_splits: int = 5,
    batch_size: Optional[int] = None,
    device: str = "cpu",
    transcode: Optional[bool] = None,
    norm_gain: Optional[str] = None,
) -> Path:
    """delphi's own cache of `tokens` ``[n_seq, ctx]``: ``LatentCache(AutoModel, {hookpoint:
    encode}).run``, ``save_splits`` and ``save_config`` into `out_dir`; returns the hookpoint's
    folder. `batch_size` (sequences per forward) defaults to the largest divisor of n_seq up to
    32, so that delphi caches every row (it drops a last partial batch). `norm_gain` (a norm
    module's path, e.g. ``layers.1.post_attention_layernorm``) divides the hooked values by that
    norm's gain before encoding: siphon's ``ln2.hook_normalized`` is the MLP norm's output
    *before* its gain (TransformerLens's convention), the MLP module's input after it."""
    import torch
    from delphi.config import CacheConfig
    from delphi.latents import LatentCache
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    encode, sae_transcodes = sparse_encoder(Path(sae_dir), hookpoint, model, device)
    if norm_gain is not None:
        gain = model.get_submodule(norm_gain).weight.detach()
        inner = encode

        def encode(x: Any) -> Any:
            return inner(x / gain.to(x.dtype))

    n_seq, ctx = tokens.shape
    if batch_size is None:
        batch_size = max(d for d in range(1, min(32, n_seq) + 1) if n_seq % d == 0)
    cache = LatentCache(model, {hookpoint: encode}, batch_size=batch_size,
                        transcode=sae_transcodes if transcode is None else transcode)
    cache.run(n_seq * ctx, torch.from_numpy(tokens.astype(np.int64)))
    out_dir.mkdir(parents=True, exist_ok=True)
    cache.save_splits(n_splits=n_splits, save_dir=out_dir)
    cfg = CacheConfig(cache_ctx_len=ctx, batch_size=batch_size, n_tokens=n_seq * ctx, n_splits=n_splits)
    cache.save_config(save_dir=out_dir, cfg=cfg, model_name=model_dir)
    return out_dir / hookpoint


@dataclass
class Comparison:
    """siphon's export against delphi's own cache."""

    tokens_equal: bool
    compared: int = 0
    only_siphon: List[Tuple[int, int, int, float]] = field(default_factory=list)
    only_delphi: List[Tuple[int, int, int, float]] = field(default_factory=list)
    #: Common entries whose activations differ by more than the tolerance.
    value_mismatches: List[Tuple[int, int, int, float, float]] = field(default_factory=list)
    max_abs_diff: float = 0.0
    allowed: int = 0

    @property
    def ok(self) -> bool:
        differ = len(self.only_siphon) + len(self.only_delphi) + len(self.value_mismatches)
        return self.tokens_equal and differ <= self.allowed

    def lines(self) -> List[str]:
        return [
            f"tokens equal: {self.tokens_equal}",
            f"entries compared: {self.compared}; only in siphon's export: {len(self.only_siphon)} "
            f"{self.only_siphon[:5]}; only in delphi's cache: {len(self.only_delphi)} {self.only_delphi[:5]}",
            f"activations: max |difference| {self.max_abs_diff:.3g}, {len(self.value_mismatches)} beyond the "
            f"tolerance {self.value_mismatches[:5]}",
        ]


def compare_caches(
    siphon_dir: Path,
    delphi_dir: Path,
    *,
    included: Optional[np.ndarray] = None,
    rtol: float = 2.0**-10,
    atol: float = 1e-5,
    allowed: int = 0,
) -> Comparison:
    """Compares two caches of one hookpoint: tokens equal; the sets of (sequence, position,
    latent) equal (at the positions `included` [n_seq, ctx] marks, all without it);
    activations within ``atol + rtol * |delphi's|`` (default: one float16 rounding step)."""
    s_loc, s_act, s_tok = read_cache(siphon_dir)
    d_loc, d_act, d_tok = read_cache(delphi_dir)
    result = Comparison(tokens_equal=s_tok.shape == d_tok.shape and bool(np.array_equal(s_tok, d_tok)), allowed=allowed)
    if not result.tokens_equal:
        return result
    if included is not None:
        s_keep = included[s_loc[:, 0], s_loc[:, 1]]
        d_keep = included[d_loc[:, 0], d_loc[:, 1]]
        s_loc, s_act, d_loc, d_act = s_loc[s_keep], s_act[s_keep], d_loc[d_keep], d_act[d_keep]
    ctx = s_tok.shape[1]
    width = int(max(s_loc[:, 2].max(initial=0), d_loc[:, 2].max(initial=0))) + 1
    s_key = (s_loc[:, 0] * ctx + s_loc[:, 1]) * width + s_loc[:, 2]
    d_key = (d_loc[:, 0] * ctx + d_loc[:, 1]) * width + d_loc[:, 2]
    common, si, di = np.intersect1d(s_key, d_key, assume_unique=True, return_indices=True)
    only_s = np.setdiff1d(np.arange(len(s_key)), si)
    only_d = np.setdiff1d(np.arange(len(d_key)), di)
    result.compared = len(common)
    result.only_siphon = [(*map(int, s_loc[i]), float(s_act[i])) for i in only_s]
    result.only_delphi = [(*map(int, d_loc[i]), float(d_act[i])) for i in only_d]
    a, b = s_act[si].astype(np.float32), d_act[di].astype(np.float32)
    diff = np.abs(a - b)
    result.max_abs_diff = float(diff.max(initial=0.0))
    bad = np.flatnonzero(diff > atol + rtol * np.abs(b))
    result.value_mismatches = [(*map(int, s_loc[si[i]]), float(a[i]), float(b[i])) for i in bad]
    return result


def compare_with_delphi(
    export_dir: Path,
    model_dir: str,
    sae_dir: str,
    *,
    hookpoint: Optional[str] = None,
    run: Optional[str] = None,
    included: Optional[np.ndarray] = None,
    work_dir: Optional[Path] = None,
    transcode: Optional[bool] = None,
    norm_gain: Optional[str] = None,
    rtol: float = 2.0**-10,
    allowed: int = 0,
    device: str = "cpu",
) -> Comparison:
    """The whole check (b): delphi's own cache of the token rows of siphon's export folder
    `export_dir` (``OUT/<hookpoint>``), made with the HF model `model_dir` and the dictionary
    `sae_dir`, compared with the export (`compare_caches`). `hookpoint` defaults to the
    export folder's name; `run` (the siphon run) restricts the comparison to the tokens it
    includes (`siphon.delphi.rebuild_sequences`), as does `included`; `norm_gain` as for
    `delphi_cache` (a dictionary on ``blocks.N.ln2.hook_normalized``)."""
    import tempfile

    hookpoint = hookpoint or export_dir.name
    _, _, tokens = read_cache(export_dir)
    if run is not None and included is None:
        import siphon
        from siphon.delphi import rebuild_sequences

        config = json.loads((export_dir / "config.json").read_text())
        seqs = rebuild_sequences(siphon.open_dataset(run), config.get("siphon", {}).get("sequences", "exact"),
                                 int(config["cache_ctx_len"]))
        if not np.array_equal(seqs.tokens, tokens):
            raise SystemExit(f"{export_dir}: its tokens are not the rows of {run}")
        included = seqs.included
    work = Path(work_dir or tempfile.mkdtemp(prefix="delphi-cache-"))
    ours = delphi_cache(tokens, model_dir, sae_dir, hookpoint, work, transcode=transcode, device=device,
                        norm_gain=norm_gain)
    return compare_caches(export_dir, ours, included=included, rtol=rtol, allowed=allowed)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    load = sub.add_parser("load", help="(a) delphi's LatentDataset on an export")
    load.add_argument("raw_dir")
    load.add_argument("--modules", help="comma-separated hookpoint folders (default: all)")
    load.add_argument("--tokenizer", help="tokenizer.json or a model name (default: config.json's model_name)")
    load.add_argument("--example-ctx-len", type=int)
    cmp = sub.add_parser("compare", help="(b) delphi's own LatentCache against an export")
    cmp.add_argument("--export", required=True, help="the export's hookpoint folder, OUT/<hookpoint>")
    cmp.add_argument("--model", required=True, help="HF model directory (AutoModel)")
    cmp.add_argument("--sae", required=True, help="sparsify hookpoint folder or SAELens folder")
    cmp.add_argument("--hookpoint", help="module path delphi hooks (default: the export folder's name)")
    cmp.add_argument("--run", help="the siphon run: compare only the positions it includes")
    cmp.add_argument("--work", help="where delphi's cache is written (default: a temporary directory)")
    cmp.add_argument("--transcode", action="store_true", default=None, help="hook module inputs (default: from the dictionary)")
    cmp.add_argument("--norm-gain", help="divide the hooked values by this norm module's gain (siphon's ln2.hook_normalized "
                     "is before the gain): e.g. layers.1.post_attention_layernorm")
    cmp.add_argument("--rtol", type=float, default=2.0**-10, help="relative tolerance (bf16 runs: 0.005)")
    cmp.add_argument("--allowed", type=int, default=0, help="differing entries tolerated (near-zero or tied latents)")
    args = parser.parse_args(argv)
    if args.command == "load":
        problems = check_loads(Path(args.raw_dir), args.modules.split(",") if args.modules else None, args.tokenizer,
                               args.example_ctx_len)
        for p in problems:
            print("PROBLEM:", p)
        if not problems:
            print("ok: every latent with firings has its examples")
        return 1 if problems else 0
    result = compare_with_delphi(Path(args.export), args.model, args.sae, hookpoint=args.hookpoint, run=args.run,
                                 work_dir=Path(args.work) if args.work else None, transcode=args.transcode,
                                 norm_gain=args.norm_gain, rtol=args.rtol, allowed=args.allowed)
    for line in result.lines():
        print(line)
    print("ok: the export equals delphi's own cache" if result.ok else "FAILED: the caches differ")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
