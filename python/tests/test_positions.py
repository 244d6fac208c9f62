"""`Dataset.rows` over `--positions` runs: one row per document (or turn) with its document,
equal to what the run storing every token holds, taken or averaged."""

import json
import random
from pathlib import Path

import numpy as np
import pytest

from conftest import HOOKS, REPO, extract

import siphon


@pytest.fixture(scope="module")
def every_token(runs: Path) -> Path:
    return extract(runs, "positions-all", dtype="f32", hooks=HOOKS[:2], extra=("--pack", "isolated"))


def by_document(ds: siphon.Dataset, hook: str) -> dict:
    """Each document's rows of `hook` in an every-token run, in position order."""
    x, table = ds.rows([hook])
    docs, positions = table.column("doc_index").to_numpy(), table.column("position").to_numpy()
    out: dict = {}
    for i in np.argsort(positions, kind="stable"):
        out.setdefault(int(docs[i]), []).append(x[hook][i])
    return out


def test_a_mean_row_is_its_documents_tokens_averaged(runs: Path, every_token: Path) -> None:
    run = extract(runs, "positions-mean", dtype="f32", hooks=HOOKS[:2],
                  extra=("--pack", "isolated", "--positions", "mean"))
    ds = siphon.open_dataset(run)
    assert ds.positions == "mean" and ds.has_pooled
    x, table = ds.rows()
    assert sorted(table.column_names) == ["count", "doc_index", "position", "position_first", "token_ids"]
    table = {name: table.column(name).to_numpy() for name in table.column_names}
    assert len(set(table["doc_index"].tolist())) == len(table["doc_index"]) > 20, "one row per document"
    every = siphon.open_dataset(every_token)
    for hook in HOOKS[:2]:
        rows = by_document(every, hook)
        for i, doc in enumerate(table["doc_index"].tolist()):
            want = np.mean(np.asarray(rows[doc], dtype=np.float64), axis=0)
            assert table["count"][i] == len(rows[doc]) and table["position_first"][i] == 1
            scale = max(1.0, float(np.abs(want).max()))
            assert np.abs(x[hook][i] - want).max() <= 1e-5 * scale, (hook, doc)


def test_last_rows_come_as_torch_with_their_documents(runs: Path, every_token: Path) -> None:
    torch = pytest.importorskip("torch")
    run = extract(runs, "positions-last", dtype="f32", hooks=HOOKS[:2],
                  extra=("--pack", "isolated", "--positions", "last"))
    ds = siphon.open_dataset(run)
    x, table = ds.rows(HOOKS[:1], output="torch")
    table = {name: table.column(name).to_numpy() for name in table.column_names}
    assert isinstance(x[HOOKS[0]], torch.Tensor) and x[HOOKS[0]].shape[0] == len(table["doc_index"])
    rows = by_document(siphon.open_dataset(every_token), HOOKS[0])
    for i, doc in enumerate(table["doc_index"].tolist()):
        assert table["position"][i] == len(rows[doc]), "the last kept token (BOS at 0)"
        np.testing.assert_allclose(x[HOOKS[0]][i].numpy(), rows[doc][-1], rtol=0, atol=1e-6)


def test_each_assistant_turn_gives_a_row(runs: Path) -> None:
    words = "the river ran cold under a grey sky and birds sang of rain".split()
    rng = random.Random(5)
    lines, turns = [], []
    for _ in range(16):
        messages = []
        for _ in range(rng.randint(1, 2)):
            for role in ("user", "assistant"):
                messages.append({"role": role, "content": rng.choice(words)})
        lines.append(json.dumps({"messages": messages}))
        turns.append(len(messages) // 2)
    corpus = runs / "turns.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    template = REPO / "fixtures/chat/templates/chatml-generation.jinja"
    run = extract(runs, "positions-turns", dtype="f32", hooks=HOOKS[:1], corpus=corpus, hosts=1, seq=256,
                  extra=("--json-field", "messages", "--chat-template", str(template), "--pad", "right",
                         "--roles", "assistant", "--positions", "last", "--allow-long-context"))
    _, table = siphon.open_dataset(run).rows()
    table = {name: table.column(name).to_numpy() for name in table.column_names}
    assert set(table["role"].tolist()) == {siphon.ROLES.index("assistant")}
    per_doc = {int(d): int((table["doc_index"] == d).sum()) for d in set(table["doc_index"].tolist())}
    assert per_doc == {i: n for i, n in enumerate(turns)}, "one row per assistant turn of each conversation"
    assert 2 in per_doc.values()
