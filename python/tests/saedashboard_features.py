"""Run in SAEDashboard's venv (scripts/setup-python-saedashboard.sh) by test_saedashboard.py:
SAEDashboard's own runner (`SaeVisRunner`, with the layout its Neuronpedia runner uses) on a
model, a SAELens dictionary and token rows, writing the feature data the test compares with
siphon's dashboards as JSON.

    python saedashboard_features.py MODEL_DIR SAE_DIR TOKENS.npy IGNORE_IDS FEATURES OUT.json

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
from sae_dashboard.sae_vis_data import SaeVisConfig
from sae_dashboard.sae_vis_runner import SaeVisRunner


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


def main() -> None:
    model_dir, sae_dir, tokens_path, ignore, features_arg, out = sys.argv[1:7]
    model = load_model(model_dir)
    sae = SAE.load_from_disk(sae_dir, device="cpu")
    tokens = torch.from_numpy(np.load(tokens_path)).long()
    features = [int(f) for f in features_arg.split(",")]
    layout = SaeVisLayoutConfig(columns=[Column(
        SequencesConfig(stack_mode="stack-all", buffer=None, compute_buffer=True, n_quantiles=5,
                        top_acts_group_size=20, quantile_group_size=5),
        ActsHistogramConfig(), LogitsHistogramConfig(), LogitsTableConfig(), FeatureTablesConfig(n_rows=3),
    )])
    cfg = SaeVisConfig(hook_point=sae.cfg.metadata.hook_name, features=features, minibatch_size_features=len(features),
                       minibatch_size_tokens=64, feature_centric_layout=layout, perform_ablation_experiments=False,
                       dtype="float32", device="cpu", ignore_tokens={int(i) for i in ignore.split(",") if i})
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
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
