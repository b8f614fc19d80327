"""Fabricated relmt-train run directories for the relmt-report tests: Multi30k-like runs with
translations, references, learning curves and length buckets whose outcomes are known by design."""

from __future__ import annotations

import json
import random
from pathlib import Path

import yaml
from sacrebleu.metrics import BLEU, CHRF

from relmt.evaluate.metrics import lowercased_bleu, tokenized_bleu

SPLITS = ("test", "test_2017_flickr", "test_2017_mscoco")
WORDS = ("ein", "Mann", "eine", "Frau", "Hund", "läuft", "auf", "der", "Straße", "mit", "einem", "roten", "Ball",
         "Kinder", "spielen", "im", "Park", "zwei", "sitzen", "Bank", "vor", "Haus", "blauen", "Hemd", "trägt")
BUCKETS = ("1-10", "11-20", "21-30", "31+")
SENTENCES = 40  # per split: enough for the paired bootstrap to separate a corrupted system from a perfect one


def sentences(seed: int, n: int = SENTENCES, lo: int = 4, hi: int = 28) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) + " ." for _ in range(n)]


def write_refs(folder: Path, splits: tuple[str, ...] = SPLITS) -> dict[str, list[str]]:
    """{split}.de references and {split}.en sources (as many words as the reference) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    refs = {}
    for i, split in enumerate(splits):
        refs[split] = sentences(100 + i)
        (folder / f"{split}.de").write_text("".join(f"{r}\n" for r in refs[split]), encoding="utf-8")
        sources = [" ".join("word" for _ in r.split()[:-1]) + " ." for r in refs[split]]
        (folder / f"{split}.en").write_text("".join(f"{s}\n" for s in sources), encoding="utf-8")
    return refs


def corrupt(sentence: str) -> str:
    """Every other word replaced, the same way for every system, so that shared errors cancel out."""
    return " ".join("falsch" if i % 2 else w for i, w in enumerate(sentence.split()))


def hypotheses(split: str, positions: str, seed: int, refs: list[str]) -> list[str]:
    """The designed outcomes, seed s of each system:
    - test: abs corrupts every sentence but sentence s; rel and both equal the references;
    - test_2017_flickr: abs corrupts sentences s and s + 10, rel sentence s, both none: one sentence
      apart each time, a difference too small to be significant;
    - test_2017_mscoco: rel corrupts every sentence but sentence s; abs and both equal the references."""
    everything_but_seed = set(range(len(refs))) - {seed}
    bad = {"test": {"abs": everything_but_seed},
           "test_2017_flickr": {"abs": {seed, seed + 10}, "rel": {seed}},
           "test_2017_mscoco": {"rel": everything_but_seed}}[split].get(positions, set())
    return [corrupt(r) if i in bad else r for i, r in enumerate(refs)]


def scores(hyps: list[str], refs: list[str]) -> dict:
    """A metrics.json test entry computed from the texts, as relmt/train/validate.py writes it."""
    tok, lc = tokenized_bleu(hyps, refs, "de"), lowercased_bleu(hyps, refs, "de")
    return {"bleu": BLEU().corpus_score(hyps, [refs]).score, "signature": "nrefs:1|case:mixed|tok:13a",
            "chrf": CHRF().corpus_score(hyps, [refs]).score, "tokenized_bleu": tok["score"],
            "tokenized_label": tok["label"], "lowercased_bleu": lc["score"], "lowercased_label": lc["label"],
            "sentences": len(hyps)}


def config(seed: int, positions: str, k: int = 16, keys: bool = True, values: bool = True, data: str = "multi30k_text",
           model: str | None = "mmt_tiny", **data_extra) -> dict:
    splits = {"train": "train", "valid": "valid", **{s: s for s in SPLITS}}
    cfg = {"seed": seed, "data": {"name": data, "source": "text", "src": "en", "tgt": "de", "splits": splits,
                                  **data_extra},
           "decode": {"beam": 4, "lenpen": 0.6}, "train": {"test_checkpoint": "last", "num_threads": 1},
           "model": {"d_model": 128, "positions": positions, "max_relative_position": k, "relative_keys": keys,
                     "relative_values": values}}
    if model is not None:
        cfg["model"]["name"] = model
    return cfg


def write_run(run: Path, cfg: dict, test: dict, valid: dict | None = None, buckets: list | None = None,
              curve: list[tuple[int, float]] | None = None, translations: dict[str, list[str]] | None = None) -> Path:
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True))
    metrics = {"status": "completed", "steps": 3000, "wall_seconds": 7200.0, "final_valid": valid or {},
               "test": test, "test_checkpoint": str(run / "checkpoints" / "last.pt"), "test_checkpoint_rule": "last"}
    if buckets is not None:
        metrics["by_source_length"] = {"splits": list(test), "buckets": [
            {"bucket": b, "sentences": n, "bleu": v} for b, n, v in buckets]}
    (run / "metrics.json").write_text(json.dumps(metrics))
    lines = [{"step": 100, "tag": "train", "loss": 5.0}]
    lines += [{"step": step, "tag": "valid", "loss": 2.0, "bleu": bleu} for step, bleu in curve or []]
    # a line cut short by a kill, as metrics.jsonl can end
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 35')
    for split, hyps in (translations or {}).items():
        (run / "translations").mkdir(exist_ok=True)
        (run / "translations" / f"{split}.de").write_text("".join(f"{h}\n" for h in hyps), encoding="utf-8")
    return run


VALID = {"abs": 30.0, "rel": 32.0, "both": 33.0}  # valid sacreBLEU before the seed's offset
LENGTH = {"abs": (60.0, 50.0, 30.0), "rel": (62.0, 55.0, 40.0), "both": (61.0, 54.0, 39.0)}  # first 3 buckets
CURVE_OFFSET = {"abs": 0.0, "rel": 2.0, "both": 3.0}  # valid BLEU = step / 100 + offset + seed


def fabricate_multi30k(root: Path, refs: dict[str, list[str]], seeds: tuple[int, ...] = (1, 2, 3)) -> None:
    """Table 1 (abs, rel, both; 3 seeds, with translations), Table 2 (k in 0, 1, 2, 4, 64, one seed; the
    k = 16 row is Table 1's rel) and Table 3 ((on, off), (off, on), one seed; (off, off) is k = 0)."""
    for positions in ("abs", "rel", "both"):
        for seed in seeds:
            hyps = {s: hypotheses(s, positions, seed, refs[s]) for s in SPLITS}
            valid = {"bleu": VALID[positions] + seed, "chrf": 50.0 + seed, "lowercased_bleu": VALID[positions] + 1}
            b = LENGTH[positions]
            write_run(root / "positions" / f"{positions}_s{seed}", config(seed, positions),
                      {s: scores(hyps[s], refs[s]) for s in SPLITS}, valid,
                      [(label, 40, v + seed) for label, v in zip(BUCKETS, b)] + [("31+", 0, None)],
                      [(step, step / 100 + CURVE_OFFSET[positions] + seed) for step in range(500, 3001, 500)], hyps)
    # rel on test is 100 (it equals the references): the sweep saturates close to it, and k = 0 collapses.
    # Translations of test, seed 1: k = 0 and a^V alone corrupt every sentence, k = 1 every fourth, the
    # others equal the references (the same as rel seed 1: a difference of exactly 0).
    ablations = {"k": {k: (bleu, every) for k, bleu, every in ((0, 10.0, 1), (1, 90.0, 4), (2, 99.5, 0), (4, 99.8, 0),
                                                                (64, 99.0, 0))},
                 "kv": {(True, False): (99.6, 0), (False, True): (98.9, 1)}}
    for table, rows in ablations.items():
        for value, (bleu, every) in rows.items():
            flags = {"k": value} if table == "k" else {"keys": value[0], "values": value[1]}
            hyps = [corrupt(r) if every and i % every == 0 else r for i, r in enumerate(refs["test"])]
            name = f"k{value}" if table == "k" else f"{value[0]}_{value[1]}"
            write_run(root / table / name, config(1, "rel", **flags), {s: {"bleu": bleu} for s in SPLITS},
                      {"bleu": bleu - 5}, translations={"test": hyps})


LENGTH_BUCKETS = ("1-10", "11-20", "21-30", "31+")
# BLEU per bucket before the seed's offset: rel loses less than abs beyond the training cutoff (15 words)
LENGTH_DESIGN = {"abs": (60.0, 50.0, 20.0), "rel": (61.0, 52.0, 30.0), "both": (61.0, 51.0, 29.0)}


def fabricate_length(root: Path, refs: dict[str, list[str]], data: str = "multi30k_len15",
                     seeds: tuple[int, ...] = (1, 2), **data_extra) -> None:
    """abs, rel and both trained on a length-filtered corpus, tested on `test` only: rel equals the
    references, abs corrupts every sentence but the seed's, both corrupts sentence seed + 1."""
    for positions, values in LENGTH_DESIGN.items():
        for seed in seeds:
            hyps = {"test": hypotheses("test", positions, seed, refs["test"])}
            if positions == "both":
                hyps["test"][seed + 1] = corrupt(refs["test"][seed + 1])
            cfg = config(seed, positions, data=data, **data_extra)
            cfg["data"]["splits"] = {"train": "train", "valid": "valid", "test": "test"}
            write_run(root / f"{positions}_s{seed}", cfg, {"test": scores(hyps["test"], refs["test"])},
                      {"bleu": 30.0}, [(b, 10, v + seed) for b, v in zip(LENGTH_BUCKETS, values)] + [("31+", 0, None)],
                      translations=hyps)
