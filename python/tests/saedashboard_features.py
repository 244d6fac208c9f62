"""Run in SAEDashboard's venv (scripts/setup-python-saedashboard.sh) by test_saedashboard.py:
SAEDashboard's own runner (`SaeVisRunner`, with the layout its Neuronpedia runner uses) on a
model, a SAELens dictionary and token rows, writing as JSON the feature data the test compares
with siphon's dashboards, and the same features converted to a Neuronpedia batch by
SAEDashboard's `NeuronpediaConverter` (with its runner's vocabulary, `get_vocab_dict`), which
the test compares with `siphon export neuronpedia`'s. Its correlation tables are also computed
again by SAEDashboard's `RollingCorrCoef` over the tokens not ignored (siphon's tokens: the run
leaves the ignored ones out), from the same SAE activations.

    python saedashboard_features.py MODEL_DIR SAE_DIR TOKENS.npy IGNORE_IDS FEATURES TOKENIZER_JSON OUT.json

The model is loaded as TransformerLens's `HookedTransformer.from_pretrained` loads one (its
config and state dict converted from the HF files, then `load_and_process_state_dict` with the
defaults: `fold_ln`, `center_writing_weights`, `center_unembed`), a local directory being no
official model name. IGNORE_IDS and FEATURES are comma-separated integers.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import types

import numpy as np
import torch
from sae_lens import SAE, HookedSAETransformer
from transformer_lens import loading_from_pretrained as loading
from transformers import AutoModelForCausalLM

from sae_dashboard.components_config import (
    ActsHistogramConfig,
    Column,
    FeatureTablesConfig,
    LogitsHistogramConfig,
    LogitsTableConfig,
    SequencesConfig,
)
from sae_dashboard.layout import SaeVisLayoutConfig
from sae_dashboard.neuronpedia.neuronpedia_converter import FeatureProcessor, NeuronpediaConverter
from sae_dashboard.neuronpedia.neuronpedia_runner import NeuronpediaRunner
from sae_dashboard.neuronpedia.neuronpedia_runner_config import NeuronpediaRunnerConfig
from sae_dashboard.sae_vis_data import SaeVisConfig
from sae_dashboard.sae_vis_runner import SaeVisRunner
from sae_dashboard.utils_fns import RollingCorrCoef
from transformers import PreTrainedTokenizerFast

#: The Neuronpedia batch's names (the test passes them to siphon too).
MODEL_ID, SAE_SET, DATASET = "tiny-llama", "res-test", "fixture-corpus"


def load_model(model_dir: str) -> HookedSAETransformer:
    # TransformerLens picks an architecture from words in the name ("llama", "gemma-2-", ...)
    # before reading config.json: a path under a neutral name makes it read the file.
    path = os.path.join(tempfile.mkdtemp(), "model")
    os.symlink(os.path.abspath(model_dir), path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    cfg = loading.get_pretrained_model_config(path, fold_ln=True, device="cpu", dtype=torch.float32)
    state = loading.get_pretrained_state_dict(path, cfg, hf, dtype=torch.float32)
    cfg.tokenizer_name = None  # the runner reads token ids only
    model = HookedSAETransformer(cfg, None, move_to_device=False)
    model.load_and_process_state_dict(state, fold_ln=True, center_writing_weights=True, center_unembed=True,
                                      fold_value_biases=True)
    return model


def neuronpedia_layout() -> SaeVisLayoutConfig:
    """The layout SAEDashboard's Neuronpedia runner gives `SaeVisRunner` (its defaults: 5
    intervals of 5 examples, the top 20, 3-row feature tables)."""
    return SaeVisLayoutConfig(columns=[Column(
        SequencesConfig(stack_mode="stack-all", buffer=None, compute_buffer=True, n_quantiles=5,
                        top_acts_group_size=20, quantile_group_size=5),
        ActsHistogramConfig(), LogitsHistogramConfig(), LogitsTableConfig(), FeatureTablesConfig(n_rows=3),
    )])


def vocab_dict(tokenizer_json: str, d_vocab: int) -> dict:
    """The Neuronpedia runner's vocabulary: its own `get_vocab_dict` on the tokenizer."""
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=tokenizer_json)
    runner = types.SimpleNamespace(model=types.SimpleNamespace(tokenizer=tokenizer, cfg=types.SimpleNamespace(d_vocab=d_vocab)))
    return NeuronpediaRunner.get_vocab_dict(runner)  # type: ignore[arg-type]


@torch.inference_mode()
def included_correlations(model: HookedSAETransformer, sae: SAE, tokens: torch.Tensor, ignored: set,
                          features: list) -> dict:
    """SAEDashboard's feature tables' correlations (its `RollingCorrCoef`, as its generator
    updates them) over the tokens whose ids are not ignored, rounded as its converter rounds."""
    hook = sae.cfg.metadata.hook_name
    _, cache = model.run_with_cache(tokens, names_filter=[hook])
    acts = cache[hook].reshape(-1, cache[hook].shape[-1])
    keep = ~torch.isin(tokens.reshape(-1), torch.tensor(sorted(ignored), dtype=tokens.dtype))
    acts = acts[keep]
    feats = sae.encode(acts)[:, features]
    neurons = RollingCorrCoef()
    encoder = RollingCorrCoef(indices=features, with_self=True)
    neurons.update(feats.T, acts.T)
    encoder.update(feats.T, feats.T)
    out = {}
    for name, corr in (("neurons", neurons), ("features", encoder)):
        indices, pearson, cossim = corr.topk_pearson(k=3)
        out[name] = [{"indices": i, "pearson": FeatureProcessor.round_list(p), "l1": FeatureProcessor.round_list(c)}
                     for i, p, c in zip(indices, pearson, cossim)]
    return out


def main() -> None:
    model_dir, sae_dir, tokens_path, ignore, features_arg, tokenizer_json, out = sys.argv[1:8]
    model = load_model(model_dir)
    sae = SAE.load_from_disk(sae_dir, device="cpu")
    tokens = torch.from_numpy(np.load(tokens_path)).long()
    features = [int(f) for f in features_arg.split(",")]
    ignored = {int(i) for i in ignore.split(",") if i}
    layout = neuronpedia_layout()
    cfg = SaeVisConfig(hook_point=sae.cfg.metadata.hook_name, features=features, minibatch_size_features=len(features),
                       minibatch_size_tokens=64, feature_centric_layout=layout, perform_ablation_experiments=False,
                       dtype="float32", device="cpu", ignore_tokens=ignored)
    data = SaeVisRunner(cfg).run(encoder=sae, model=model, tokens=tokens)
    result = {}
    for feature in features:
        fd = data.feature_data_dict[feature]
        groups = fd.sequence_data.seq_group_data
        # Without a buffer a sequence's data start at its second token (SAEDashboard's
        # `token_ids = tokens[indices_buf[:, 1:]]`), its values rounded to 4 decimals.
        top = [s.feat_acts[s.qualifying_token_index - 1] for s in groups[0].seq_data]
        logits = fd.logits_table_data
        result[feature] = {
            "top": top,
            "top_rows": [[int(s.original_index), int(s.qualifying_token_index)] for s in groups[0].seq_data],
            "logits_top_ids": logits.top_token_ids, "logits_top": logits.top_logits,
            "logits_bottom_ids": logits.bottom_token_ids, "logits_bottom": logits.bottom_logits,
            "acts_hist": fd.acts_histogram_data.bar_heights, "acts_hist_values": fd.acts_histogram_data.bar_values,
            "acts_title": fd.acts_histogram_data.title,
            "logits_hist": fd.logits_histogram_data.bar_heights,
            "logits_hist_values": fd.logits_histogram_data.bar_values,
        }
    hook = sae.cfg.metadata.hook_name
    np_cfg = NeuronpediaRunnerConfig(sae_set=SAE_SET, sae_path=sae_dir, outputs_dir=tempfile.mkdtemp(),
                                     huggingface_dataset_path=DATASET, n_prompts_total=int(tokens.shape[0]),
                                     n_tokens_in_prompt=int(tokens.shape[1]), model_id=MODEL_ID,
                                     layer=int(hook.split(".")[1]))
    batch = NeuronpediaConverter.convert_to_np_json(model, data, np_cfg, vocab_dict(tokenizer_json, model.cfg.d_vocab))
    with open(out, "w") as f:
        json.dump({"features": result, "neuronpedia": json.loads(batch),
                   "included": included_correlations(model, sae, tokens, ignored, features)}, f)


if __name__ == "__main__":
    main()
