"""The decoding pages' scripts (issue 60) on a tiny trained toy model: scripts/bench/constraints.py meets every
constraint it draws and writes its page; scripts/bench/alignments.py scores every decoder layer against the toy
corpus's gold alignments and names the best on valid."""

from __future__ import annotations

import json

from relmt.data import toy
from tests.scripts_import import load_script
from tests.test_scripts import run_script
from tests.test_translate import ckpt  # noqa: F401  (the module's trained toy checkpoint)


def test_constraints_drawn_from_the_reference_are_all_met(ckpt, tmp_path):  # noqa: F811
    data = tmp_path / "data"
    toy.write_text({"test": toy.generate(seed=7, n_train=0, n_valid=0, n_test=12, n_test_long=0)["test"]}, data)
    out, md = tmp_path / "c.json", tmp_path / "c.md"
    run_script("constraints.py", "--checkpoint", str(ckpt), "--data", str(data), "--src", "src", "--tgt", "tgt",
               "--repeats", "1", "--threads", "1", "--out", str(out), "--md", str(md))
    info = json.loads(out.read_text())
    assert info["constraints"] > 0 and info["constraints_met"] == info["constraints"]
    assert info["hypotheses_holding_all_by_search"] == info["sentences_constrained"]
    assert "Made by `python " in md.read_text() and "constrained ÷ unconstrained" in md.read_text()


def test_draw_constraints_takes_missing_reference_words_only():
    draw = load_script("constraints").draw_constraints
    refs, outs = ["ein Hund sieht die Katze .", "zwei Vögel"], ["ein Hund sieht .", "zwei Vögel"]
    picked = draw(refs, outs, seed=3)
    assert picked[1] == [] and 1 <= len(picked[0]) <= 2
    assert all(set(p.split()) <= {"die", "Katze"} for p in picked[0])
    assert picked == draw(refs, outs, seed=3)  # seeded


def test_alignments_score_every_decoder_layer(ckpt, tmp_path):  # noqa: F811
    out, md = tmp_path / "a.json", tmp_path / "a.md"
    run_script("alignments.py", "--checkpoint", str(ckpt), "--out", str(out), "--md", str(md))
    info = json.loads(out.read_text())
    assert [r["layer"] for r in info["rows"]] == list(range(len(info["rows"])))
    assert all(0 <= r["valid_aer"] <= 1 and 0 <= r["test_aer"] <= 1 for r in info["rows"])
    assert info["best_layer"] == min(info["rows"], key=lambda r: r["valid_aer"])["layer"]


def test_best_per_call_interleaves_the_rounds_and_counts_each_call():
    """relmt.bench.best_per_call (step_profile.py, cache_copies.py, small_rows_gemm.py, decode_gpu.py): every fn
    warmed up first, then the rounds interleaved fn by fn, and the seconds per call of each fn's fastest round."""
    from relmt.bench import best_per_call

    order = []
    best = best_per_call({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeats=3, calls=2,
                         warmup=4)
    assert order == ["a"] * 4 + ["b"] * 4 + ["a", "a", "b", "b"] * 3
    assert set(best) == {"a", "b"} and all(0 < s < 1 for s in best.values())

