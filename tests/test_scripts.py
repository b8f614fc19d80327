"""The benchmark and report scripts run (tiny settings; their figures are not checked here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True,
                          text=True, check=True, cwd=ROOT)


def test_bench_attention_runs(tmp_path):
    out, md = tmp_path / "a.json", tmp_path / "a.md"
    run_script("bench_attention.py", "--lengths", "8", "16", "--tokens", "64", "--d-model", "32",
               "--heads", "2", "--k", "2", "--repeats", "1", "--min-seconds", "0", "--out", str(out),
               "--md", str(md))
    rows = json.loads(out.read_text())["rows"]
    assert [r["n"] for r in rows] == [8, 16]
    for r in rows:
        assert r["abs_ms"] > 0 and r["rel_ms"] > 0 and r["naive_ms"] > 0
        assert r["rel_mb"] > 0 and r["naive_mb"] > 0
    assert "| n | batch |" in md.read_text()


def test_bench_prepare_runs(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = "alpha beta gamma delta epsilon zeta eta theta".split()
    for split, n in (("train", 40), ("valid", 5), ("test", 5)):
        for lang, shift in (("en", 0), ("de", 3)):
            lines = [" ".join(words[(i + shift + j) % 8] for j in range(1 + i % 5)) for i in range(n)]
            (corpus / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
    out, md = tmp_path / "d.json", tmp_path / "d.md"
    run_script("bench_prepare.py", "--dir", str(corpus), "--vocab-size", "30", "--num-proc", "1",
               "--spm-corpus", str(corpus), "--out", str(out), "--md", str(md))
    payload = json.loads(out.read_text())
    (row,) = payload["rows"]
    assert row["pairs"] == 50 and row["scratch_s"] > 0 and row["cached_s"] > 0
    assert payload["spm_32k"]["sentences"] == 80
    assert "cached rerun" in md.read_text()


def test_bench_decode_runs(tmp_path):
    out = tmp_path / "d.json"
    run_script("bench_decode.py", "--n", "6", "--repeats", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32",
               "--layers", "1", "--forced-length", "5", "--per-step", "--cache-dir", str(tmp_path / "cache"),
               "--out", str(out))
    payload = json.loads(out.read_text())
    assert {r["positions"] for r in payload["rows"]} == {"abs", "rel"}
    assert all(r["avg_output_tokens"] == 5 for r in payload["rows"])
    assert len(payload["per_step_seconds"]["forced/rel"]) == 5
