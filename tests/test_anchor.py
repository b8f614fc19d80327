"""The published anchor's recipe (issue 30 §2): experiment=multi30k_wu2021 holds Wu et al. (2021)'s settings as
docs/results/reproduction/multi30k_anchor.md states them, and scripts/reproduce/wu2021_batches.py
 batches as fairseq does."""

import json
import re

import pytest

from relmt.config import LrSchedule, Norm, PosKind, compose
from tests.scripts_import import load_script

wb, ar = load_script("wu2021_batches"), load_script("anchor_report")


def test_the_experiment_is_wu_et_al_transformer_tiny():
    cfg = compose(["experiment=multi30k_wu2021"])
    m, d, t, dec = cfg.model, cfg.data, cfg.train, cfg.decode
    assert (m.encoder_layers, m.decoder_layers, m.d_model, m.d_ff, m.n_heads) == (4, 4, 128, 256, 4)
    assert (m.positions, m.norm, m.share_embeddings) == (PosKind.abs, Norm.post, True)
    assert (m.dropout, m.attention_dropout, m.activation_dropout) == (0.3, 0.0, 0.0)
    assert d.lowercase and d.vocab_size == 10000 and d.max_length_ratio == 0
    assert (t.lr_schedule, t.peak_lr, t.warmup_steps, t.max_steps) == (LrSchedule.inverse_sqrt, 0.005, 2000, 8000)
    assert (t.adam_betas, t.adam_eps, t.clip_norm, t.label_smoothing) == ([0.9, 0.98], 1e-8, 25.0, 0.1)
    # one "epoch" = 61 updates: validated (loss, patience 10), saved, and the last 10 averaged for the tests
    assert t.eval_every == t.save_every == 61 and (t.best_metric.value, t.patience, t.valid_bleu) == ("loss", 10, False)
    assert (t.keep_last, t.average_last, t.test_checkpoint.value) == (10, 10, "averaged")
    assert (dec.beam, dec.lenpen, dec.length_norm.value, dec.eos_candidates.value) == (5, 1.0, "power", "fairseq")


def test_fairseq_batches_cap_size_times_the_longest_and_cut_to_multiples_of_8():
    src, tgt = [3] * 20 + [10] * 5, [4] * 20 + [9] * 5
    batches = wb.fairseq_batches(src, tgt, max_tokens=40)
    assert sorted(i for b in batches for i in b) == list(range(25))
    for b in batches:
        assert len(b) * max(max(src[i], tgt[i]) for i in b) <= 40
    # 10 short ones fit (10 x 4); the cut keeps 8 and carries 2 into the next batch
    assert [len(b) for b in batches] == [8, 8, 4, 4, 1]


def test_the_anchor_page_scores_runs_in_wus_metric_and_checks_the_metric(tmp_path):
    """scripts/reproduce/anchor_report.py: a kept run's lowercased tokenized BLEU (Wu et al.'s metric) and sacreBLEU -lc
    per test set, the goal on test2016; and relmt's preparation of raw references against their tokens."""
    refs, wu, run = tmp_path / "refs", tmp_path / "wu", tmp_path / "runs" / "wu2021_abs_s1"
    for d in (refs, wu, run / "translations"):
        d.mkdir(parents=True)
    lines = ["Ein Mann mit einem Hut, der etwas anstarrt.", "Zwei \"Hunde\" laufen."]
    for split, theirs in (("test", "test.2016"), ("test_2017_flickr", "test.2017"), ("test_2017_mscoco", "test.coco")):
        (refs / f"{split}.de").write_text("".join(f"{x}\n" for x in lines))
        (run / "translations" / f"{split}.de").write_text("ein mann mit einem hut, der etwas anstarrt.\nzwei hunde.\n")
        (wu / f"{theirs}.de").write_text("ein mann mit einem hut , der etwas an@@ st@@ arrt .\n"
                                          "zwei &quot; hunde &quot; laufen .\n")
    (run / "config.yaml").write_text("model:\n  positions: abs\n")
    (run / "metrics.json").write_text(json.dumps({"status": "completed", "steps": 8000, "wall_seconds": 7200,
                                                  "test": {"test": {"lowercased_bleu": 41.5}}}))
    seeds = tmp_path / "seeds"
    for name, score in {"t1_abs_s1": 38.0, "t1_abs_s2": 37.25, "t1_rel_s1": 39.0, "t1_both_s1": 50.0}.items():
        (seeds / name).mkdir(parents=True)
        (seeds / name / "metrics.json").write_text(json.dumps({"test": {"test": {"lowercased_bleu": score}}}))
    page = tmp_path / "anchor.md"
    page.write_text("# Anchor\n\n<!-- results -->old<!-- /results -->\n")
    ar.main(["--runs", str(tmp_path / "runs"), "--multi30k", str(refs), "--wu", str(wu), "--page", str(page),
             "--seeds", str(seeds)])
    text = page.read_text()
    assert "old" not in text and text.startswith("# Anchor\n\n<!-- results -->\n## Results")
    assert "| wu2021_abs_s1 | abs | 8000 | 2.00 | 41.50 | – | – |" in text and "| ≥ 41.00 | yes |" in text
    doc = json.loads(page.with_suffix(".json").read_text())
    assert doc["runs"][0]["test_sacrebleu_lc"] < 100 and doc["published"] == 41.02
    assert [round(c["bleu_raw_vs_theirs"], 2) for c in doc["metric_check"]] == [100.0] * 3
    # the interval is about the translations' own score (two lines: a wide one), and says whether 41.02 is in it
    own = ar.tokenized_bleu(["ein mann mit einem hut, der etwas anstarrt.", "zwei hunde."], lines, "de",
                            compound_split=False, lowercase=True)["score"]
    (lo, hi), inside = doc["runs"][0]["test_wu_interval"], doc["runs"][0]["published_inside_ci"]
    assert lo < own < hi and inside == (lo <= 41.02 <= hi)
    assert f"| wu2021_abs_s1 | 41.50 | {lo:.2f}–{hi:.2f} | {'yes' if inside else 'no'} |" in text
    # Table 1's seeds per kind (both is not an anchor kind): each seed and the range
    assert doc["seed_spread"] == [{"positions": "abs", "scores": [38.0, 37.25], "range": 0.75},
                                  {"positions": "rel", "scores": [39.0], "range": 0.0}]
    assert "| abs | 38.00, 37.25 | 0.75 |" in text
    assert "wu2021_abs_s1 is 0.48 above the published figure: within the 0.75 that relmt's abs recipe runs" in text


def test_the_anchor_page_gives_the_means_over_seeds_and_rel_against_abs_seed_by_seed(tmp_path):
    """Issue 46: the mean of each kind's seeds against its goal, and rel against abs with the paired bootstrap of
    the other reports, seed s against seed s in sacreBLEU -lc, with the verdict of "rel ≥ abs" and of its swap."""
    refs = tmp_path / "refs"
    refs.mkdir()
    good = [f"ein mann mit einem roten hut steht vor dem haus nummer {i} ." for i in range(60)]
    (refs / "test.de").write_text("".join(f"{x.capitalize()}\n" for x in good))
    bad = [" ".join(x.split()[:3]) + " ." for x in good]
    scores = {("abs", 1): 40.0, ("abs", 2): 41.0, ("rel", 1): 42.0, ("rel", 2): 43.0}
    for (kind, seed), score in scores.items():
        run = tmp_path / "runs" / f"wu2021_{kind}_s{seed}"
        (run / "translations").mkdir(parents=True)
        (run / "translations" / "test.de").write_text("".join(f"{x}\n" for x in (good if kind == "rel" else bad)))
        (run / "config.yaml").write_text(f"model:\n  positions: {kind}\n")
        (run / "metrics.json").write_text(json.dumps({"status": "completed", "steps": 10, "wall_seconds": 1,
                                                      "test": {"test": {"lowercased_bleu": score}}}))
    page = tmp_path / "anchor.md"
    page.write_text("# Anchor\n")
    ar.main(["--runs", str(tmp_path / "runs"), "--multi30k", str(refs), "--page", str(page),
             "--seeds", str(tmp_path / "none")])
    text, doc = page.read_text(), json.loads(page.with_suffix(".json").read_text())
    assert [(m["positions"], m["seeds"], m["mean_wu"], m["range_wu"], m["goal_met"]) for m in doc["means"]] == [
        ("abs", [1, 2], 40.5, 1.0, False), ("rel", [1, 2], 42.5, 1.0, True)]
    # the mean from metrics.json, its interval over sentences and seeds from the translations (rel's are the refs)
    assert re.search(r"\| abs \| 1, 2 \| 40\.50 \| \d+\.\d\d–\d+\.\d\d \| -0\.52 \|", text)
    assert "| rel | 1, 2 | 42.50 | 100.00–100.00 | +1.48 |" in text  # vs 41.02
    tested = doc["rel_against_abs"]
    assert [p["seed"] for p in tested["pairs"]] == [1, 2]
    assert all(p["system"] > 99.9 and p["low"] > 0 for p in [*tested["pairs"], tested["all_seeds"]])
    assert tested["all_seeds"]["seeds"] == [2, 2]
    assert tested["wu_metric"]["intervals"]["system"] == pytest.approx([100.0, 100.0])
    assert "which decides: **rel ≥ abs: held** (abs ≥ rel: did not hold)" in text
    assert "2 of 2 seed pairs significant" in text and "| all | " in text
