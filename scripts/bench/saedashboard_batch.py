"""One batch of SAEDashboard's Neuronpedia runner's work (issue 56's benchmark): its runner
(`SaeVisRunner` with the layout `neuronpedia_runner.py` uses: 20 top activations, 5 intervals
of 5, 50-bin histograms, logit tables, 3-row feature tables) over given token rows for a batch
of latents, then its `NeuronpediaConverter` to a batch file's JSON. Run in SAEDashboard's venv
(scripts/setup-python-saedashboard.sh) by dashboard_vs_saedashboard.py; prints the seconds of
loading and of the batch as JSON on its last line.

    saedashboard_batch.py MODEL_DIR SAE_DIR TOKENS.npy IGNORE_IDS FIRST COUNT OUT.json

The model is loaded as the dashboards' SAEDashboard test loads it (TransformerLens's
processing of the HF files, python/tests/saedashboard_features.py). A TopK dictionary whose
decoder rows are not unit norm keeps its decoder as it is: sae-lens refuses to fold the norms
of such a TopK dictionary (it would change which latents the top k picks), and the fold is a
rescale of the weights whose cost is nil next to the batch.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tests"))
from saedashboard_features import load_model, neuronpedia_layout, vocab_dict  # noqa: E402
from sae_dashboard.neuronpedia.neuronpedia_converter import NeuronpediaConverter  # noqa: E402
from sae_dashboard.neuronpedia.neuronpedia_runner_config import NeuronpediaRunnerConfig  # noqa: E402
from sae_dashboard.sae_vis_data import SaeVisConfig  # noqa: E402
from sae_dashboard.sae_vis_runner import SaeVisRunner  # noqa: E402
from sae_lens import SAE  # noqa: E402


def main() -> None:
    model_dir, sae_dir, tokens_path, ignore, first, count, out = sys.argv[1:8]
    started = time.perf_counter()
    model = load_model(model_dir)
    sae = SAE.load_from_disk(sae_dir, device="cpu")
    if sae.cfg.architecture() == "topk" and not getattr(sae.cfg, "rescale_acts_by_decoder_norm", False):
        sae.fold_W_dec_norm = lambda: None  # type: ignore[method-assign]
    tokens = torch.from_numpy(np.load(tokens_path)).long()
    features = list(range(int(first), int(first) + int(count)))
    loaded = time.perf_counter()
    layout = neuronpedia_layout()
    cfg = SaeVisConfig(hook_point=sae.cfg.metadata.hook_name, features=features, minibatch_size_features=len(features),
                       minibatch_size_tokens=32, feature_centric_layout=layout, perform_ablation_experiments=False,
                       dtype="float32", device="cpu", ignore_tokens={int(i) for i in ignore.split(",") if i})
    data = SaeVisRunner(cfg).run(encoder=sae, model=model, tokens=tokens)
    hook = sae.cfg.metadata.hook_name
    np_cfg = NeuronpediaRunnerConfig(sae_set="bench", sae_path=sae_dir, outputs_dir=tempfile.mkdtemp(),
                                     n_prompts_total=int(tokens.shape[0]), n_tokens_in_prompt=int(tokens.shape[1]),
                                     model_id="bench", layer=int(hook.split(".")[1]))
    batch = NeuronpediaConverter.convert_to_np_json(model, data, np_cfg,
                                                    vocab_dict(str(Path(model_dir) / "tokenizer.json"), model.cfg.d_vocab))
    Path(out).write_text(batch)
    done = time.perf_counter()
    print(json.dumps({"load_s": loaded - started, "batch_s": done - loaded, "features": len(features)}))


if __name__ == "__main__":
    main()
