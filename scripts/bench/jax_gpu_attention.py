"""JAX's own causal attention compiled for an H100 by the CUDA plugin, no GPU needed: the
reference `scripts/bench-gpu-plans.sh` holds siphon's attention temporaries against.

`jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=...)` at Llama-3-8B's
attention shape (batch 32 x 1024 tokens, 32 query heads and 8 key/value heads of 128, bf16),
with cuDNN's fused kernel and with XLA's ops, each compiled for a topology the plugin makes
from its own description of an H100 (the same create options siphon passes). Prints JSON:
each implementation's temporaries, whether cuDNN's call is in the compiled program, and the
compile time.
"""

from __future__ import annotations

import json
import mmap
import os
import pathlib
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jax_plugins.xla_cuda12 as cuda_plugin  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import SingleDeviceSharding  # noqa: E402

DEVICE = "NVIDIA H100 80GB HBM3"
BATCH, SEQ, HEADS, KV_HEADS, HEAD_DIM = 32, 1024, 32, 8, 128
TARGET = "__cudnn$fmhaSoftmax"


def description(device: str) -> str:
    """The plugin's own target description of `device`, as siphon reads it."""
    path = pathlib.Path(cuda_plugin.__file__).parent / "xla_cuda_plugin.so"
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        at = m.find(f'device_description_str: "{device}"'.encode())
        if at < 0:
            sys.exit(f"the plugin {path} describes no {device}")
        start = m.rfind(b"\0", 0, at) + 1
        end = m.find(b"\0", at)
        return m[start:end].decode()


def main() -> None:
    topology = topologies.get_topology_desc(
        platform="cuda", topology_name="h100", target_config=description(DEVICE), topology="1x1x1"
    )
    on = SingleDeviceSharding(topology.devices[0])
    q = jax.ShapeDtypeStruct((BATCH, SEQ, HEADS, HEAD_DIM), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((BATCH, SEQ, KV_HEADS, HEAD_DIM), jnp.bfloat16)
    results = []
    for implementation in ("cudnn", "xla"):

        def attention(q, k, v, implementation=implementation):
            return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)

        start = time.perf_counter()
        compiled = jax.jit(attention, in_shardings=(on, on, on)).lower(q, kv, kv).compile()
        seconds = time.perf_counter() - start
        results.append(
            {
                "name": f"jax.nn.dot_product_attention(implementation={implementation!r})",
                "temp_size_in_bytes": compiled.memory_analysis().temp_size_in_bytes,
                "fused_calls": compiled.as_text().count(f'custom_call_target="{TARGET}"'),
                "compile_seconds": seconds,
            }
        )
    json.dump(
        {
            "jax": jax.__version__,
            "device": DEVICE,
            "q": [BATCH, SEQ, HEADS, HEAD_DIM],
            "kv": [BATCH, SEQ, KV_HEADS, HEAD_DIM],
            "implementations": results,
        },
        sys.stdout,
        indent=2,
    )
    print()


if __name__ == "__main__":
    main()
