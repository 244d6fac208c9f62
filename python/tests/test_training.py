"""Training with SAELens 6.x itself (PyPI sae-lens) on siphon runs: its SAETrainer through
`data_provider`, its multi-hook trainer on dict batches, its own runner on the exported cache
(use_cached_activations=True), and a torch DataLoader of 2 workers × world_size 2."""

from __future__ import annotations

import json
from collections import Counter

import datasets
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import siphon
import siphon.torch
from conftest import D_MODEL
from siphon.saelens import export

sae_lens = pytest.importorskip("sae_lens")
from sae_lens import StandardTrainingSAE, StandardTrainingSAEConfig  # noqa: E402
from sae_lens.config import SAETrainerConfig  # noqa: E402
from sae_lens.training.sae_trainer import SAETrainer  # noqa: E402

HOOK = "blocks.0.hook_resid_post"


def trainer_config(batch: int, steps: int) -> SAETrainerConfig:
    return SAETrainerConfig(
        total_training_samples=batch * steps,
        train_batch_size_samples=batch,
        lr=1e-3,
        lr_end=1e-3,
        device="cpu",
        n_batches_for_norm_estimate=2,
    )


def new_sae(d_in: int = D_MODEL) -> StandardTrainingSAE:
    torch.manual_seed(0)
    return StandardTrainingSAE(StandardTrainingSAEConfig(d_in=d_in, d_sae=2 * d_in, l1_coefficient=1e-3))


def test_saelens_trainer_trains_from_data_provider(bf16_run):
    batch, steps = 256, 16
    sae = new_sae()
    w_before = sae.W_enc.detach().clone()
    provider = siphon.torch.data_provider(bf16_run, HOOK, batch_size=batch, seed=1)
    trainer = SAETrainer(trainer_config(batch, steps), sae, data_provider=provider)
    trained = trainer.fit()
    assert trainer.n_training_steps == steps
    assert trainer.n_training_samples == batch * steps
    assert not torch.equal(trained.W_enc.detach(), w_before)
    x = next(siphon.torch.data_provider(bf16_run, HOOK, batch_size=batch, seed=2))
    assert x.shape == (batch, D_MODEL) and x.dtype == torch.float32
    with torch.no_grad():
        before = torch.mean((new_sae()(x) - x) ** 2)
        after = torch.mean((trained(x) - x) ** 2)
    assert torch.isfinite(after) and after < before


def test_a_saelens_run_stopped_and_restored_ends_with_the_uninterrupted_weights(bf16_run, tmp_path):
    """SAETrainer for 2K steps, against one stopped after K steps (a preemption: the next batch
    never comes), restored from its checkpoint and siphon's state: the same SAE, bit for bit."""
    from safetensors.torch import load_file

    batch, k = 48, 7

    def provider():
        return siphon.torch.data_provider(bf16_run, HOOK, batch_size=batch, seed=5, num_workers=2,
                                          unit_tokens=100, shuffle_buffer_tokens=200)

    whole = SAETrainer(trainer_config(batch, 2 * k), new_sae(), data_provider=provider()).fit()

    class Preempted(Exception):
        pass

    first = provider()

    def stopping():
        for _ in range(k):
            yield next(first)
        raise Preempted  # before the next batch is taken from the provider

    trainer = SAETrainer(trainer_config(batch, 2 * k), new_sae(), data_provider=stopping())
    with pytest.raises(Preempted):
        trainer.fit()
    assert trainer.n_training_steps == k
    trainer.save_checkpoint("preempted", base_path=tmp_path)
    state = json.dumps(first.state_dict())

    sae = new_sae()
    sae.load_state_dict(load_file(str(tmp_path / "preempted" / "sae_weights.safetensors")))
    second = provider()
    second.load_state_dict(json.loads(state))
    restored = SAETrainer(trainer_config(batch, 2 * k), sae, data_provider=second)
    restored.load_trainer_state(tmp_path / "preempted")
    resumed = restored.fit()
    assert restored.n_training_steps == 2 * k
    for name, want in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], want), name


def test_saelens_multi_hook_trainer_takes_paired_dict_batches(bf16_run):
    """A transcoder-style pair (ln2.hook_normalized, hook_mlp_out) for the same tokens, through
    SAELens's MultiSAETrainer and its dict data provider."""
    from sae_lens.training.multi_sae_trainer import MultiSAETrainer

    hooks = {"in": "blocks.1.ln2.hook_normalized", "out": "blocks.1.hook_mlp_out"}
    batch, steps = 128, 4
    ds = siphon.torch.ActivationDataset(bf16_run, list(hooks.values()), batch_size=batch, dtype="float32", epochs=None, drop_last=True)
    provider = iter(DataLoader(ds, batch_size=None))
    trainer = MultiSAETrainer(
        trainer_config(batch, steps), {k: new_sae() for k in hooks}, hook_names=hooks, data_provider=provider
    )
    trainer.fit()
    assert trainer.n_training_steps == steps


def test_dataloader_two_workers_world_size_two_reads_every_token_once(bf16_run):
    full = siphon.open_dataset(bf16_run).read([HOOK])
    want = Counter(zip(full["token_ids"].tolist(), full["position"].tolist(), [r.tobytes() for r in full[HOOK]]))
    seen = Counter()
    for rank in range(2):
        ds = siphon.torch.ActivationDataset(bf16_run, [HOOK], batch_size=100, seed=4, rank=rank, world_size=2, unit_tokens=128)
        for epoch in range(2):
            ds.set_epoch(epoch)
            got = Counter()
            for b in DataLoader(ds, batch_size=None, num_workers=2):
                x = b[HOOK].view(torch.int16).numpy()
                got.update(zip(b["token_ids"].tolist(), b["position"].tolist(), [r.tobytes() for r in x]))
            if epoch == 0:
                seen.update(got)
            else:
                epoch_two = got
        assert epoch_two  # every epoch is read again
    assert seen == want
    assert sum(seen.values()) == siphon.open_dataset(bf16_run).tokens


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("world_size", [1, 2])
def test_epochs_reach_the_workers_persistent_or_not(bf16_run, workers, world_size, persistent):
    """Each epoch holds every token once over the ranks, in another order than the one before,
    with workers started per epoch or kept: through set_epoch on a plain DataLoader, and
    through batch_loader's own epochs."""
    full = siphon.open_dataset(bf16_run).read([HOOK])
    every = Counter(zip(full["token_ids"].tolist(), full["position"].tolist()))

    def epoch_of(loader):
        return [t for b in loader for t in zip(b["token_ids"].tolist(), b["position"].tolist())]

    def dataset(rank):
        return siphon.torch.ActivationDataset(bf16_run, [HOOK], batch_size=64, seed=2, unit_tokens=128,
                                              rank=rank, world_size=world_size)

    first, second = [], []
    for rank in range(world_size):
        ds = dataset(rank)
        plain = DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=persistent)
        one = epoch_of(plain)
        ds.set_epoch(1)
        two = epoch_of(plain)
        assert one != two  # (a rank's share of the tokens differs from epoch to epoch too)
        ds = dataset(rank)
        loader = siphon.torch.batch_loader(ds, num_workers=workers, persistent_workers=persistent)
        assert epoch_of(loader) == one and epoch_of(loader) == two and ds.epoch == 1
        first += one
        second += two
    assert Counter(first) == every and Counter(second) == every  # every token once per epoch


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("world_size", [1, 2])
def test_a_torch_state_after_n_batches_resumes_the_rest_bit_for_bit(bf16_run, workers, world_size, persistent):
    """Two epochs through batch_loader, interrupted after N batches (in either epoch): a new
    dataset restored from the JSON of state_dict() gives exactly the batches that came next."""
    rank = world_size - 1

    def dataset():
        return siphon.torch.ActivationDataset(bf16_run, [HOOK], batch_size=40, seed=3, rank=rank, world_size=world_size,
                                              unit_tokens=100, shuffle_buffer_tokens=200)

    def key(b):
        return (b["token_ids"].tolist(), b["position"].tolist(), b[HOOK].view(torch.int16).sum().item())

    ds = dataset()
    loader = siphon.torch.batch_loader(ds, num_workers=workers, persistent_workers=persistent)
    epochs = [[key(b) for b in loader] for _ in range(2)]
    whole = epochs[0] + epochs[1]
    for stop in [1, len(epochs[0]) // 2 + 1, len(epochs[0]) + 2]:
        ds = dataset()
        loader = siphon.torch.batch_loader(ds, num_workers=workers, persistent_workers=persistent)
        got, state = [], None
        for _ in range(2):
            for b in loader:
                got.append(key(b))
                if len(got) == stop:
                    state = json.loads(json.dumps(ds.state_dict()))
                    break
            if state is not None:
                break
        assert got == whole[:stop]
        resumed = dataset()
        resumed.load_state_dict(state)
        loader = siphon.torch.batch_loader(resumed, num_workers=workers, persistent_workers=persistent)
        rest = [key(b) for b in loader]
        if stop <= len(epochs[0]):
            rest += [key(b) for b in loader]
        assert rest == whole[stop:], f"stopped after {stop} of {len(whole)}"


def test_export_matches_and_saelens_runner_trains_from_it(f32_run, tmp_path):
    from sae_lens import LanguageModelSAERunnerConfig, LanguageModelSAETrainingRunner
    from sae_lens.config import LoggingConfig
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    ctx = 16
    summary = export(f32_run, tmp_path / "cache", hooks=[HOOK, "blocks.1.hook_mlp_out"], context_size=ctx, shuffle=False)
    assert summary.rows == siphon.open_dataset(f32_run).tokens // ctx
    cache = datasets.load_from_disk(str(tmp_path / "cache"))
    assert cache.features[HOOK] == datasets.Array2D(shape=(ctx, D_MODEL), dtype="float32")
    assert len(cache) == summary.rows
    stored = siphon.open_dataset(f32_run).read([HOOK])
    cache.set_format("numpy")
    np.testing.assert_array_equal(cache[0][HOOK], stored[HOOK][:ctx])
    np.testing.assert_array_equal(cache[1]["token_ids"], stored["token_ids"][ctx : 2 * ctx])

    # SAELens's own runner, reading the cache (the model is only a stand-in: with
    # use_cached_activations it never runs, and evals are off).
    model = HookedTransformer(HookedTransformerConfig(n_layers=2, d_model=D_MODEL, d_head=16, n_ctx=ctx, d_vocab=256, act_fn="silu", normalization_type="RMS"))
    batch, steps = 128, 6
    cfg = LanguageModelSAERunnerConfig(
        sae=StandardTrainingSAEConfig(d_in=D_MODEL, d_sae=2 * D_MODEL, l1_coefficient=1e-3),
        hook_name=HOOK,
        context_size=ctx,
        use_cached_activations=True,
        cached_activations_path=str(tmp_path / "cache"),
        training_tokens=batch * steps,
        train_batch_size_tokens=batch,
        store_batch_size_prompts=4,
        n_batches_in_buffer=16,  # SAELens mixes in n_batches_in_buffer * context_size tokens
        device="cpu",
        logger=LoggingConfig(log_to_wandb=False),
        n_batches_for_norm_estimate=2,
        output_path=str(tmp_path / "sae"),
        checkpoint_path=str(tmp_path / "ckpt"),
        streaming=False,
    )
    tokens = datasets.Dataset.from_dict({"tokens": [[1] * ctx] * 4})
    runner = LanguageModelSAETrainingRunner(cfg, override_dataset=tokens, override_model=model)
    w_before = runner.sae.W_enc.detach().clone()
    sae = runner.run()
    assert not torch.equal(sae.W_enc.detach(), w_before)
    assert runner.activations_store.cached_activation_dataset is not None
    assert (tmp_path / "sae").exists()


def test_siphon_export_saelens_command(f32_run, tmp_path):
    """`siphon export saelens` (the Rust binary) runs the same export through this Python."""
    import os
    import subprocess
    import sys

    from conftest import siphon_binary

    env = dict(os.environ, SIPHON_PYTHON=sys.executable, PYTHONPATH=os.pathsep.join(sys.path))
    out = tmp_path / "cli-cache"
    done = subprocess.run(
        [siphon_binary(), "export", "saelens", str(f32_run), str(out), "--hooks", HOOK, "--context-size", "32", "--dtype", "float16"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    cache = datasets.load_from_disk(str(out))
    assert cache.features[HOOK] == datasets.Array2D(shape=(32, D_MODEL), dtype="float16")
    assert len(cache) == siphon.open_dataset(f32_run).tokens // 32
    bad = subprocess.run([siphon_binary(), "export", "saelens", str(f32_run), str(tmp_path / "x"), "--hooks", "nope"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "unknown hook 'nope'" in bad.stderr


def test_export_refuses_sizes_and_folders_before_any_work(f32_run, tmp_path):
    """A row longer than the run, a token budget shorter than a row, a folder in use and token
    ids that are not ids are refused naming the flag or the folder, before anything is read or
    written."""
    from siphon import DatasetError
    from siphon.__main__ import main

    tokens = siphon.open_dataset(f32_run).tokens
    for kw, message in (
        ({"context_size": tokens + 1}, rf"context_size \(--context-size\) must be at most {tokens} \(the {tokens} tokens"),
        ({"context_size": 0}, r"context_size \(--context-size\) must be at least 1, got 0"),
        ({"context_size": 16, "max_tokens": 15},
         r"max_tokens \(--max-tokens\) must be at least 16 \(one row of context_size\), got 15"),
    ):
        with pytest.raises(DatasetError, match=message):
            export(f32_run, tmp_path / "out", hooks=[HOOK], **kw)
    assert not (tmp_path / "out").exists()
    used = tmp_path / "used"
    used.mkdir()
    (used / "mine.txt").write_text("mine")
    with pytest.raises(DatasetError, match=r"used: not empty \(the dataset's files go into a new or empty folder\)"):
        export(f32_run, used, hooks=[HOOK], context_size=16)
    assert [p.name for p in used.iterdir()] == ["mine.txt"]
    with pytest.raises(SystemExit) as exited:
        main(["export-saelens", str(f32_run), str(tmp_path / "out"), "--exclude-token-ids", "1,x"])
    assert exited.value.code == 2 and not (tmp_path / "out").exists()
