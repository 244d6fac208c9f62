"""One mixture layer as MaxText runs it, written in plain JAX: the reference for siphon's
grouped form on TPU (docs/BENCHMARKS.md, "Mixtures on TPU").

Router logits, softmax in f32, top-k (renormalized), the tokens' choices sorted by expert,
`jax.lax.ragged_dot` for gate, up and down with each expert's width split over `model`
(`shard_map`: each device its tokens' choices through its columns of every expert, the down
products summed over `model`), combined back by slot times router weight. Compiled — never
run — by libtpu for a slice described by name (`jax.experimental.topologies`), like
`siphon plan --target tpu:…`; prints one JSON line of the compiler's figures per device.

    TPU_LIBRARY_PATH=…/libtpu.so TPU_SKIP_MDS_QUERY=1 python jax_tpu_mixture.py \
        --topology v5e:4x4 --hosts 2,2,1 --data 4 --model 4 --tokens 16384 \
        --hidden 2048 --width 768 --experts 128 --top-k 8
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def layer(x, router, gate, up, down, *, top_k: int, experts: int):
    """One mixture layer on one device's tokens `x` [n, H] and its columns of every expert."""
    logits = (x @ router.T).astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    weights, chosen = jax.lax.top_k(probs, top_k)
    weights = (weights / weights.sum(-1, keepdims=True)).astype(x.dtype)
    flat = chosen.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    rows = x[order // top_k]
    sizes = jnp.bincount(flat, length=experts).astype(jnp.int32)
    dn = jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(([1], [2]), ([], [])), lhs_ragged_dimensions=[0], rhs_group_dimensions=[0]
    )
    g = jax.lax.ragged_dot_general(rows, gate, sizes, dn)
    u = jax.lax.ragged_dot_general(rows, up, sizes, dn)
    y = jax.lax.ragged_dot_general(jax.nn.silu(g) * u, down, sizes, dn)
    y = jax.lax.psum(y, "model")
    out = jnp.zeros_like(y).at[order].set(y)
    return (out.reshape(x.shape[0], top_k, -1) * weights[..., None]).sum(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topology", default="v5e:4x4")
    ap.add_argument("--hosts", default="2,2,1", help="chips per host bounds")
    ap.add_argument("--chip-config", default="default")
    ap.add_argument("--wrap", default="false,false,false")
    ap.add_argument("--data", type=int, default=4)
    ap.add_argument("--model", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    a = ap.parse_args()
    topo = topologies.get_topology_desc(
        topology_name=a.topology,
        platform="tpu",
        chip_config_name=a.chip_config,
        chips_per_host_bounds=tuple(int(v) for v in a.hosts.split(",")),
        num_slices=1,
        wrap=tuple(v == "true" for v in a.wrap.split(",")),
    )
    devices = np.array(topo.devices).reshape(a.data, a.model)
    mesh = Mesh(devices, ("data", "model"))
    bf16 = jnp.bfloat16
    shapes = {
        "x": (jax.ShapeDtypeStruct((a.tokens, a.hidden), bf16), P("data", None)),
        "router": (jax.ShapeDtypeStruct((a.experts, a.hidden), bf16), P()),
        "gate": (jax.ShapeDtypeStruct((a.experts, a.width, a.hidden), bf16), P(None, "model", None)),
        "up": (jax.ShapeDtypeStruct((a.experts, a.width, a.hidden), bf16), P(None, "model", None)),
        "down": (jax.ShapeDtypeStruct((a.experts, a.hidden, a.width), bf16), P(None, None, "model")),
    }
    args = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, p)) for s, p in shapes.values()]
    specs = tuple(p for _, p in shapes.values())
    fn = jax.shard_map(
        partial(layer, top_k=a.top_k, experts=a.experts), mesh=mesh, in_specs=specs, out_specs=P("data", None)
    )
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    hlo = compiled.as_text()
    analytic = 2 * 3 * a.tokens * a.top_k * a.hidden * a.width / (a.data * a.model)
    print(
        json.dumps(
            {
                "flops": cost.get("flops"),
                "analytic_expert_flops": analytic,
                "bytes_accessed": cost.get("bytes accessed"),
                "temp_bytes": memory.temp_size_in_bytes,
                "argument_bytes": memory.argument_size_in_bytes,
                "has_loops": " while(" in hlo or "while(" in hlo.replace(" ", ""),
                "compile_seconds": seconds,
            }
        )
    )


if __name__ == "__main__":
    main()
