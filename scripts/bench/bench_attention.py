"""Attention alone: cuDNN's fused attention as siphon's programs call it, against torch SDPA.

Causal, bf16, every row full, at Llama-3-8B's widths (32 query heads, 8 key/value heads of
128) unless told otherwise. The Rust side is the `bench_attention` example (a child process:
the call alone compiled on the CUDA PJRT plugin); torch runs
`scaled_dot_product_attention(..., is_causal=True, enable_gqa=True)` in this process. The two
alternate, `--rounds` times, each timing `--repeats` calls until the last is done on the
device; prints each side's median ms, TFLOP/s and siphon's speed as a share of SDPA's.
"""

import argparse
import os
import statistics
import subprocess
import sys

import torch


def sdpa_ms(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, repeats: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench-bin", required=True, help="the bench_attention example")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=10)
    a = p.parse_args()

    b, s, n, kv, d = a.batch, a.seq, a.heads, a.kv_heads, a.head_dim
    # SDPA's layout is [B, N, S, D]; the same values in any layout cost the same here.
    q = torch.randn(b, n, s, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, kv, s, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, kv, s, d, device="cuda", dtype=torch.bfloat16)
    sdpa_ms(q, k, v, 2)  # warm up

    env = dict(os.environ, REPEATS=str(a.repeats))
    args = [a.bench_bin, str(b), str(s), str(n), str(kv), str(d)]
    server = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert server.stdin is not None and server.stdout is not None
    ready = server.stdout.readline().strip()
    if not ready.startswith("ready"):
        print(f"bench_attention did not start: {ready!r}", file=sys.stderr)
        return 1
    print(f"siphon {ready}")

    def siphon_ms() -> float:
        server.stdin.write("run\n")
        server.stdin.flush()
        line = server.stdout.readline().strip()
        if not line.startswith("ms="):
            raise RuntimeError(f"bench_attention: {line!r}")
        return float(line[3:])

    siphon_ms()  # warm up
    times: dict[str, list[float]] = {"siphon (cuDNN via XLA)": [], "torch SDPA": []}
    for _ in range(a.rounds):
        times["siphon (cuDNN via XLA)"].append(siphon_ms())
        times["torch SDPA"].append(sdpa_ms(q, k, v, a.repeats))
    server.stdin.write("quit\n")
    server.stdin.flush()
    server.wait(timeout=30)

    # Causal: half of the two products' 4·B·N·S²·D FLOPs.
    flops = 2 * b * n * s * s * d
    print(f"attention alone, causal bf16, B={b} S={s} heads={n} kv={kv} dim={d}, {a.rounds} rounds x {a.repeats} calls")
    print("| implementation | ms (median, min-max) | TFLOP/s |")
    print("|---|---|---|")
    for name, ms in times.items():
        med = statistics.median(ms)
        print(f"| {name} | {med:.3f} ({min(ms):.3f}-{max(ms):.3f}) | {flops / med / 1e9:.0f} |")
    ratio = statistics.median(times["torch SDPA"]) / statistics.median(times["siphon (cuDNN via XLA)"])
    print(f"siphon's speed / SDPA's: {ratio:.2f}x (acceptance: >= 0.85x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
