"""siphon's feature dashboards and Neuronpedia export against SAEDashboard's Neuronpedia runner
(issue 56) on the same model, dictionary, token rows and machine, interleaved. Run by
scripts/bench-dashboard.sh::

    dashboard_vs_saedashboard.py --siphon BIN --python PY --saedashboard-python PY --run RUN \
        --model HF_DIR --sae SAE_DIR [--features 128] [--rounds 2] --work DIR

Per round, one after the other: `siphon dashboard RUN` (every latent: pages, logit effects,
nearest latents), `siphon export neuronpedia RUN` (every latent's batch file), and
SAEDashboard's runner plus converter on one batch of `--features` latents (its
`n_features_at_a_time`, 128 by default) over the very token rows of the run
(`siphon.delphi.rebuild_sequences`, exact), the tokens the run excludes ignored
(saedashboard_batch.py). Each is a fresh process: wall seconds and peak RSS by GNU time.
SAEDashboard's runner redoes the forward pass over every token for each batch of latents, so
its time for all latents is its load plus its batch's seconds times the batches; per latent,
its batch's seconds over the batch's latents against siphon's whole wall over all latents.
Prints every run, then a markdown table of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
from typing import Any, Dict, List

REPO = pathlib.Path(__file__).resolve().parents[2]
TIME = "/usr/bin/time"

ROWS = """
import json, sys
import numpy as np
import siphon
from siphon.delphi import rebuild_sequences
ds = siphon.open_dataset(sys.argv[1])
rows = rebuild_sequences(ds, "exact")
np.save(sys.argv[2], rows.tokens)
ignored = np.unique(rows.tokens[~rows.included]).tolist()
name = next(iter(ds.latents))
print(json.dumps({"rows": int(rows.tokens.shape[0]), "ctx": int(rows.tokens.shape[1]), "tokens": ds.tokens,
                  "width": ds.latents[name].width, "ignored": ignored}))
"""


def timed(cmd: List[str], env: Dict[str, str]) -> Dict[str, Any]:
    """Runs `cmd` under GNU time: its wall seconds, peak RSS (MB) and stdout's last line."""
    done = subprocess.run([TIME, "-f", "%e %M", *cmd], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    wall, rss = done.stderr.strip().splitlines()[-1].split()
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    return {"wall": float(wall), "rss_mb": int(rss) / 1024, "last": last}


def size_mb(path: pathlib.Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--siphon", required=True)
    p.add_argument("--python", required=True, help="a Python with the siphon package (and numpy)")
    p.add_argument("--saedashboard-python", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--sae", required=True)
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), TF_CPP_MIN_LOG_LEVEL="2")
    tokens = work / "tokens.npy"
    info = json.loads(subprocess.run([args.python, "-c", ROWS, args.run, str(tokens)], capture_output=True, text=True,
                                     env=env, check=True).stdout.strip().splitlines()[-1])
    ignore = ",".join(map(str, info["ignored"]))
    results: Dict[str, List[Dict[str, Any]]] = {"dashboard": [], "neuronpedia": [], "saedashboard": []}
    for r in range(args.rounds):
        site = work / f"site-{r}"
        shutil.rmtree(site, ignore_errors=True)
        got = timed([args.siphon, "dashboard", args.run, "--out", str(site), "--no-progress", "--python", args.python],
                    env)
        got["mb"] = size_mb(site)
        shutil.rmtree(site)
        results["dashboard"].append(got)
        print(f"round {r} siphon dashboard: {got}", flush=True)
        batches = work / f"np-{r}"
        shutil.rmtree(batches, ignore_errors=True)
        got = timed([args.siphon, "export", "neuronpedia", args.run, str(batches), "--sae-set", "bench",
                     "--no-progress", "--python", args.python], env)
        got["mb"] = size_mb(batches)
        shutil.rmtree(batches)
        results["neuronpedia"].append(got)
        print(f"round {r} siphon export neuronpedia: {got}", flush=True)
        out = work / f"saedashboard-{r}.json"
        got = timed([args.saedashboard_python, str(REPO / "scripts/bench/saedashboard_batch.py"), args.model, args.sae,
                     str(tokens), ignore, "0", str(args.features), str(out)], env)
        got.update(json.loads(got["last"]))
        got["mb"] = out.stat().st_size / 1e6
        out.unlink()
        results["saedashboard"].append(got)
        print(f"round {r} SAEDashboard batch of {args.features}: {got}", flush=True)

    def median(kind: str, key: str) -> float:
        return statistics.median(float(x[key]) for x in results[kind])

    width, n = info["width"], args.features
    batches_all = -(-width // n)
    dash, export = median("dashboard", "wall"), median("neuronpedia", "wall")
    sd_load, sd_batch = median("saedashboard", "load_s"), median("saedashboard", "batch_s")
    sd_all = sd_load + sd_batch * batches_all
    print()
    print(f"{info['tokens']:,} tokens ({info['rows']} rows × {info['ctx']}), {width:,} latents; medians of "
          f"{args.rounds} rounds")
    print()
    print("| | wall | peak RSS | written | all latents | per latent |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| siphon dashboard (every latent) | {dash:.1f} s | {median('dashboard', 'rss_mb'):.0f} MB | "
          f"{median('dashboard', 'mb'):.0f} MB | {dash:.1f} s | {dash / width * 1e3:.2f} ms |")
    print(f"| siphon export neuronpedia (every latent) | {export:.1f} s | {median('neuronpedia', 'rss_mb'):.0f} MB | "
          f"{median('neuronpedia', 'mb'):.0f} MB | {export:.1f} s | {export / width * 1e3:.2f} ms |")
    print(f"| SAEDashboard Neuronpedia runner, one batch of {n} | {median('saedashboard', 'wall'):.1f} s "
          f"(load {sd_load:.1f} s, batch {sd_batch:.1f} s) | {median('saedashboard', 'rss_mb'):.0f} MB | "
          f"{median('saedashboard', 'mb'):.1f} MB | {sd_all / 3600:.1f} h ({batches_all} batches, extrapolated) | "
          f"{sd_batch / n * 1e3:.0f} ms |")
    print()
    print(f"per latent: siphon's dashboards {sd_batch / n / (dash / width):.0f}× faster than SAEDashboard's batch, "
          f"its Neuronpedia export {sd_batch / n / (export / width):.0f}×")


if __name__ == "__main__":
    main()
