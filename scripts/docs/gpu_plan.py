"""docs/snippets/gpu_plan.md: what the paper's WMT14 EN-DE runs need on GPUs (wall time, GPU memory, disk),
computed, not measured, from the one measurement there is and from the configs.

The measurement is docs/results/gpu/gpu_issue43.json: relmt's training step on one H200 in bf16, each size and
position mode, on batches of at most 81,858 padded tokens of real en-de text (scripts/bench/bench_train.py).
The runs are configs/experiment/table1_{base,big}_ende.yaml, composed as relmt-train composes them. Each figure
is one of these, and the snippet says which:

- time per update = the measured step time x (the update's padded tokens / the measured step's), assuming
  time grows linearly with padded tokens; N GPUs take 1/N of it (linear scaling: the best case);
- GPU memory = 16 bytes per parameter (fp32 weights, gradients and Adam's two moments), plus 4 more for DDP's
  gradient buckets, plus the rest of the measured peak scaled to the micro-batch;
- disk = a relmt-prepare cache entry of the WMT-like text, measured (WMT_LIKE_CACHE, `--measure-cache`) and
  scaled by pairs to WMT14 EN-DE, plus checkpoints of parameters x 12 bytes (fp32 weights and Adam's moments).

tests/test_gpu_plan.py regenerates the snippet in memory and fails when the committed one differs.

    python scripts/docs/gpu_plan.py                        # writes docs/snippets/gpu_plan.md
    python scripts/docs/gpu_plan.py --measure-cache DIR    # a prepared cache entry's bytes, for WMT_LIKE_CACHE
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MEASURED = ROOT / "docs/results/gpu/gpu_issue43.json"
SNIPPET = ROOT / "docs/snippets/gpu_plan.md"
EXPERIMENTS = {"base": "table1_base_ende", "big": "table1_big_ende"}
POSITIONS = ("abs", "rel", "both")  # Table 1's columns, and the modes measured
GPUS = 8  # the paper's (Shaw et al. §4.1: 8 K40 for base, 8 P100 for big)
PAPER_TARGET_TOKENS = 25_000  # per update (Shaw et al. §4.1; the comment of configs/train/wmt_base.yaml)
WMT14_EN_DE_PAIRS = 4_508_785  # wmt/wmt14 de-en train, the Hugging Face dataset card (scripts/bench/bench_prepare.py)
# `--measure-cache` on the relmt-prepare cache entry of the WMT-like text that gpu_issue43.json trained on
# (../shared/data europarl20k_ende/train + wmt14_ende/test, 23,003 pairs, 22,965 kept; vocab_size=32768, bpe),
# 2026-11-27. train_bytes is the train split's share (ids/train.* and encoded/train/); text_bytes the raw
# UTF-8 text of the pairs read (both sides, newlines included).
WMT_LIKE_CACHE = {"pairs": 22965, "train_bytes": 13196531, "fixed_bytes": 586982, "vocab_size": 32768,
                  "pairs_read": 23003, "text_bytes": 7303251}
STATE_BYTES = 16  # per parameter during training: fp32 weights, gradients, Adam's exp_avg and exp_avg_sq
DDP_BYTES = 4  # per parameter: DDP's gradient buckets (gradient_as_bucket_view off, torch's default)
CHECKPOINT_BYTES = 12  # per parameter in a step checkpoint: fp32 weights and Adam's two moments
GiB, GB = 2 ** 30, 1e9


def batch_rule(gpus: int, update_freq: int, padded_tokens: int) -> tuple[int, int]:
    """(train.update_freq, train.max_padded_tokens) on `gpus` GPUs that keep an update at `padded_tokens`
    when one GPU takes `update_freq` micro-batches: docs/training.md's shell arithmetic (Multi-GPU)."""
    freq = math.ceil(update_freq / gpus)
    return freq, padded_tokens // (gpus * freq) // 8 * 8


def measure_cache(entry: Path) -> dict:
    """The bytes of a relmt-prepare cache entry (data/cache/NAME-KEY): its train split, and what does not grow
    with the corpus (spm.model), with the pairs kept (meta.json)."""
    meta = json.loads((entry / "meta.json").read_text())
    train = [*entry.glob("ids/train.*"), *(entry / "encoded/train").glob("*")]
    return {"pairs": meta["splits"]["train"]["kept"], "train_bytes": sum(p.stat().st_size for p in train),
            "fixed_bytes": (entry / "spm.model").stat().st_size}


def plans() -> list[dict]:
    """One row per size and position mode: the composed experiment, its parameters and the measured row."""
    import torch

    from relmt.config import compose
    from relmt.data.tokenizer import PAD_ID
    from relmt.model.transformer import build_model

    measured = json.loads(MEASURED.read_text())
    rows = []
    for size, experiment in EXPERIMENTS.items():
        for positions in POSITIONS:
            cfg = compose([f"experiment={experiment}", f"model.positions={positions}"])
            with torch.device("meta"):  # shapes only: nothing is allocated
                model = build_model(cfg.model, cfg.data.vocab_size, PAD_ID)
            row = next(r for r in measured["train"]
                       if r["system"] == "relmt" and r["size"] == size and r["positions"] == positions)
            rows.append({"size": size, "positions": positions, "experiment": experiment, "train": cfg.train,
                         "vocab": cfg.data.vocab_size, "params": sum(p.numel() for p in model.parameters()),
                         "measured": row})
    return rows


def figures(plan: dict) -> dict:
    t, m = plan["train"], plan["measured"]
    update = t.max_padded_tokens * t.update_freq  # padded tokens per update on one GPU (49,152)
    step_s = m["step_ms"] / 1e3
    update_s = step_s * update / m["max_padded_tokens"]
    one = update_s * t.max_steps / 3600

    def memory(gpus: int) -> float:
        micro = batch_rule(gpus, t.update_freq, update)[1]
        fixed = plan["params"] * STATE_BYTES
        scaled = (m["peak_mib"] * 2 ** 20 - fixed) * micro / m["max_padded_tokens"]
        return (fixed + (plan["params"] * DDP_BYTES if gpus > 1 else 0) + scaled) / GiB

    return {"update": update, "update_s": update_s, "hours_1": one, "hours_n": one / GPUS,
            "paper_hours_1": PAPER_TARGET_TOKENS * t.max_steps / m["tgt_tokens_per_s"] / 3600,
            "tgt_per_step": m["tgt_tokens_per_s"] * step_s,
            "src_per_step": (m["src_tgt_tokens_per_s"] - m["tgt_tokens_per_s"]) * step_s,
            "peak_gib": m["peak_mib"] / 1024, "memory_1": memory(1), "memory_n": memory(GPUS)}


def checkpoints(plan: dict) -> tuple[float, int, float]:
    """(bytes of one step checkpoint, step checkpoints on disk at most, all checkpoint bytes): train.keep_last
    step files plus best.pt (a hard link to a step file, which outlives its pruning), plus averaged.pt
    (weights only) when train.average_last averages."""
    t = plan["train"]
    one = plan["params"] * CHECKPOINT_BYTES
    averaged = plan["params"] * 4 if t.average_last else 0
    return one, t.keep_last + 1, one * (t.keep_last + 1) + averaged


def snippet(rows: list[dict] | None = None) -> str:
    rows = plans() if rows is None else rows
    hw = json.loads(MEASURED.read_text())["hardware"]
    base = next(r for r in rows if r["size"] == "base" and r["positions"] == "rel")
    f, t = figures(base), base["train"]
    freq_n, micro_n = batch_rule(GPUS, t.update_freq, f["update"])
    micro_1 = batch_rule(1, t.update_freq, f["update"])[1]
    m = base["measured"]
    lines = [
        "Written by `python scripts/docs/gpu_plan.py`: **computed, not measured**. The inputs are "
        f"[gpu_issue43.json](results/gpu/gpu_issue43.md) (one {hw['gpu']}, bf16, torch {hw['torch']}, "
        f"{hw['date']}, git {hw['git']}: each mode's step on batches of at most {m['max_padded_tokens']:,} "
        "padded tokens of real en-de text) and the composed `experiment=table1_base_ende` and "
        "`table1_big_ende` configs.",
        "",
        f"| model | positions | updates | measured: ms per step ({m['max_padded_tokens']:,} padded tokens) "
        f"| measured: target tok/s | s per update ({f['update']:,} padded tokens) | hours, 1 GPU "
        f"| hours, {GPUS} GPUs | measured peak GiB ({m['max_padded_tokens']:,}) "
        f"| GiB per GPU, 1 GPU ({micro_1:,} per micro-batch) "
        f"| GiB per GPU, {GPUS} GPUs ({micro_n:,} per micro-batch) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        g = figures(r)
        lines.append(f"| {r['size']} | {r['positions']} | {r['train'].max_steps:,} | {r['measured']['step_ms']:.0f} "
                     f"| {r['measured']['tgt_tokens_per_s']:,.0f} | {g['update_s']:.3f} | {g['hours_1']:.1f} "
                     f"| {g['hours_n']:.2f} | {g['peak_gib']:.1f} | {g['memory_1']:.1f} | {g['memory_n']:.1f} |")
    lines += [
        "",
        f"- **Time** = the measured step time x {f['update']:,} / {m['max_padded_tokens']:,} (an update's padded "
        "tokens over the measured step's: time taken as linear in padded tokens) x the updates (`train.max_steps`), "
        f"then / {GPUS} for {GPUS} GPUs. That division assumes linear scaling, the best case: it leaves out DDP's "
        f"gradient all-reduce after every update. And the batch rule's micro-batches ({micro_1:,} padded tokens "
        f"on 1 GPU, {micro_n:,} at `train.update_freq={freq_n}` on {GPUS}) are {m['max_padded_tokens'] / micro_1:.0f}x "
        f"and {m['max_padded_tokens'] / micro_n:.0f}x smaller than the measured step, which a GPU runs less "
        "efficiently. So read the hours as a best case. Validation every "
        f"{t.eval_every:,} updates (BLEU on newstest2013, rank 0 alone), the final test decoding and "
        "`relmt-prepare` are not counted.",
        f"- The measured steps held {f['src_per_step']:,.0f} source and {f['tgt_per_step']:,.0f} target tokens "
        f"in {m['max_padded_tokens']:,} padded ones, so on that corpus an update of {f['update']:,} padded tokens "
        f"holds about {f['tgt_per_step'] * f['update'] / m['max_padded_tokens']:,.0f} target tokens, not the "
        f"paper's {PAPER_TARGET_TOKENS:,}; WMT14's padding has not been measured. Counting "
        f"{PAPER_TARGET_TOKENS:,} target tokens per update at the measured target tok/s instead gives "
        f"{f['paper_hours_1']:.1f} hours on 1 GPU for base rel ({f['paper_hours_1'] / f['hours_1']:.2f}x the table's).",
        f"- **GPU memory**: the measured peak is the allocator's at {m['max_padded_tokens']:,} padded tokens in one "
        f"step, so it bounds every micro-batch of the batch rule from above. The per-GPU columns are estimates: "
        f"{STATE_BYTES} bytes per parameter (fp32 weights, gradients, Adam's two moments), plus {DDP_BYTES} for "
        "DDP's gradient buckets on more than one GPU, plus the rest of the measured peak scaled linearly to the "
        "micro-batch. The CUDA context comes on top.",
        "",
        "| disk | computed as | GB |",
        "|---|---|---|",
    ]
    c = WMT_LIKE_CACHE
    cache = c["train_bytes"] / c["pairs"] * WMT14_EN_DE_PAIRS + c["fixed_bytes"]
    text = c["text_bytes"] / c["pairs_read"] * WMT14_EN_DE_PAIRS
    lines += [
        f"| data cache (`relmt-prepare data=wmt14_en_de`) | {WMT14_EN_DE_PAIRS:,} pairs (the dataset card of "
        f"`wmt/wmt14` de-en) x {c['train_bytes'] / c['pairs']:.0f} bytes per pair, measured on the cache entry of "
        f"the WMT-like text above ({c['pairs']:,} pairs, vocabulary {c['vocab_size']:,}), + spm.model "
        f"| {cache / GB:.1f} |",
        f"| the raw text, per copy | {WMT14_EN_DE_PAIRS:,} pairs x {c['text_bytes'] / c['pairs_read']:.0f} bytes "
        f"per pair of the same text (UTF-8, both sides) | {text / GB:.1f} |",
    ]
    for size in EXPERIMENTS:
        r = next(r for r in rows if r["size"] == size and r["positions"] == "rel")
        one, files, total = checkpoints(r)
        averaged = " + averaged.pt (weights only, 4 bytes per parameter)" if r["train"].average_last else ""
        lines.append(f"| checkpoints, {size} rel (`train.keep_last={r['train'].keep_last}`) | {r['params']:,} "
                     f"parameters (vocabulary {r['vocab']:,}) x {CHECKPOINT_BYTES} bytes = {one / GB:.2f} GB per "
                     f"step file, x {files} (keep_last + best.pt){averaged} | {total / GB:.1f} |")
    lines += [
        "",
        "The cache estimate assumes WMT14's pairs are as long as this Europarl and newstest text. Not counted: "
        "`datasets`' own cache files while relmt-prepare encodes, and the run directory's logs.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=SNIPPET)
    parser.add_argument("--measure-cache", type=Path, metavar="DIR",
                        help="print the bytes of a prepared cache entry (data/cache/NAME-KEY) and exit")
    opts = parser.parse_args(argv)
    if opts.measure_cache:
        print(json.dumps(measure_cache(opts.measure_cache)))
        return
    opts.out.write_text(snippet())
    print(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
