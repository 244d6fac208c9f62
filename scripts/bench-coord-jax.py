"""JAX's coordination service, measured the way `siphon cluster check` measures siphon's:
barrier p50/p99 pooled over every process, and a key-value broadcast (process 0 sets a key,
every other process reads it and increments a counter, the last one sets a "done" key that
process 0 waits for). Baseline for docs/BENCHMARKS.md ("Control plane").

    python scripts/bench-coord-jax.py --processes 2,8 --rounds 1000
"""
import argparse, json, os, socket, subprocess, sys, time


def worker(rounds):
    import jax
    from jax._src import distributed
    pid, n = int(os.environ["PID"]), int(os.environ["N"])
    jax.distributed.initialize(os.environ["ADDR"], num_processes=n, process_id=pid)
    client = distributed.global_state.client
    for i in range(5):
        client.wait_at_barrier(f"warm{i}", 60_000)
    lat = []
    for i in range(rounds):
        t = time.perf_counter()
        client.wait_at_barrier(f"b{i}", 60_000)
        lat.append(time.perf_counter() - t)
    bcast = []
    if n > 1:
        for i in range(rounds):
            client.wait_at_barrier(f"bc{i}", 60_000)
            if pid == 0:
                t = time.perf_counter()
                client.key_value_set(f"bcast/{i}", "payload")
                client.blocking_key_value_get(f"done/{i}", 60_000)
                bcast.append(time.perf_counter() - t)
            else:
                client.blocking_key_value_get(f"bcast/{i}", 60_000)
                # JAX's KV has no increment: each reader sets its own ack; the last-numbered
                # process gathers them and sets done.
                client.key_value_set(f"ack/{i}/{pid}", "1")
                if pid == n - 1:
                    for p in range(1, n):
                        client.blocking_key_value_get(f"ack/{i}/{p}", 60_000)
                    client.key_value_set(f"done/{i}", "1")
    client.key_value_set(f"samples/{pid}", json.dumps(lat))
    client.wait_at_barrier("end", 60_000)
    if pid == 0:
        pooled = []
        for p in range(n):
            pooled += json.loads(client.blocking_key_value_get(f"samples/{p}", 60_000))
        print(json.dumps({"barrier": pooled, "bcast": bcast}))
    client.wait_at_barrier("end2", 60_000)
    jax.distributed.shutdown()


def pct(xs, q):
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, int(-(-q * len(xs) // 1)) - 1))] * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", default="2,8")
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--worker", action="store_true")
    a = ap.parse_args()
    if a.worker:
        return worker(a.rounds)
    print("| processes | barrier p50 | barrier p99 | kv broadcast p50 | kv broadcast p99 |")
    print("|---|---|---|---|---|")
    for n in [int(x) for x in a.processes.split(",")]:
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        procs = []
        try:
            for pid in range(n):
                env = dict(os.environ, PID=str(pid), N=str(n), ADDR=f"127.0.0.1:{port}",
                           JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
                procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--rounds", str(a.rounds)],
                                              env=env, stdout=subprocess.PIPE if pid == 0 else subprocess.DEVNULL))
            out = procs[0].communicate(timeout=600)[0].decode()
            for p in procs[1:]:
                p.wait(timeout=600)
        finally:
            for p in procs:
                p.kill()
        r = json.loads(out.strip().splitlines()[-1])
        b = r["bcast"]
        bc = f"{pct(b, .5):.3f} ms | {pct(b, .99):.3f} ms" if b else "- | -"
        print(f"| {n} | {pct(r['barrier'], .5):.3f} ms | {pct(r['barrier'], .99):.3f} ms | {bc} |", flush=True)


if __name__ == "__main__":
    main()
