"""Consumer-side throughput of a live stream against the same extraction written to local
disk, interleaved on one machine, and the producer's memory while its consumer pauses.

    python scripts/bench/stream_vs_disk.py SIPHON ROUNDS -- EXTRACT_FLAGS...

Each round runs `SIPHON extract EXTRACT_FLAGS` twice: to a temporary directory (tokens kept in
the dataset / wall seconds from launch to exit), then with `--output stream://127.0.0.1:PORT`
read by `siphon.stream` in this process (tokens received / wall seconds from launch to the
last batch). Both walls include the model's load and compilation; the steady rates leave them
out (disk: the timing record's; stream: from the first batch received to the last). Peak RSS
of each extraction process from wait4. Then one stream whose consumer stops reading for 10 s
halfway: the producer's RSS sampled through the pause.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import siphon  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(siphon_bin: str, flags: List[str], output: str) -> subprocess.Popen:
    return subprocess.Popen([siphon_bin, "extract", *flags, "--output", output, "--run", "bench"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def reap(p: subprocess.Popen) -> float:
    """Waits for `p`; its peak RSS in MB."""
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"siphon extract failed ({p.returncode}):\n{p.stderr.read()[-4000:] if p.stderr else ''}")
    return usage.ru_maxrss / 1024


def rss_mb(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def disk(siphon_bin: str, flags: List[str], tmp: pathlib.Path, r: int) -> Dict[str, float]:
    out = tmp / f"disk-{r}"
    t0 = time.monotonic()
    p = launch(siphon_bin, flags, str(out))
    peak = reap(p)
    wall = time.monotonic() - t0
    tokens = siphon.open_dataset(out / "bench").tokens
    timing = [json.loads(f.read_text()) for f in (out / "bench" / "timing").glob("*.json")]
    steady = sum(t["tokens"] for t in timing) / max(t["seconds"] for t in timing)
    return {"tokens": tokens, "wall": wall, "rate": tokens / wall, "steady": steady, "peak_mb": peak}


def stream(siphon_bin: str, flags: List[str], pause: Optional[float] = None) -> Dict[str, float]:
    url = f"stream://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    p = launch(siphon_bin, flags, url)
    first: Optional[float] = None
    tokens, batches, paused = 0, 0, []
    hooks = None
    for b in siphon.stream(url, batch_size=4096, seed=0, connect_timeout=600):
        if first is None:
            first = time.monotonic()
        tokens += len(b["token_ids"])
        batches += 1
        if pause is not None and batches == 4:
            # Stop reading: the producer's RSS through the pause.
            end = time.monotonic() + pause
            while time.monotonic() < end:
                paused.append(rss_mb(p.pid))
                time.sleep(0.25)
    last = time.monotonic()
    peak = reap(p)
    assert first is not None
    out = {"tokens": tokens, "wall": last - t0, "rate": tokens / (last - t0), "steady": tokens / (last - first),
           "peak_mb": peak}
    if paused:
        out.update(pause_start_mb=paused[0], pause_max_mb=max(paused), pause_end_mb=paused[-1])
    return out


def main() -> None:
    siphon_bin, rounds = sys.argv[1], int(sys.argv[2])
    flags = sys.argv[sys.argv.index("--") + 1 :]
    runs: List[Tuple[str, Dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            runs.append(("disk", disk(siphon_bin, flags, pathlib.Path(tmp), r)))
            runs.append(("stream", stream(siphon_bin, flags)))
    for kind, m in runs:
        print(f"{kind:6s} {m['tokens']:>8.0f} tokens  wall {m['wall']:6.1f} s  {m['rate']:7.0f} tok/s  "
              f"steady {m['steady']:7.0f} tok/s  peak RSS {m['peak_mb']:6.0f} MB")
    rate = {k: sum(m["rate"] for kk, m in runs if kk == k) / rounds for k in ("disk", "stream")}
    steady = {k: sum(m["steady"] for kk, m in runs if kk == k) / rounds for k in ("disk", "stream")}
    print(f"stream / disk: {100 * rate['stream'] / rate['disk']:.1f}% (wall), "
          f"{100 * steady['stream'] / steady['disk']:.1f}% (steady)")
    m = stream(siphon_bin, flags, pause=10.0)
    print(f"paused consumer (10 s after 4 batches): producer RSS {m['pause_start_mb']:.0f} MB at the pause, "
          f"at most {m['pause_max_mb']:.0f} MB during it, {m['pause_end_mb']:.0f} MB at its end; "
          f"peak over the run {m['peak_mb']:.0f} MB")


if __name__ == "__main__":
    main()
