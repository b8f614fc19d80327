#!/usr/bin/env python
"""docs/results/reproduction/quality_peers.md: relmt against OpenNMT-py 3.5.1 on Multi30k at equal budget (issue 30 §1),
from the kept runs: relmt's recipe runs (docs/results/reproduction/multi30k/runs/t1_{abs,rel}_s*) and OpenNMT-py's
(docs/results/reproduction/quality_peers/runs/onmt_{abs,rel}_s*, scripts/peers/quality_peers.sh).
Scores are relmt-score's on both systems' detokenized outputs; each claim "relmt ≥ OpenNMT-py" is tested over all
seeds at once (and seed against seed beside it) and judged by relmt.report.verdicts.

    python scripts/peers/quality_peers_report.py [--refs ../shared/data/multi30k]
    # --refs: the default is this project's machines
"""

import argparse
import json
import sys
from pathlib import Path

from relmt.host import host
from relmt.report.aggregate import DASH, PAIR_HEADER, aggregate, fmt, md_table, pair_cells
from relmt.report.claims import judged
from relmt.report.markdown import md_claim
from relmt.report.runs import load_run
from relmt.report.significance import Comparison, lines, test_pairs
from relmt.report.verdicts import AHEAD, RULES

ROOT = Path(__file__).resolve().parents[2]
SPLITS = ("test", "test_2017_flickr", "test_2017_mscoco")
METRICS = (("bleu", "sacreBLEU", "sacrebleu"), ("chrf", "chrF", "chrf"), ("lowercased_bleu", "lc-tok BLEU",
                                                                           "lowercased_bleu"))
SETTINGS = [  # (setting, relmt, OpenNMT-py): what scripts/peers/quality_peers.py sets, and what it could not match
    ("data, vocabulary", "Multi30k raw text, sentencepiece 8,000 (relmt-prepare)", "the same pieces, pre-encoded"),
    ("model", "mmt_tiny: 4+4 layers, d 128, FFN 256, 4 heads, pre-norm, all embeddings shared",
     "the same (OpenNMT-py's transformer is pre-norm)"),
    ("attention biases", "q, v and output; no key bias (softmax cancels it)", "q, k, v and output (add_qkvbias)"),
    ("relative positions (rel)", "separate a^K and a^V tables per head and layer, k = 16",
     "one table shared by keys and values, k = 16 (max_relative_positions)"),
    ("dropout, attention, activation", "0.1, 0.1, 0.1", "0.1, 0.1, 0.1 (the FFN's dropout)"),
    ("schedule", "inverse_sqrt, peak 0.005 at 1,000", "Noam, constant 1.789: the same curve"),
    ("optimizer, smoothing, clipping", "Adam (0.9, 0.98), 0.1, none", "the same"),
    ("batch", "6,144 padded tokens", "3,150 tokens (OpenNMT-py's count): target tokens per update below"),
    ("updates, checkpoint", "3,000, the last", "3,000, the last"),
    ("decoding", "beam 4, GNMT α 0.6, at most |x| + 50 tokens", "beam 4, GNMT α 0.6, at most 250 tokens"),
    ("threads", "1 per run, two runs side by side", "1 per run, two runs side by side"),
]


class Peer:
    """An OpenNMT-py run kept by scripts/peers/quality_peers.sh, with what the tests need of a relmt Run."""

    def __init__(self, path: Path) -> None:
        self.path, m = path, json.loads((path / "metrics.json").read_text())
        self.seed, self.positions, self.metrics, self.tgt = m["seed"], m["positions"], m, "de"

    def score(self, split: str, metric: str) -> float | None:
        key = dict((a, c) for a, _, c in METRICS)[metric]
        return self.metrics["test"].get(split, {}).get(key, {}).get("score")

    def translations(self, split: str) -> Path:
        return self.path / "translations" / f"{split}.de"


def texts(refs: Path, split: str):
    def read(run) -> tuple[list[str], list[str]]:
        return list(lines(run.translations(split))), list(lines(refs / f"{split}.de"))
    return read


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--relmt", type=Path, default=ROOT / "docs/results/reproduction/multi30k/runs")
    parser.add_argument("--peers", type=Path, default=ROOT / "docs/results/reproduction/quality_peers/runs")
    parser.add_argument("--refs", type=Path, default=ROOT / "../shared/data/multi30k")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/results/reproduction/quality_peers")
    parser.add_argument("--bootstrap-samples", type=int, default=1000)
    opts = parser.parse_args(argv)
    parts, claims, doc, goals = [], [], {"runs": {}, "claims": []}, []
    for positions in ("abs", "rel"):
        relmt = {r.seed: r for r in (load_run(p) for p in sorted(opts.relmt.glob(f"t1_{positions}_s*")))}
        peer = {r.seed: r for r in (Peer(p) for p in sorted(opts.peers.glob(f"onmt_{positions}_s*"))
                                    if (p / "metrics.json").is_file())}
        rows = [[f"{name} {positions}", ", ".join(map(str, sorted(runs))) or DASH,
                 *(fmt(aggregate(r.score(s, metric) for r in runs.values())) for metric, _, _ in METRICS
                   for s in SPLITS)] for name, runs in (("relmt", relmt), ("OpenNMT-py", peer))]
        header = ["system", "seeds", *(f"{s} {label}" for _, label, _ in METRICS for s in SPLITS)]
        parts.append(f"### {positions}\n\nmean ± std (n seeds).\n\n" + md_table(header, rows))
        tested = []
        for split in SPLITS:
            c = test_pairs(Comparison(f"OpenNMT-py {positions}", f"relmt {positions}", split), peer, relmt,
                           texts(opts.refs, split), opts.bootstrap_samples)
            tested.append(c)
            means = {f"relmt {positions}": aggregate(r.score(split, "bleu") for r in relmt.values()),
                     f"OpenNMT-py {positions}": aggregate(r.score(split, "bleu") for r in peer.values())}
            if all(means.values()):  # issue 30's goal: relmt's mean >= OpenNMT-py's, no pair with it ahead
                ours, theirs = (v.mean for v in means.values())
                behind = c.significant(-1)
                goals.append([positions, split, f"{ours:.2f}", f"{theirs:.2f}", f"{len(c.tests)}", f"{behind}",
                              "yes" if ours >= theirs and not behind else "no"])
            if all(means.values()):
                claims.append(judged(f"relmt {positions} ≥ OpenNMT-py {positions}", "quality beside a peer", split,
                                     {k: v.mean for k, v in means.items()},
                                     f"relmt − OpenNMT-py on {split} above 0 (sacreBLEU)", [(c, AHEAD)], None))
        detail = [[f"{c.system} vs {c.baseline}", c.split, *pair_cells(t)] for c in tested
                  for t in [c.overall, *c.tests] if t]
        parts.append("Paired tests (sacreBLEU): over all seeds at once (\"all (n + m)\", sentences and seeds "
                     "resampled, Clark et al. 2011; it decides the claims), then seed against seed (paired "
                     "bootstrap):\n\n"
                     + md_table(["comparison", "test set", *PAIR_HEADER], detail))
        for name, runs in (("relmt", relmt), ("onmt", peer)):
            for seed, r in runs.items():
                m = json.loads((r.path / "metrics.json").read_text())
                tokens = m.get("tgt_tokens") or m["tokens_per_s"] * m["train_seconds"] / m["steps"]
                doc["runs"][f"{name}_{positions}_s{seed}"] = {
                    "train_minutes": m["train_seconds"] / 60, "tgt_tokens_per_update": tokens,
                    "tgt_tokens_per_s": tokens * m["steps"] / m["train_seconds"]}
    runs = md_table(["run", "training minutes", "target tokens per update", "target tokens/s"],
                    [[k, f"{v['train_minutes']:.0f}", f"{v['tgt_tokens_per_update']:.0f}",
                      f"{v['tgt_tokens_per_s']:.0f}"] for k, v in doc["runs"].items()])
    hw, n = host(), sum(k.startswith("onmt") for k in doc["runs"])
    text = "\n\n".join([
        "# relmt against OpenNMT-py 3.5.1 on Multi30k EN→DE at equal budget"
        + ("" if n == 6 else f" (in progress: {n} of 6 OpenNMT-py runs)"),
        f"Made by `python scripts/peers/quality_peers_report.py` on {hw['date']} ({hw['cpu']}, "
        f"{hw['cpu_count']} cores, "
        f"torch {hw['torch']}, git {hw['git']}) from the runs of `scripts/reproduce/run_queue.sh "
        "scripts/reproduce/queues/multi30k_tables.txt` (relmt) and `scripts/peers/quality_peers.sh` (OpenNMT-py).",
        "## Settings side by side", md_table(["setting", "relmt", "OpenNMT-py 3.5.1"], [list(s) for s in SETTINGS]),
        "## Scores", *parts,
        "## Goal (issue 30)\n\nrelmt's mean sacreBLEU over its seeds at least OpenNMT-py's, and no seed pair where "
        "OpenNMT-py is significantly ahead (paired bootstrap, p < 0.05).",
        md_table(["positions", "test set", "relmt mean", "OpenNMT-py mean", "seed pairs",
                  "pairs with OpenNMT-py significantly ahead", "met"], goals),
        "## Runs", runs, "## Claims", RULES, "\n".join(md_claim(c) for c in claims)]) + "\n"
    opts.out.with_suffix(".md").write_text(text)
    doc["claims"] = [vars(c) for c in claims]
    doc["goal"] = [dict(zip(("positions", "split", "relmt_mean", "onmt_mean", "pairs", "onmt_ahead", "met"), g))
                   for g in goals]
    opts.out.with_suffix(".json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
