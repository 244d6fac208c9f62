"""Forward tokens/s: siphon (Rust + PJRT plugin) vs Hugging Face transformers, interleaved.

Builds (once, cached) a model with random weights of one family's shape (`--family`:
Qwen2.5-0.5B, Gemma 2 2B's widths with 6 of its 26 layers so that two f32 copies fit in
this machine's memory, Gemma 4's default widths with 6 layers, GPT-2 small,
Qwen3-30B-A3B's widths with 2 of its 48 layers, gpt-oss-20b's with 2 of its 24, or
Qwen3.5's defaults with 4 of its 32 layers), saves it as an HF directory, then alternates timed forwards of HF transformers (torch, in this process) and of
the Rust bench server (`bench_forward` example, a child process) on the same weights and
input, with the same thread count. Reports medians, and the max-abs difference of the final
hidden state as a sanity check.

On a GPU machine (`--device cuda --dtype bf16`, the CUDA PJRT plugin located as siphon does)
both sides run on the GPU, each timed to its output on the host; `--layers` overrides the
shape's depth (Gemma 2 2B's full 26), `--family llama3_8b` is Llama-3-8B's shape, and the
report adds each side's model FLOPs utilisation against `--peak-tflops`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import (Gemma2Config, Gemma2Model, Gemma4TextConfig, Gemma4TextModel, GPT2Config, GPT2Model, GptOssConfig, GptOssModel,
                          LlamaConfig, LlamaModel, Qwen2Config, Qwen2Model, Qwen3_5TextConfig, Qwen3_5TextModel, Qwen3MoeConfig,
                          Qwen3MoeModel)

QWEN2 = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
    hidden_act="silu",
)

# Gemma 2 2B's widths (vocab, hidden, MLP, heads, head_dim), 6 layers instead of 26.
GEMMA2 = dict(
    vocab_size=256000,
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    max_position_embeddings=8192,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    query_pre_attn_scalar=256,
    sliding_window=4096,
    attn_logit_softcapping=50.0,
    final_logit_softcapping=30.0,
    tie_word_embeddings=True,
    hidden_activation="gelu_pytorch_tanh",
)

# Gemma4TextConfig's default widths (its docstring's checkpoint is gemma-4-e2b-it: hidden 2304,
# MLP 9216, 8 heads of 256 with 4 KV heads, global layers 512 wide, per-layer inputs of 256,
# vocab 262144), 6 layers: local, local, local, global, then one of each attending over
# layers 2 and 3's keys and values with double-wide MLPs.
GEMMA4 = dict(
    vocab_size=262144,
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    global_head_dim=512,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    sliding_window=512,
    layer_types=["sliding_attention"] * 3 + ["full_attention", "sliding_attention", "full_attention"],
    num_kv_shared_layers=2,
    use_double_wide_mlp=True,
    hidden_size_per_layer_input=256,
    vocab_size_per_layer_input=262144,
    tie_word_embeddings=True,
    hidden_activation="gelu_pytorch_tanh",
)

# Qwen3-30B-A3B's widths (hidden 2048, 32 heads of 128 with 4 KV heads, 128 experts 768 wide,
# 8 per token, renormalised), 2 of its 48 layers.
QWEN3_MOE = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_hidden_layers=2,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=False,
    hidden_act="silu",
)

# gpt-oss-20b's widths (vocab 201088, hidden 2880, 64 heads of 64 with 8 KV heads, 32 experts
# 2880 wide, 4 per token, sinks, YaRN, a window of 128 on every other layer), 2 of its 24 layers.
GPT_OSS = dict(
    vocab_size=201088,
    hidden_size=2880,
    intermediate_size=2880,
    num_hidden_layers=2,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=64,
    num_local_experts=32,
    num_experts_per_tok=4,
    sliding_window=128,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                     "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
    tie_word_embeddings=False,
)

# Qwen3_5TextConfig's defaults (its docstring's Qwen3.5-9B style: hidden 4096, 16 heads of 256
# with 4 KV heads and an output gate, MLP 12288, Gated DeltaNet with 16 key heads of 128 and 32
# value heads of 128), 4 of its 32 layers (three linear-attention, one full), the vocabulary cut
# to 32000 so that two f32 copies fit in this machine's memory (it costs only the lookup).
QWEN3_5 = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=12288,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    num_hidden_layers=4,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    tie_word_embeddings=False,
)

# Llama-3-8B.
LLAMA3_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    tie_word_embeddings=False,
    hidden_act="silu",
)

# GPT-2 small (124M).
GPT2 = dict(vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024, activation_function="gelu_new")

# shape, config class, model class, architecture, the prefix of the saved names (GPT-2's
# checkpoints on the hub have none), model_type.
FAMILIES = {
    "qwen2": (QWEN2, Qwen2Config, Qwen2Model, "Qwen2ForCausalLM", "model.", "qwen2"),
    "gemma2": (GEMMA2, Gemma2Config, Gemma2Model, "Gemma2ForCausalLM", "model.", "gemma2"),
    "gemma4": (GEMMA4, Gemma4TextConfig, Gemma4TextModel, "Gemma4ForCausalLM", "model.", "gemma4_text"),
    "gpt2": (GPT2, GPT2Config, GPT2Model, "GPT2LMHeadModel", "", "gpt2"),
    "llama3_8b": (LLAMA3_8B, LlamaConfig, LlamaModel, "LlamaForCausalLM", "model.", "llama"),
    "qwen3_moe": (QWEN3_MOE, Qwen3MoeConfig, Qwen3MoeModel, "Qwen3MoeForCausalLM", "model.", "qwen3_moe"),
    "gpt_oss": (GPT_OSS, GptOssConfig, GptOssModel, "GptOssForCausalLM", "model.", "gpt_oss"),
    "qwen3_5": (QWEN3_5, Qwen3_5TextConfig, Qwen3_5TextModel, "Qwen3_5ForCausalLM", "model.", "qwen3_5_text"),
}

# Families whose checkpoints on the hub store one tensor per expert (transformers fuses them in
# memory); GPT-OSS's are stored fused, as transformers holds them.
PER_EXPERT = {"qwen3_moe"}


def to_hub(state):
    """transformers' fused expert tensors (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj`
    [E, H, I]) as the hub's checkpoints store them: one `experts.{e}.{gate,up,down}_proj.weight`
    per expert."""
    out = {}
    for k, v in state.items():
        if k.endswith("experts.gate_up_proj"):
            base, half = k[: -len("gate_up_proj")], v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = v[e, :half].contiguous()
                out[f"{base}{e}.up_proj.weight"] = v[e, half:].contiguous()
        elif k.endswith("experts.down_proj"):
            base = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[k] = v.contiguous()
    return out


def from_hub(state):
    """The inverse of `to_hub`."""
    out, experts = {}, {}
    for k, v in state.items():
        parts = k.split(".")
        if "experts" in parts and parts[-1] == "weight":
            i = parts.index("experts")
            experts.setdefault((".".join(parts[: i + 1]), parts[i + 2]), {})[int(parts[i + 1])] = v
        else:
            out[k] = v
    for (base, proj), by_e in experts.items():
        stack = torch.stack([by_e[e] for e in sorted(by_e)])
        if proj == "down_proj":
            out[f"{base}.down_proj"] = stack
        elif proj == "gate_proj":
            up = torch.stack([v for _, v in sorted(experts[(base, "up_proj")].items())])
            out[f"{base}.gate_up_proj"] = torch.cat([stack, up], dim=1)
    return out


def make_model(model_dir, family, batch, seq, layer_type=None, layers=None, device="cpu", dtype=torch.float32):
    shape, config_class, model_class, architecture, prefix, model_type = FAMILIES[family]
    if layer_type:
        # One layer of one type (a hybrid's cost per layer type).
        shape = dict(shape, num_hidden_layers=1, layer_types=[layer_type])
    if layers:
        shape = dict(shape, num_hidden_layers=layers)
    torch.manual_seed(0)
    config = config_class(**shape)
    with torch.device(device):
        model = model_class(config).eval().to(dtype)
    weights_path = os.path.join(model_dir, "model.safetensors")
    if not os.path.exists(weights_path):
        os.makedirs(model_dir, exist_ok=True)
        with torch.no_grad():
            # Biases start at zero in HF's init; give them values so they count.
            for name, p in model.named_parameters():
                if name.endswith(".bias"):
                    p.normal_(0.0, 0.02)
        state = {k: v.cpu() for k, v in model.state_dict().items()}
        state = to_hub(state) if family in PER_EXPERT else {k: v.contiguous() for k, v in state.items()}
        state = {prefix + k: v for k, v in state.items() if not k.endswith(".attn.bias")}
        save_file(state, weights_path + ".tmp")
        os.replace(weights_path + ".tmp", weights_path)
        cfg = dict(shape, model_type=model_type, architectures=[architecture], torch_dtype=str(dtype).split(".")[1])
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
    else:
        from safetensors.torch import load_file

        state = load_file(weights_path)
        state = {k[len(prefix):]: v for k, v in state.items()}
        model.load_state_dict(from_hub(state) if family in PER_EXPERT else state, strict=False)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, shape["vocab_size"], size=(batch, seq), dtype=np.int32)
    ids.tofile(os.path.join(model_dir, "input_ids.bin"))
    with open(os.path.join(model_dir, "input_shape.txt"), "w") as f:
        f.write(f"{batch} {seq}\n")
    return model, torch.from_numpy(ids.astype(np.int64))


def forward_flops_per_token(model, seq):
    """Forward FLOPs per token: 2 per weight of every matrix product (the embedding lookup is
    none; a tied or untied head is not run; a mixture's experts count at top_k / n_experts,
    the share a token is routed through) plus causal attention's scores and mixing, on
    average seq/2 keys per query: 2 x 2 x (seq/2) x n_heads x head_dim per layer. Linear
    attention layers are counted as full attention."""
    config = model.config
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    routed = config.num_experts_per_tok / experts if experts else 1.0
    n = 0.0
    for name, p in model.named_parameters():
        if p.dim() < 2 or any(e in name for e in ("embed", "wte", "wpe")):
            continue
        n += p.numel() * (routed if ".experts." in name else 1.0)
    return 2 * n + 2 * seq * sum(attention_widths(config))


def attention_widths(config):
    """Each layer's heads x head_dim; per layer where the config varies them across layers
    (Gemma 4's global layers have wider heads)."""
    per_layer = getattr(config, "per_layer_config", None)
    layers = [per_layer[i] for i in range(config.num_hidden_layers)] if per_layer is not None else []
    widths = []
    for layer in layers or [config] * config.num_hidden_layers:
        heads = layer.num_attention_heads
        widths.append(heads * (getattr(layer, "head_dim", None) or config.hidden_size // heads))
    return widths


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench-bin", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--hooks", default="all")
    ap.add_argument("--family", choices=sorted(FAMILIES), default="qwen2")
    ap.add_argument("--layer-type", choices=["linear_attention", "full_attention"],
                    help="a hybrid (qwen3_5) with one layer of this type only")
    ap.add_argument("--layers", type=int, help="override the shape's number of layers")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="the GPU's dense peak for --dtype, for the MFU figures (H100/H200 bf16: 989)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    if args.layer_type:
        args.dir = f"{args.dir}-{args.layer_type}"
    if args.layers:
        args.dir = f"{args.dir}-{args.layers}l"
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    if args.dtype != "f32":
        args.dir = f"{args.dir}-{args.dtype}"
    model, ids = make_model(args.dir, args.family, args.batch, args.seq, args.layer_type, args.layers,
                            args.device, dtype)
    ids = ids.to(args.device)
    mask = torch.ones_like(ids)
    tokens = args.batch * args.seq
    flops_per_token = forward_flops_per_token(model, args.seq)

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen(
        [args.bench_bin, args.dir, "--hooks", args.hooks, "--dtype", args.dtype],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )

    def ask(cmd):
        proc.stdin.write(cmd + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline().strip()
        if not line or line.startswith("error"):
            raise SystemExit(f"bench server: {line!r}")
        return line

    ready = proc.stdout.readline().strip()
    if not ready.startswith("ready"):
        raise SystemExit(f"bench server failed to start: {ready!r}")
    print(f"siphon: {ready}", flush=True)

    def hf_once():
        # Like siphon's `run`: the forward and the requested activations on the host.
        if args.device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, output_hidden_states=args.hooks == "all", use_cache=False)
            host = [h.cpu() for h in out.hidden_states] if args.hooks == "all" else [out.last_hidden_state.cpu()]
        return (time.perf_counter() - t) * 1e3, host

    def siphon_once():
        # `ms=… device_ms=… host_ms=…`: the step, the program on the device, the copy to the host.
        fields = dict(word.split("=") for word in ask("run").split())
        return float(fields["ms"]), float(fields["device_ms"]), float(fields["host_ms"])

    # Warm-up (first calls allocate and page in weights).
    hf_once()
    siphon_once()
    hf_ms, siphon_ms, device_ms, host_ms = [], [], [], []
    for r in range(args.rounds):
        h, out = hf_once()
        s, d, c = siphon_once()
        hf_ms.append(h)
        siphon_ms.append(s)
        device_ms.append(d)
        host_ms.append(c)
        print(f"round {r}: hf {h:.0f} ms ({tokens / h * 1e3:.0f} tok/s), siphon {s:.0f} ms ({tokens / s * 1e3:.0f} tok/s: "
              f"device {d:.0f} ms, to host {c:.0f} ms)", flush=True)

    dump = os.path.join(args.dir, "siphon_last.bin")
    ask(f"dump {dump}")
    ours = np.fromfile(dump, dtype=np.float32).reshape(args.batch, args.seq, -1)
    theirs = out[-1].float().numpy()
    np.save(os.path.join(args.dir, "hf_last.npy"), theirs)
    diff = float(np.abs(ours - theirs).max())
    scale = float(np.abs(theirs).max())
    proc.stdin.close()
    proc.wait()

    hf_med, s_med = statistics.median(hf_ms), statistics.median(siphon_ms)
    d_med, c_med = statistics.median(device_ms), statistics.median(host_ms)
    out_bytes = sum(o.numel() * o.element_size() for o in out)
    report = {
        "batch": args.batch, "seq": args.seq, "threads": args.threads, "rounds": args.rounds,
        "hf_median_ms": round(hf_med, 1), "hf_tok_s": round(tokens / hf_med * 1e3, 1),
        "siphon_median_ms": round(s_med, 1), "siphon_tok_s": round(tokens / s_med * 1e3, 1),
        "speedup": round(hf_med / s_med, 3), "max_abs_diff_last_hidden": diff, "max_abs_last_hidden": scale,
        "siphon_device_ms": round(d_med, 1), "siphon_to_host_ms": round(c_med, 1),
        "siphon_device_tok_s": round(tokens / d_med * 1e3, 1),
        "to_host_gb_s": round(out_bytes / (c_med / 1e3) / 1e9, 2) if c_med > 0 else None,
        "gflops_per_token": round(flops_per_token / 1e9, 3),
        "hf_gflop_s": round(flops_per_token * tokens / (hf_med / 1e3) / 1e9, 1),
        "siphon_gflop_s": round(flops_per_token * tokens / (s_med / 1e3) / 1e9, 1),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "dtype": args.dtype,
        "torch": torch.__version__,
    }
    if args.device == "cuda":
        for side in ("hf", "siphon"):
            report[f"{side}_mfu"] = round(report[f"{side}_gflop_s"] / (args.peak_tflops * 1e3), 4)
        device_gflop_s = flops_per_token * tokens / (d_med / 1e3) / 1e9
        report["siphon_device_mfu"] = round(device_gflop_s / (args.peak_tflops * 1e3), 4)
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
