"""Prints each host's figures from a `siphon extract` run's timing records: end-to-end
tokens/s against device-only compute (the programs' time on the devices), each stage of the
output path with its seconds and GB/s, and the writer's CPU time per token (conversion and
sealing: CPU seconds of their threads since the CRC change; busy seconds before it, which is
the same for these compute-bound stages).

    python3 scripts/bench/extract_timing.py OUTPUT/RUN/timing
"""

import json
import pathlib
import sys


def rate(bytes_: int, seconds: float) -> str:
    return f"{bytes_ / seconds / 1e9:.2f} GB/s" if seconds > 0 else "-"


for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    t = json.loads(f.read_text())
    e2e, comp = t["tokens"] / t["seconds"], t["tokens"] / t["compute_seconds"]
    print(f"{t['host']}: {t['tokens']} tokens, end to end {e2e:.0f} tok/s, device-only compute {comp:.0f} tok/s, "
          f"ratio {100 * e2e / comp:.1f}%")
    path, writer = t.get("path"), t.get("writer")
    if path and writer:
        bound = "host" if path["wait_host_s"] > path["wait_device_s"] else "device"
        print(f"  depth {t.get('depth')}, {path['steps']} steps, {bound}-bound "
              f"(loop waited {path['wait_host_s']:.2f} s for the host, the host {path['wait_device_s']:.2f} s for the device)")
        print(f"  program {path['program_s']:.2f} s | copy to host {path['copy_s']:.2f} s, "
              f"{rate(path['copy_bytes'], path['copy_s'])} | hand-over {path['push_s']:.2f} s | "
              f"convert {writer['convert_s']:.2f} s, {rate(writer['convert_bytes'], writer['convert_s'])} | "
              f"seal {writer['seal_s']:.2f} s, {rate(writer['seal_bytes'], writer['seal_s'])} | "
              f"upload {writer['upload_s']:.2f} s, {rate(writer['upload_bytes'], writer['upload_s'])}")
        cpu = writer["convert_s"] + writer["seal_s"]
        print(f"  writer CPU (convert + seal) {cpu:.3f} s: {1e6 * cpu / t['tokens']:.1f} us per token, "
              f"{cpu / (writer['convert_bytes'] / 1e9):.3f} core-s per GB")
