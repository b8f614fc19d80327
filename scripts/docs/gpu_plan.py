"""docs/gpu.md's cost table: what the paper's WMT14 EN-DE runs need on GPUs (wall time, GPU memory, disk),
computed, not measured, from the one measurement of every mode at both sizes and from the configs.

The measurement is docs/results/gpu/gpu_issue43.json: relmt's training step on one H200 in bf16, each size and
position mode, on batches of at most 81,858 padded tokens of real en-de text (scripts/bench/bench_train.py).
The runs are configs/experiment/table1_{base,big}_ende.yaml, composed as relmt-train composes them. Each figure
is one of these, and the table says which:

- time per update = the measured step time x (the update's padded tokens / the measured step's), assuming
  time grows linearly with padded tokens; N GPUs take 1/N of it (linear scaling: the best case);
- GPU memory = 16 bytes per parameter (fp32 weights, gradients and Adam's two moments), plus 4 more for DDP's
  gradient buckets, plus the rest of the measured peak scaled to the micro-batch;
- disk = a relmt-prepare cache entry of the WMT-like text, measured (WMT_LIKE_CACHE, `--measure-cache`) and
  scaled by pairs to WMT14 EN-DE, plus checkpoints of parameters x 12 bytes (fp32 weights and Adam's moments).

rel's and both's step times are those of 2026-11-27's code, which has changed twice since: the table sets each
mode's step time / abs that day beside the roofline forecast for today's code (docs/results/gpu/roofline_after.json,
traced on a CPU, not measured), and says what the call of 2026-11-28 measured in between
(docs/results/gpu/2026-11-28/train43.json).

The table is written into docs/gpu.md itself, between the marker comments of scripts/docs/page_block.py, so that
the page reads whole on GitHub too; tests/test_gpu_plan.py regenerates it in memory and fails when the committed
page differs.

    python scripts/docs/gpu_plan.py                        # rewrites the table in docs/gpu.md
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from page_block import replaced  # noqa: E402

MEASURED = ROOT / "docs/results/gpu/gpu_issue43.json"  # 2026-11-27: every mode, base and big
LATER = ROOT / "docs/results/gpu/2026-11-28/train43.json"  # 2026-11-28: base only, the label sums by scans
ROOFLINE = {"before": ROOT / "docs/results/gpu/roofline_before.json",  # the scans, as 2026-11-28 ran them
            "after": ROOT / "docs/results/gpu/roofline_after.json"}  # today's code: one masked product
PAGE = ROOT / "docs/gpu.md"
SCRIPT = "scripts/docs/gpu_plan.py"  # as the page's markers name it
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


def since(rows: list[dict]) -> dict:
    """What is known of rel's step time / abs's after the measurement the table is computed from: the call of
    2026-11-28 (base; the label sums by scans) and the roofline estimates, traced on a CPU, of the scans and of
    today's masked product (base, bf16, at an H200's peaks; a forecast, not a measurement)."""
    later = json.loads(LATER.read_text())
    roofline = {k: json.loads(p.read_text()) for k, p in ROOFLINE.items()}
    base = next(r for r in rows if r["size"] == "base" and r["positions"] == "rel")
    big = next(r for r in rows if r["size"] == "big" and r["positions"] == "rel")
    return {"measured_base": base["measured"]["over_abs_step_time"],
            "measured_big": big["measured"]["over_abs_step_time"],
            "later": next(r["over_abs_step_time"] for r in later["rows"] if r.get("system") == "relmt"
                          and r["size"] == "base" and r["positions"] == "rel"),
            "later_date": later["hardware"]["date"][:10],
            "roofline_before": roofline["before"]["results"]["rel"]["ratio_to_abs"],
            "forecast": {p: r["ratio_to_abs"] for p, r in roofline["after"]["results"].items()},
            "forecast_size": roofline["after"]["shape"]["model"].split()[0]}


def table(rows: list[dict] | None = None) -> str:
    """The Markdown that docs/gpu.md holds between scripts/docs/page_block.py's markers."""
    rows = plans() if rows is None else rows
    hw = json.loads(MEASURED.read_text())["hardware"]
    base = next(r for r in rows if r["size"] == "base" and r["positions"] == "rel")
    f, t = figures(base), base["train"]
    freq_n, micro_n = batch_rule(GPUS, t.update_freq, f["update"])
    micro_1 = batch_rule(1, t.update_freq, f["update"])[1]
    m = base["measured"]
    s = since(rows)
    day = hw["date"][:10]
    abs_n = figures(next(r for r in rows if r["size"] == "base" and r["positions"] == "abs"))["hours_n"]
    lines = [
        "Written by `python scripts/docs/gpu_plan.py`: **computed, not measured**. Every time below is computed "
        f"from one measurement, [gpu_issue43.json](results/gpu/gpu_issue43.md) (one {hw['gpu']}, bf16, "
        f"torch {hw['torch']}, {hw['date']}, git {hw['git']}: each mode's step on batches of at most "
        f"{m['max_padded_tokens']:,} padded tokens of real en-de text), the last that timed every mode at both "
        "sizes, and from the composed `experiment=table1_base_ende` and `table1_big_ende` configs. rel's and "
        f"both's rows time {day}'s code, which has changed since: the forecast column and the first note below "
        "say what is known of today's.",
        "",
        f"| model | positions | updates | measured {day}: ms per step ({m['max_padded_tokens']:,} padded tokens) "
        f"| measured {day}: step time ÷ abs | forecast, not measured: step time ÷ abs (roofline, "
        f"{s['forecast_size']} only) "
        f"| measured: target tok/s | s per update ({f['update']:,} padded tokens) | hours, 1 GPU "
        f"| hours, {GPUS} GPUs | measured peak GiB ({m['max_padded_tokens']:,}) "
        f"| GiB per GPU, 1 GPU ({micro_1:,} per micro-batch) "
        f"| GiB per GPU, {GPUS} GPUs ({micro_n:,} per micro-batch) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        g = figures(r)
        forecast = f"{s['forecast'][r['positions']]:.2f}" if r["size"] == s["forecast_size"] else "—"
        lines.append(f"| {r['size']} | {r['positions']} | {r['train'].max_steps:,} | {r['measured']['step_ms']:.0f} "
                     f"| {r['measured']['over_abs_step_time']:.2f} | {forecast} "
                     f"| {r['measured']['tgt_tokens_per_s']:,.0f} | {g['update_s']:.3f} | {g['hours_1']:.1f} "
                     f"| {g['hours_n']:.2f} | {g['peak_gib']:.1f} | {g['memory_1']:.1f} | {g['memory_n']:.1f} |")
    lines += [
        "",
        f"- **rel and both are {day}'s code.** That day base rel took {s['measured_base']:.2f}x abs's step time "
        f"and big rel {s['measured_big']:.2f}x, with its sums per label by scatter_add. The call of "
        f"{s['later_date']} ([its page](results/gpu/2026-11-28/README.md)) timed the prefix scans that had replaced "
        f"them at {s['later']:.2f}x in base (big was not reached). Since then (issue 68) the sums are one masked "
        "product, timed on no GPU yet. The forecast column is a roofline estimate traced on a CPU "
        "([roofline_after](results/gpu/roofline_after.md)), which leaves out launch overheads and kernels that "
        f"miss their peak: the same estimate put the scans at {s['roofline_before']:.2f}x "
        f"([roofline_before](results/gpu/roofline_before.md)) where the GPU measured {s['later']:.2f}x. At the "
        f"forecast, base rel would take {abs_n * s['forecast']['rel']:.2f} hours on {GPUS} GPUs, not the table's "
        f"{f['hours_n']:.2f}: a forecast, which the next GPU call measures.",
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


def page(text: str | None = None, rows: list[dict] | None = None) -> str:
    """docs/gpu.md (or `text`) with the table between its markers written anew."""
    return replaced(PAGE.read_text() if text is None else text, SCRIPT, table(rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--page", type=Path, default=PAGE, help="the page that holds the table between its markers")
    parser.add_argument("--measure-cache", type=Path, metavar="DIR",
                        help="print the bytes of a prepared cache entry (data/cache/NAME-KEY) and exit")
    opts = parser.parse_args(argv)
    if opts.measure_cache:
        print(json.dumps(measure_cache(opts.measure_cache)))
        return
    opts.page.write_text(page(opts.page.read_text()))
    print(f"wrote the table into {opts.page}")


if __name__ == "__main__":
    main()
