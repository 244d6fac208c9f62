"""Runs with dictionary latents written by hand to the format (run.json's "latents", a CSR
column per shard, stats.json), independently of siphon's writer: safetensors' own torch
writer, google_crc32c for the manifests."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import google_crc32c
import numpy as np
import torch
from safetensors.torch import save_file

FORMAT = "siphon-activations/2"
RESID = "blocks.1.hook_resid_post"
SAE = RESID + ".hook_sae_acts_post"
TRANSCODER = "blocks.1.ln2.hook_normalized.hook_sae_acts_post"
BOS = 1
PAD = 0


@dataclass
class Truth:
    """What a hand-written run holds, every row in global order (hosts, then shards)."""

    path: Path
    dense: Dict[str, np.ndarray]      # name -> [rows, width] float32 (values as stored)
    token_ids: np.ndarray
    sample_index: np.ndarray
    position: np.ndarray
    mask: np.ndarray                  # all True without keep_excluded
    host: np.ndarray                  # host number per row
    shard_rows: List[int]
    seq_len: int
    hook: np.ndarray                  # [rows, d] float32 of the run's one hook, when stored


TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def write_run(
    root: Path,
    *,
    dtype: str = "bf16",
    hosts: int = 2,
    shards_per_host: int = 3,
    seqs_per_shard: int = 2,
    seq_len: int = 8,
    widths: Sequence[int] = (40,),
    names: Sequence[str] = (SAE,),
    cap: int = 5,
    keep_excluded: bool = True,
    pad_tail: int = 2,
    with_hook: bool = True,
    shuffle: Optional[dict] = None,
    seed: int = 0,
    token_rows: Optional[np.ndarray] = None,
    latents: Optional[Dict[str, np.ndarray]] = None,
) -> Truth:
    """A run of `hosts` hosts, each with `shards_per_host` shards of `seqs_per_shard` whole
    sequences: BOS, a document, `pad_tail` pads on every other sequence. Without
    `keep_excluded` BOS and pads are dropped; with it they are stored, masked. Each token fires
    up to `cap` latents of each column (some none), values rounded to `dtype`. `token_rows`
    ``[sequences, seq_len]`` and `latents` (name -> ``[sequences * seq_len, width]``, every
    row of every sequence) replace the random tokens (BOS and pads kept where they are) and
    latents."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    latents_meta = [
        {"name": n, "hook": n.split(".hook_sae_acts_post")[0], "width": w, "cap": cap,
         "dictionary": {"path": f"/dicts/{i}", "architecture": "transcoder" if n == TRANSCODER else "topk"}}
        for i, (n, w) in enumerate(zip(names, widths))
    ]
    run = {
        "format": FORMAT, "run": root.name,
        "model": {"config": {"arch": "llama", "n_layers": 3}, "path": "/models/tiny"},
        "hooks": [RESID] if with_hook else [], "hook_shapes": [[4]] if with_hook else [],
        "config": {"model": "hf://org/tiny@main",
                   "corpus": {"corpus": "org/corpus", "text_column": "text", "batch_size": 4, "seq_len": seq_len}},
        "shard_format": {"dtype": dtype, "keep_excluded": keep_excluded, "shuffle": shuffle},
        "latents": latents_meta,
    }
    (root / "run.json").write_text(json.dumps(run))
    tdtype = TORCH_DTYPES[dtype]
    all_rows: Dict[str, List[np.ndarray]] = {n: [] for n in names}
    meta: Dict[str, List[np.ndarray]] = {k: [] for k in ("token_ids", "sample_index", "position", "mask", "host", "hook")}
    shard_rows = []
    stats = {n: {"count": 0, "firings": np.zeros(w, np.int64), "sums": np.zeros(w)} for n, w in zip(names, widths)}
    for h in range(hosts):
        host = root / f"machine_000_host_{h:02d}"
        host.mkdir()
        lines = []
        sample = 0
        for s in range(shards_per_host):
            first_seq = (h * shards_per_host + s) * seqs_per_shard
            ids, samples, pos, doc, mask = [], [], [], [], []
            for q in range(seqs_per_shard):
                pads = pad_tail if (sample % 2) else 0
                words = seq_len - 1 - pads
                row_ids = [BOS] + list(rng.integers(4, 250, words)) + [PAD] * pads
                if token_rows is not None:
                    row_ids = [BOS] + list(token_rows[first_seq + q][1 : 1 + words]) + [PAD] * pads
                row_pos = [0] + list(range(1, words + 1)) + [-1] * pads
                row_doc = [h * 1000 + sample] * (words + 1) + [-1] * pads
                row_mask = [False] + [True] * words + [False] * pads
                ids += row_ids; pos += row_pos; doc += row_doc; mask += row_mask
                samples += [sample] * seq_len
                sample += 1
            keep = np.asarray(mask) if not keep_excluded else np.ones(len(mask), bool)
            ids_a = np.asarray(ids, np.int32)[keep]
            tokens = len(ids_a)
            tensors = {
                "token_ids": torch.from_numpy(ids_a),
                "position": torch.from_numpy(np.asarray(pos, np.int32)[keep]),
                "doc_index": torch.from_numpy(np.asarray(doc, np.int64)[keep]),
                "sample_index": torch.from_numpy(np.asarray(samples, np.int64)[keep]),
            }
            stored_mask = np.asarray(mask)[keep]
            if keep_excluded:
                tensors["mask"] = torch.from_numpy(stored_mask.copy())
            if with_hook:
                hook = torch.from_numpy(rng.normal(size=(tokens, 4)).astype(np.float32)).to(tdtype)
                tensors[RESID] = hook
                meta["hook"].append(hook.float().numpy())
            for n, w in zip(names, widths):
                dense = np.zeros((tokens, w), np.float32)
                if latents is not None:
                    given = latents[n][first_seq * seq_len : (first_seq + seqs_per_shard) * seq_len][keep]
                indptr = [0]
                indices: List[int] = []
                for t in range(tokens):
                    if latents is not None:
                        fired = np.flatnonzero(given[t])
                        dense[t, fired] = given[t, fired]
                    else:
                        k = int(rng.integers(0, cap + 1))
                        fired = np.sort(rng.choice(w, size=k, replace=False))
                        dense[t, fired] = rng.uniform(0.01, 5.0, size=k)
                    indices += fired.tolist()
                    indptr.append(len(indices))
                dense = torch.from_numpy(dense).to(tdtype).float().numpy()
                values = dense[np.repeat(np.arange(tokens), np.diff(indptr)), indices]
                tensors[n + ".indptr"] = torch.tensor(indptr, dtype=torch.int32)
                tensors[n + ".indices"] = torch.tensor(indices, dtype=torch.int32)
                tensors[n + ".values"] = torch.from_numpy(values).to(tdtype)
                all_rows[n].append(dense)
                inc = dense[stored_mask]
                stats[n]["count"] += int(stored_mask.sum())
                stats[n]["firings"] += (inc != 0).sum(0)
                stats[n]["sums"] += inc.sum(0, dtype=np.float64)
            path = host / f"shard_{s:06d}.safetensors"
            save_file(tensors, str(path), metadata={"format": FORMAT})
            data = path.read_bytes()
            lines.append(json.dumps({
                "shard": path.name, "index": s, "bytes": len(data), "crc32c": f"{google_crc32c.value(data):08x}",
                "tokens": tokens, "included_tokens": int(stored_mask.sum()),
            }))
            meta["token_ids"].append(ids_a)
            meta["sample_index"].append(np.asarray(samples, np.int64)[keep])
            meta["position"].append(np.asarray(pos, np.int32)[keep])
            meta["mask"].append(stored_mask)
            meta["host"].append(np.full(tokens, h))
            shard_rows.append(tokens)
        (host / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    (root / "stats.json").write_text(json.dumps({"latents": {
        n: {"count": v["count"], "firings": v["firings"].tolist(), "sums": v["sums"].tolist()} for n, v in stats.items()
    }}))
    cat = {k: np.concatenate(v) if v else np.zeros(0) for k, v in meta.items()}
    return Truth(
        path=root,
        dense={n: np.concatenate(v) for n, v in all_rows.items()},
        token_ids=cat["token_ids"], sample_index=cat["sample_index"], position=cat["position"],
        mask=cat["mask"].astype(bool), host=cat["host"], shard_rows=shard_rows, seq_len=seq_len, hook=cat["hook"],
    )
