#!/usr/bin/env python
"""docs/results/gpu_checks.{md,json} from what scripts/gpu_checks.sh brought back, committed under
docs/results/gpu/: the CUDA tests, the suite on CUDA, the Multi30k recipe on the GPU beside the committed
CPU runs, training speed at paper scale and the attention benchmark.

    python scripts/gpu_report.py                     # reads docs/results/gpu, writes docs/results/gpu_checks.*
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from relmt.bench import markdown_table, write_json

SETS = ("test", "test_2017_flickr", "test_2017_mscoco")


def cuda_tests(text: str) -> dict:
    """The pytest summary line and the bf16-vs-CPU-float32 relative errors test_cuda.py prints per mode."""
    errors = {m.group(1): json.loads(m.group(2)) for m in re.finditer(r"^\.?([a-z0-9-]+) (\{.*\})$", text, re.M)}
    summary = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    return {"summary": summary[-1].strip() if summary else "no summary (cut off)", "bf16_errors": errors}


def suite(text: str) -> dict:
    """Counts from pytest's progress output, -q marks or -v lines (a run cut off by its timeout prints no
    summary); with -v, the names of the tests that failed."""
    lines = text.splitlines()
    marks = "".join(line.split(" [")[0] for line in lines if re.fullmatch(r"[.FEsx]+( \[ *\d+%\])?", line))
    verbose = [m.groups() for m in (re.search(r"\b(PASSED|FAILED|ERROR) (tests/\S+)", line) for line in lines) if m]
    summary = [line for line in lines if re.search(r"\d+ (passed|failed)", line)]
    out = {"passed": marks.count(".") + sum(o == "PASSED" for o, _ in verbose),
           "failed": marks.count("F") + sum(o == "FAILED" for o, _ in verbose),
           "errors": marks.count("E") + sum(o == "ERROR" for o, _ in verbose),
           "summary": summary[-1].strip() if summary else "cut off by its timeout before pytest's summary"}
    if verbose:
        out["failed_tests"] = sorted({name for o, name in verbose if o != "PASSED"})
    return out


def bleu(score: float | dict) -> float:
    return score["bleu"] if isinstance(score, dict) else score  # older runs keep the signature beside it


def runs(gpu_dir: Path, cpu_dir: Path) -> list[dict]:
    rows = []
    for pos in ("abs", "rel", "both"):
        for where, path in (("H200 bf16", gpu_dir / f"m30k_{pos}_s1"), ("CPU fp32", cpu_dir / f"t1_{pos}_s1")):
            m = json.loads((path / "metrics.json").read_text())
            rows.append({"positions": pos, "where": where, **{s: round(bleu(m["test"][s]), 2) for s in SETS},
                         "wall_min": round(m["wall_seconds"] / 60, 1), "tgt_tok_s": round(m["tokens_per_s"]),
                         "run": str(path)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("docs/results/gpu"))
    ap.add_argument("--cpu-runs", type=Path, default=Path("docs/results/multi30k/runs"))
    ap.add_argument("--out", type=Path, default=Path("docs/results/gpu_checks"))
    args = ap.parse_args()
    d = args.dir
    train = json.loads((d / "train_gpu.json").read_text())
    attention = json.loads((d / "attention_gpu.json").read_text())
    report = {"hardware": train["hardware"], "cuda_tests": cuda_tests((d / "test_cuda.txt").read_text()),
              "suite": {p.stem: suite(p.read_text()) for p in sorted(d.glob("suite_*.txt"))},
              "multi30k": runs(d / "runs", args.cpu_runs), "train": train["rows"], "attention": attention["rows"]}
    write_json(args.out.with_suffix(".json"), report)

    hw = train["hardware"]
    errs = report["cuda_tests"]["bf16_errors"]
    err_rows = [{"mode": mode, "logits": e["logits"], "gradients": e["grads"],
                 "position parameters (max)": max([v for k, v in e.items() if k not in ("logits", "grads")],
                                                  default=None)} for mode, e in errs.items()]
    suite_lines = "\n".join(f"- {name}: {s['passed']} passed, {s['failed']} failed before it stopped ({s['summary']})"
                            for name, s in report["suite"].items())
    step = {(r["size"], r["positions"]): r for r in train["rows"]}
    m30k = {(r["positions"], r["where"]): r for r in report["multi30k"]}
    long = attention["rows"][-1]  # the longest n
    goals = ", ".join(f"{v} {long[f'{v}_over_abs']:.2f}x the time and {long[f'{v}_over_abs_mem']:.2f}x the memory"
                      for v in ("rope", "alibi", "t5") if f"{v}_over_abs" in long)
    names = sorted({n for s in report["suite"].values() for n in s.get("failed_tests", [])})
    failed_names = ("Failed: " + ", ".join(f"`{n}`" for n in names)) if names else (
        "The failing tests' names were not captured: pytest -q names them only in its final summary. "
        "scripts/gpu_checks.sh now runs it with -v (`PHASES=suite` runs that phase alone).")
    md = f"""# GPU checks (GPU.md): {hw.get('gpu')}, {hw['date']}

Generated by `python scripts/gpu_report.py` from docs/results/gpu/, which `OUT=... scripts/gpu_checks.sh` wrote on
the device machine ({hw.get('gpu')}, {hw['cpu']} with {hw['cpu_count']} cores, torch {hw['torch']}, git
{hw['git']}). The abs Multi30k run was stopped at the script's 400 s mark and finished with `train.resume=true`
(its train_resumed.out).

## 1. Correctness on CUDA

tests/test_cuda.py (`make test-gpu`): **{report['cuda_tests']['summary']}**. Every positions mode equals its
float32 CPU result in float32 on the GPU (TF32 off; outputs and every gradient to rtol 1e-4), cached
decoding equals the full pass in float64, beam 1 equals greedy, and bf16 training trains, resumes and
decodes (rel, rope, t5). Under bf16 autocast, the relative error (in norm) against float32 on the CPU; the
test allows 0.02 for logits, 0.06 for gradients, 0.1 for each position table's gradient (a^K, a^V, T5's
buckets); rel-keys-only is the SDPA bias route for a^K, rel and both the written-out route for a^V:

{markdown_table(err_rows, [("mode", "mode"), ("logits", "logits"), ("gradients", "gradients"),
                           ("position parameters (max)", "position tables, worst")])}

The rest of the suite with the device left on auto (CUDA, bf16), `pytest -m "not slow and not exhaustive
and not gpu" -n 12..16`, did not finish inside the device time:

{suite_lines}

{failed_names}

## 2. Training speed at paper scale

{(d / 'train_gpu.md').read_text().split(chr(10), 2)[2].strip()}

**Read with care: abs is not measured fairly here.** abs took {step[("base", "abs")]["step_ms"]:.0f} ms per base
step against rel's {step[("base", "rel")]["step_ms"]:.0f}, while abs is the fastest mode in the attention benchmark
below and trained faster than rel in the Multi30k runs ({m30k[("abs", "H200 bf16")]["tgt_tok_s"]} against
{m30k[("rel", "H200 bf16")]["tgt_tok_s"]} target tok/s), where batch shapes recur every epoch. In this
benchmark every one of the {train["settings"]["steps"]} timed batches is a shape not seen before, and abs runs
first on each: it pays every one-off cost per new shape (the likeliest: the fused attention kernels' per-shape
set-up, which the other modes' cross-attention then reuses). The rel/abs ratios of this run are therefore not a
property of the method. bench_train.py now runs every timed batch once per mode before timing on CUDA
and rotates the order of the modes (--shape-warmup; after this run): rerun it on the next GPU session.

## 3. The Multi30k recipe on the GPU, beside the CPU runs

`experiment=multi30k_cpu seed=1 train.device=cuda train.precision=bf16`, the three runs side by side on the
one GPU; the test suite ran beside them for their first ~200 s (their logs show ~8k target tok/s then and
70-85k once it had stopped), so the wall times are upper bounds. CPU fp32: the committed seed-1 runs of
multi30k_tables.txt (2 cores, one thread each).

{markdown_table(report['multi30k'], [("positions", "positions"), ("where", "where"), ("test", "test2016"),
                                      ("test_2017_flickr", "flickr 2017"), ("test_2017_mscoco", "mscoco 2017"),
                                      ("wall_min", "wall min"), ("tgt_tok_s", "target tok/s")])}

## 4. Attention (issue 31 §3), on the GPU

At n = {long["n"]}, against abs: {goals}. Issue 31 §3 asks for at most 1.1x the time and 1.2x the memory; its
verdicts stand on the CPU tables (docs/results/positions_attention_cpu.md), these are the GPU's figures beside them.

{(d / 'attention_gpu.md').read_text().split(chr(10), 2)[2].strip()}
"""
    args.out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
