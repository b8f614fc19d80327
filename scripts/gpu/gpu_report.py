#!/usr/bin/env python
"""docs/results/gpu/gpu_*.{md,json} from what scripts/gpu/gpu_checks.sh brought back, committed under a folder of
docs/results/gpu/. Two layouts:
- issue 43's phases (tests.txt, attn.json, train43.json, suite.txt): the issue's goal table filled from one
  call, then the CUDA tests, the attention routes and training throughput beside OpenNMT-py;
- the calls of scripts/gpu/call.sh (a phases.json beside them): issue 73's goal table (scripts/gpu/lease_report.py);
- the first GPU run's (docs/results/gpu/: test_cuda.txt, suite_*.txt, train_gpu.json, attention_gpu.json,
  runs/): the CUDA tests, the suite on CUDA, the Multi30k recipe on the GPU beside the committed CPU runs,
  training speed and the attention benchmark.

    python scripts/gpu/gpu_report.py                     # reads docs/results/gpu, writes docs/results/gpu/gpu_checks.*
    python scripts/gpu/gpu_report.py --dir docs/results/gpu/issue43 --out docs/results/gpu/gpu_issue43
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from relmt.bench import markdown_table, write_json

SETS = ("test", "test_2017_flickr", "test_2017_mscoco")


def cuda_tests(text: str) -> dict:
    """The pytest summary line and the bf16-vs-CPU-float32 relative errors test_cuda.py prints per mode."""
    errors = {m.group(1): json.loads(m.group(2)) for m in re.finditer(r"^\.?([a-z0-9-]+) (\{.*\})$", text, re.M)}
    summary = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    return {"summary": summary[-1].strip() if summary else "no summary (cut off)", "bf16_errors": errors}


NODE = r"tests/[^\s\[]+(?:\[[^\]]*\])?"  # a test's id, its parameters in brackets with any spaces they hold


def suite(text: str) -> dict:
    """Counts from pytest's progress output, -q marks or -v lines (a run cut off by its timeout prints no
    summary); with -v, the names of the tests that failed."""
    lines = text.splitlines()
    marks = "".join(line.split(" [")[0] for line in lines if re.fullmatch(r"[.FEsx]+( \[ *\d+%\])?", line))
    # -v names each test with its outcome: "[gw3] [ 10%] PASSED tests/..." under xdist, "tests/... PASSED [ 10%]"
    # without; -rfE's summary repeats the failures ("FAILED tests/... - why"), so outcomes count once per test
    outcome = {}
    for line in lines:
        if m := re.search(rf"\b(PASSED|FAILED|ERROR) ({NODE})", line):
            outcome.setdefault(m.group(2), m.group(1))
        elif m := re.match(rf"({NODE}) (PASSED|FAILED|ERROR)\b", line):
            outcome.setdefault(m.group(1), m.group(2))
    verbose = list(outcome.values())
    summary = [line for line in lines if re.search(r"\d+ (passed|failed)", line)]
    out = {"passed": marks.count(".") + verbose.count("PASSED"), "failed": marks.count("F") + verbose.count("FAILED"),
           "errors": marks.count("E") + verbose.count("ERROR"),
           "summary": summary[-1].strip() if summary else "cut off by its timeout before pytest's summary"}
    if outcome:
        out["failed_tests"] = sorted(name for name, o in outcome.items() if o != "PASSED")
    if reasons := why_failed(text):
        out["reasons"] = reasons
    return out


def why_failed(text: str) -> dict[str, str]:
    """Each failure's reason as scripts/gpu/pytest_instant.py printed it ("--- why NODE failed (WHEN):", the
    report's last lines, "---"): its first "E " line (the exception and its message), or its last line."""
    reasons = {}
    for m in re.finditer(r"^--- why (.+?) failed \((\w+)\):\n(.*?)^---$", text, re.M | re.S):
        lines = [line.strip() for line in m.group(3).splitlines() if line.strip()]
        errors = [line[1:].strip() for line in lines if line.startswith("E ")]
        reasons.setdefault(m.group(1), (errors[:1] or lines[-1:] or [""])[0][:200])
    return reasons


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


GOAL_N = 1024  # the length issue 43 sets its attention memory goal at
ISSUE43_FILES = ("tests.txt", "attn.json", "train43.json", "train43c.json", "suite.txt")


def attention_memory(rows: list[dict]) -> tuple[int | None, dict[str, float]]:
    """rel's peak memory over abs's at the longest n, forward + backward: per route from
    scripts/bench/bench_attention_routes.py's rows (case MODE:ROUTE), or the one rel path of bench_attention.py's."""
    if not rows:
        return None, {}
    n = max(r["n"] for r in rows)
    at = [r for r in rows if r["n"] == n]
    if any("case" in r for r in at):
        return n, {r["case"]: r["peak_over_abs"] for r in at
                   if r["case"].split(":")[0] == "rel" and r.get("peak_over_abs") is not None}
    return n, {"rel": at[0]["rel_over_abs_mem"]} if "rel_over_abs_mem" in at[0] else {}


def fmt(values: dict[str, float], percent: bool = False) -> str:
    def one(v: float) -> str:
        return f"{100 * v:.1f}%" if percent else f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}"
    return ", ".join(f"{k} {one(v)}" for k, v in values.items()) or "not measured"


def goal(what: str, target: str, values: dict[str, float], ok, percent: bool = False) -> dict:
    """One row of the goal table; met is yes only when every figure meets it."""
    met = "" if not values else ("yes" if all(ok(v) for v in values.values()) else "no")
    return {"what": what, "goal": target, "measured": fmt(values, percent), "met": met}


def goal_table(tests: dict[str, dict], attn_rows: list[dict], train_rows: list[dict]) -> list[dict]:
    """Issue 43's goals, each filled from this call's files (blank where its phase did not run)."""
    relmt = {(r["size"], r["positions"]): r for r in train_rows if r.get("system", "relmt") == "relmt"}
    onmt = {(r["size"], r["positions"]): r for r in train_rows if str(r.get("system")).startswith("OpenNMT")}
    n, memory = attention_memory(attn_rows)
    failed = {name: float(t["failed"] + t["errors"]) for name, t in tests.items()}
    steps = {f"{size} {pos}": r["over_abs_step_time"] for (size, pos), r in relmt.items()
             if pos in ("rel", "rope", "alibi", "t5") and "over_abs_step_time" in r}
    mfu = {f"{s} {p}": relmt[(s, p)]["mfu"] for s, p in (("big", "abs"), ("big", "rel")) if (s, p) in relmt}
    big = goal("MFU, big abs / big rel", ">= 40% / >= 36%", mfu, lambda v: True, percent=True)
    if mfu:
        big["met"] = "yes" if mfu.get("big abs", 0) >= 0.40 and mfu.get("big rel", 0) >= 0.36 else "no"
    base = {"base abs": relmt[("base", "abs")]["mfu"]} if ("base", "abs") in relmt else {}
    ratio = {pos: {size: relmt[(size, pos)]["tgt_tokens_per_s"] / r["tgt_tokens_per_s"]
                   for (size, p), r in onmt.items() if p == pos and (size, pos) in relmt} for pos in ("abs", "rel")}
    mem = goal(f"rel attention memory / abs, n = {n}, forward + backward", "<= 1.3", memory, lambda v: v <= 1.3)
    if memory and n != GOAL_N:  # the goal is set at n = 1024: a shorter length neither meets nor misses it
        mem["met"] = ""
        mem["what"] = f"rel attention memory / abs, n = {GOAL_N} (reached only n = {n}), forward + backward"
    return [
        goal("tests failing on CUDA", "0", failed, lambda v: v == 0),
        mem,
        goal("step time / abs, base and big: rel, rope, alibi, t5", "<= 1.10 each", steps, lambda v: v <= 1.10),
        big,
        goal("MFU, base abs", ">= 30%", base, lambda v: v >= 0.30, percent=True),
        goal("relmt rel / OpenNMT-py rel, target tok/s", ">= 2.0", ratio["rel"], lambda v: v >= 2.0),
        goal("relmt abs / OpenNMT-py abs, target tok/s", ">= 1.2", ratio["abs"], lambda v: v >= 1.2),
        {"what": "CPU training (bench_peers.sh), rel / best relative peer", "goal": ">= 1.3, and no regression",
         "measured": "not measured on the GPU (scripts/peers/bench_peers.sh on 2 CPU cores)", "met": ""},
    ]


def body(md: Path) -> str:
    """A benchmark's markdown report without its title line."""
    return md.read_text().split("\n", 2)[2].strip() if md.is_file() else "(not run)"


def issue43_report(d: Path, out: Path) -> str:
    """out.{md,json}: issue 43's goal table and the phases' own reports, from scripts/gpu/gpu_checks.sh's files."""
    load = {name: json.loads((d / name).read_text())
            for name in ("attn.json", "train43.json", "train43f.json", "train43c.json") if (d / name).is_file()}
    tests = {name: suite((d / f"{name}.txt").read_text()) for name in ("tests", "suite")
             if (d / f"{name}.txt").is_file()}
    attn_rows = load.get("attn.json", {}).get("rows", [])
    train_rows = load.get("train43.json", {}).get("rows", [])
    flex_rows = load.get("train43f.json", {}).get("rows", [])
    goals = goal_table(tests, attn_rows, train_rows)
    flex_steps = {f"{r['size']} {r['positions']}": r["over_abs_step_time"] for r in flex_rows
                  if r["positions"] != "abs" and "over_abs_step_time" in r}
    goals.insert(3, goal("step time / abs, RELMT_ATTENTION=flex (dropout by the hashed mask)", "<= 1.10 each",
                         flex_steps, lambda v: v <= 1.10))
    hw = next((x["hardware"] for x in load.values() if "hardware" in x), {})
    compiled = load.get("train43c.json", {}).get("rows", [])
    write_json(out.with_suffix(".json"), {"hardware": hw, "goals": goals, "tests": tests, "attention": attn_rows,
                                          "train": train_rows, "train_flex": flex_rows, "train_compiled": compiled})
    columns = [("size", "model"), ("positions", "positions"), ("tgt_tokens_per_s", "target tok/s"),
               ("step_ms", "ms/step"), ("over_abs_step_time", "step time / abs"), ("peak_mib", "peak MiB"),
               ("mfu", "MFU")]
    compiled_md = markdown_table(compiled, columns) if compiled else "(not run)"
    flex_md = markdown_table(flex_rows, columns) if flex_rows else "(not run)"
    test_lines = "\n".join(
        f"- {name}.txt: {t['passed']} passed, {t['failed']} failed, {t['errors']} errors ({t['summary']})"
        + ("".join(f"\n  - `{n}`" + (f": {t['reasons'][n]}" if n in t.get("reasons", {}) else "")
                   for n in t.get("failed_tests", []))) for name, t in tests.items()) or "(not run)"
    md = f"""# Issue 43 on the GPU: {hw.get('gpu', 'no GPU named')}, {hw.get('date', '')}

Generated by `python scripts/gpu/gpu_report.py --dir {d} --out {out}` from what \
`bash scripts/gpu/gpu_checks.sh` wrote on
the device machine ({hw.get('gpu')}, torch {hw.get('torch')}, git {hw.get('git')}). Every ratio comes from this
one call.

## Goals

{markdown_table(goals, [("what", "what"), ("goal", "goal"), ("measured", "measured"), ("met", "met")])}

## 1. Tests on CUDA

tests.txt: every CUDA test (`pytest -m gpu`); suite.txt: the suite but the slow end-to-end runs, device auto.

{test_lines}

## 2. Attention, one layer forward + backward

{body(d / 'attn.md')}

## 3. Training throughput, relmt beside OpenNMT-py

{body(d / 'train43.md')}

## 4. Training through FlexAttention (`bench_train.py --route flex`: attention dropout by the hashed mask)

{flex_md}

## 5. The same, compiled (train.compile's torch.compile, symbolic sizes)

{compiled_md}
"""
    out.with_suffix(".md").write_text(md)
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("docs/results/gpu"))
    ap.add_argument("--cpu-runs", type=Path, default=Path("docs/results/reproduction/multi30k/runs"))
    ap.add_argument("--out", type=Path, default=Path("docs/results/gpu/gpu_checks"))
    args = ap.parse_args()
    d = args.dir
    if (d / "phases.json").is_file():  # the calls of scripts/gpu/call.sh (issue 73)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from lease_report import report

        print(report(d, args.out, args.cpu_runs))
        return
    if any((d / name).is_file() for name in ISSUE43_FILES):
        md = issue43_report(d, args.out)
        print(md)
        return
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
        "scripts/gpu/gpu_checks.sh now runs it with -v (`PHASES=suite` runs that phase alone).")
    md = f"""# GPU checks (GPU.md): {hw.get('gpu')}, {hw['date']}

Generated by `python scripts/gpu/gpu_report.py` from docs/results/gpu/, which \
`OUT=... scripts/gpu/gpu_checks.sh` wrote on
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
verdicts stand on the CPU tables (docs/results/positions/positions_attention_cpu.md), \
these are the GPU's figures beside them.

{(d / 'attention_gpu.md').read_text().split(chr(10), 2)[2].strip()}
"""
    args.out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
