#!/usr/bin/env python
"""The GPU lease's page (issue 73 §5): issue 68's goal table filled from the calls of scripts/gpu/call.sh, each
call's results.tgz unpacked into one folder with its phases.json (scripts/gpu/README.md, "The next lease"). Every
ratio comes from one call. scripts/gpu/gpu_report.py writes it when the folder holds a phases.json.

    python scripts/gpu/gpu_report.py --dir docs/results/gpu/2026-MM-DD --out docs/results/gpu/2026-MM-DD/lease
"""

from __future__ import annotations

import json
from pathlib import Path

from gpu_report import body, goal, suite

from relmt.bench import markdown_table, write_json


def load(d: Path, name: str) -> dict:
    return json.loads((d / name).read_text()) if (d / name).is_file() else {}


def m30k_goal(d: Path, cpu_runs: Path) -> dict:
    """The Multi30k recipe (rel) trained on the GPU: its test2016 BLEU against the CPU seeds' range."""
    row = {"what": "the Multi30k recipe (rel) trained on the GPU: test2016 BLEU", "goal": "inside the CPU seeds' range"}
    seeds = sorted(json.loads(p.read_text())["test"]["test"]["bleu"] for p in cpu_runs.glob("t1_rel_s*/metrics.json"))
    gpu = d / "m30k/m30k_rel_s1/metrics.json"
    if not gpu.is_file() or not seeds:
        return {**row, "measured": "not measured" if not gpu.is_file() else "no CPU seeds", "met": ""}
    metrics = json.loads(gpu.read_text())
    if "test" not in metrics:
        return {**row, "measured": f"status {metrics.get('status')}: no test BLEU", "met": "no"}
    bleu = metrics["test"]["test"]["bleu"]
    return {**row, "measured": f"{bleu:.2f} (CPU seeds {seeds[0]:.2f} to {seeds[-1]:.2f}, {len(seeds)} seeds)",
            "met": "yes" if seeds[0] <= bleu <= seeds[-1] else "no"}


def flex_goal(conv: dict) -> dict:
    row = {"what": "flex: compiles, and loss after the updates / reference", "goal": "compiles; within 1%"}
    rows = {r["run"]: r for r in conv.get("rows", [])}
    if not rows:
        return {**row, "measured": "not measured", "met": ""}
    if "error" in rows.get("flex", {}):
        return {**row, "measured": f"did not run: {rows['flex']['error'][:120]}", "met": "no"}
    if "mean_loss_last" not in rows.get("reference", {}):
        return {**row, "measured": "no reference curve", "met": ""}
    ratio = rows["flex"]["mean_loss_last"] / rows["reference"]["mean_loss_last"]
    updates = len(next(iter(conv["curves"].values())))
    return {**row, "what": f"flex: compiles, and loss after {updates} updates / reference",
            "measured": f"{ratio:.4f}", "met": "yes" if abs(ratio - 1) <= 0.01 else "no"}


def decode_goal(decode: dict) -> dict:
    """Issue 76 §4: the whole search in one compiled call against a Python step per token, on the GPU."""
    row = {"what": "the whole search in one call (issue 76 §4): sentences/s ÷ a Python step per token",
           "goal": "reported"}
    loop = decode.get("loop", {})
    if not decode.get("rows"):
        return {**row, "measured": "not measured", "met": ""}
    if "error" in loop:
        return {**row, "measured": f"did not run: {loop['stage']}: {loop['error'][:120]}", "met": "no"}
    ratios = [f"{r['regime']} {r['over_per_step']:.2f}" for r in decode["rows"] if r["system"] != "per step"]
    if not ratios:
        return {**row, "measured": "the loop had not run", "met": ""}
    return {**row, "measured": ", ".join(ratios) + f" (same best hypothesis: {loop['same']} of {loop['sentences']})",
            "met": "yes"}


def goals(d: Path, cpu_runs: Path) -> tuple[list[dict], dict]:
    train, big, conv = load(d, "train43.json"), load(d, "big.json"), load(d, "route_convergence.json")
    tests = {name: suite((d / f"{name}.txt").read_text()) for name in ("tests", "suite")
             if (d / f"{name}.txt").is_file()}
    # the call's sizes (base and big; a rehearsal's are tiny and toy), by phase: train43's, then big's
    sizes = {"base": next((r["size"] for r in train.get("rows", [])), "base"),
             "big": next((r["size"] for r in big.get("rows", [])), "big")}
    rows = train.get("rows", []) + big.get("rows", [])
    named = {v: k for k, v in sizes.items()}
    relmt = {(named.get(r["size"], r["size"]), r["positions"]): r for r in rows if r.get("system", "relmt") == "relmt"}
    onmt = {(named.get(r["size"], r["size"]), r["positions"]): r for r in rows
            if str(r.get("system")).startswith("OpenNMT")}
    failed = {name: float(t["failed"] + t["errors"]) for name, t in tests.items()}
    steps = {pos: relmt[("base", pos)]["over_abs_step_time"] for pos in ("rel", "both", "rope", "alibi", "t5")
             if ("base", pos) in relmt and "over_abs_step_time" in relmt[("base", pos)]}

    def mfu(size: str, floors: tuple[float, float]) -> dict:
        values = {f"{size} {p}": relmt[(size, p)]["mfu"] for p in ("abs", "rel") if (size, p) in relmt}
        row = goal(f"MFU, {size} abs / {size} rel", f">= {floors[0]:.0%} / >= {floors[1]:.0%}", values,
                   lambda v: True, percent=True)
        if values:
            row["met"] = "yes" if all(values.get(f"{size} {p}", 0) >= f for p, f in zip(("abs", "rel"), floors)) \
                else "no"
        return row

    ratio = {"base": relmt[("base", "rel")]["tgt_tokens_per_s"] / onmt[("base", "rel")]["tgt_tokens_per_s"]} \
        if ("base", "rel") in relmt and ("base", "rel") in onmt else {}
    table = [goal("CUDA tests and suite failing on CUDA", "0", failed, lambda v: v == 0),
             goal("base step time / abs: rel, both, rope, alibi, t5", "<= 1.10 each", steps, lambda v: v <= 1.10),
             mfu("base", (0.35, 0.32)), mfu("big", (0.45, 0.42)),
             goal("relmt rel / OpenNMT-py rel, target tok/s", ">= 2.0", ratio, lambda v: v >= 2.0),
             flex_goal(conv), m30k_goal(d, cpu_runs), decode_goal(load(d, "decode.json"))]
    return table, {"tests": tests, "train": rows, "convergence": conv.get("rows", [])}


def report(d: Path, out: Path, cpu_runs: Path) -> str:
    table, parts = goals(d, cpu_runs)
    phases = load(d, "phases.json")
    hw = next((x["hardware"] for x in (load(d, n) for n in ("train43.json", "big.json", "route_convergence.json",
                                                            "decode.json"))
               if "hardware" in x), {})
    write_json(out.with_suffix(".json"), {"hardware": hw, "phases": phases, "goals": table, **parts})
    phase_rows = [{**p, "files": ", ".join(p["files"])} for p in phases.get("phases", [])]
    test_lines = "\n".join(
        f"- {name}.txt: {t['passed']} passed, {t['failed']} failed, {t['errors']} errors ({t['summary']})"
        + "".join(f"\n  - `{n}`" + (f": {t['reasons'][n]}" if n in t.get("reasons", {}) else "")
                  for n in t.get("failed_tests", [])) for name, t in parts["tests"].items()) or "(not run)"
    rehearsal = " (a rehearsal on the device lane)" if phases.get("rehearsal") else ""
    md = f"""# The GPU lease: {hw.get('gpu', 'no GPU named')}, {hw.get('date', '')}{rehearsal}

Generated by `python scripts/gpu/gpu_report.py --dir {d} --out {out}` from the calls of `scripts/gpu/call.sh`
({hw.get('gpu')}, torch {hw.get('torch')}, git {hw.get('git')}). Every ratio comes from one call.

## Goals (issue 73; one H100 or H200, bf16)

{markdown_table(table, [("what", "what"), ("goal", "goal"), ("measured", "measured"), ("met", "met")])}

## Phases

{markdown_table(phase_rows, [("phase", "phase"), ("exit", "exit"), ("seconds", "seconds"), ("box", "box"),
                             ("files", "files")]) if phase_rows else "(no phases.json)"}

## CUDA tests and the suite

{test_lines}

## Training throughput, base, beside OpenNMT-py

{body(d / 'train43.md')}

## The big model

{body(d / 'big.md')}

## FlexAttention against the reference route

{body(d / 'route_convergence.md')}

## Decoding: a Python step per token against the whole search in one call

{body(d / 'decode.md')}
"""
    out.with_suffix(".md").write_text(md)
    return md



