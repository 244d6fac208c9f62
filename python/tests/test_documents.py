"""`--keep-columns`: each document's fields carried into the run, read back typed and joined to
its rows by `doc_index` — from a jsonl and a parquet corpus, after a kill -9 and resume too;
a missing column refused by name before any work."""

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

from conftest import HOOKS, extract, extract_command

import siphon

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

WORDS = "the river ran cold under a grey sky and birds sang of rain".split()
ROW_GROUP = 10


def records(n: int = 60) -> List[Dict[str, Any]]:
    """Short texts with an int, a float, a string and a sometimes-null column."""
    rng = random.Random(11)
    return [
        {"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))), "label": i % 3,
         "score": round(rng.random(), 6), "name": f"doc-{i}", "note": None if i % 4 == 0 else f"n{i}"}
        for i in range(n)
    ]


def jsonl_corpus(path: Path, rows: List[Dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def parquet_corpus(path: Path, rows: List[Dict[str, Any]]) -> Path:
    table = pa.table({k: pa.array([r[k] for r in rows], type=pa.string() if k == "note" else None) for k in rows[0]})
    pq.write_table(table, path, row_group_size=ROW_GROUP)
    return path


KEEP = ("--keep-columns", "label,score,name,note", "--pack", "isolated")


def check_documents(ds: siphon.Dataset, rows: List[Dict[str, Any]], record_of) -> None:
    docs = ds.documents()
    assert docs.column_names == ["doc_index", "label", "score", "name", "note"]
    assert docs.num_rows > 20
    for row in docs.to_pylist():
        want = rows[record_of(row["doc_index"])]
        assert {k: row[k] for k in ("label", "score", "name", "note")} == {k: want[k] for k in ("label", "score", "name", "note")}
    _, table = ds.rows(HOOKS[:1])
    assert set(table.column("doc_index").to_pylist()) == set(docs.column("doc_index").to_pylist())
    for row in table.select(["doc_index", "name"]).to_pylist():
        assert row["name"] == rows[record_of(row["doc_index"])]["name"]


def test_jsonl_and_parquet_columns_come_back_typed_with_their_rows(runs: Path) -> None:
    rows = records()
    run = extract(runs, "keep-jsonl", dtype="f32", hooks=HOOKS[:1], corpus=jsonl_corpus(runs / "keep.jsonl", rows),
                  extra=KEEP + ("--positions", "last"))
    ds = siphon.open_dataset(run)
    assert ds.kept_columns == [("label", "json"), ("score", "json"), ("name", "json"), ("note", "json")]
    check_documents(ds, rows, lambda d: d & 0xFFFFFFFF)

    run = extract(runs, "keep-parquet", dtype="f32", hooks=HOOKS[:1],
                  corpus=parquet_corpus(runs / "keep.parquet", rows), extra=KEEP)
    ds = siphon.open_dataset(run)
    assert ds.kept_columns == [("label", "int"), ("score", "float"), ("name", "string"), ("note", "string")]
    docs = ds.documents()
    assert docs.schema.field("label").type == pa.int64() and docs.schema.field("score").type == pa.float64()
    check_documents(ds, rows, lambda d: (d >> 32) * ROW_GROUP + (d & 0xFFFFFFFF))
    # Every token's row carries its document's label; a torch Dataset pairs them.
    torch = pytest.importorskip("torch")
    pairs = ds.labeled(HOOKS[0], "label")
    x, y = pairs[0]
    assert isinstance(x, torch.Tensor) and y in (0, 1, 2) and len(pairs) > len(docs)


def test_the_columns_survive_a_kill_and_resume(runs: Path) -> None:
    rows = records(120)
    corpus = jsonl_corpus(runs / "keep-killed.jsonl", rows)
    reference = extract(runs, "keep-reference", dtype="f32", hooks=HOOKS[:1], corpus=corpus, hosts=1, extra=KEEP)
    cmd, env = extract_command(runs, "keep-killed", dtype="f32", hooks=HOOKS[:1], corpus=corpus, hosts=1,
                               launch=False, extra=KEEP)
    child = subprocess.Popen(cmd, env=dict(env, SIPHON_TEST_SLOW_BATCH_MS="200"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        manifests = lambda: list((runs / "keep-killed").glob("*/manifest.jsonl"))  # noqa: E731
        deadline = time.time() + 120
        while time.time() < deadline and not any(m.read_text().count("\n") >= 2 for m in manifests()):
            time.sleep(0.05)
        assert child.poll() is None, "the run ended before it could be killed"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ds = siphon.open_dataset(runs / "keep-killed")
    check_documents(ds, rows, lambda d: d & 0xFFFFFFFF)
    assert ds.documents().equals(siphon.open_dataset(reference).documents())


def test_a_missing_column_is_refused_by_name(runs: Path) -> None:
    corpus = jsonl_corpus(runs / "keep-missing.jsonl", records(8))
    cmd, env = extract_command(runs, "keep-missing", hooks=HOOKS[:1], corpus=corpus, hosts=1, launch=False,
                               extra=("--keep-columns", "label,labl"))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "labl" in done.stderr, done.stderr[-2000:]
    assert not (runs / "keep-missing").exists() or not list((runs / "keep-missing").glob("*/*.safetensors"))
