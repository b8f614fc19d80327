#!/usr/bin/env python
"""Issue 14's levers in docs/results/performance/perf_log.md: predicted gain, measured gain, kept or not.

Every measured figure is read from the JSON a benchmark wrote (named in each row, with the command
that wrote it); this script only arranges them. It rewrites the "## Issue 14 levers" section at the
end of perf_log.md and leaves everything above it as scripts/bench/perf_history.py wrote it.

    python scripts/bench/perf_levers.py            # after the benchmarks named below have run
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs/results/performance"
HEADING = "## Issue 14 levers"


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def x(value: float) -> str:
    return f"{value:.2f}x"


def decode_rows() -> tuple[list[list[str]], dict]:
    speed = load("decode_levers.json")
    rows = {r["variant"]: r for r in speed["rows"]}
    bleu = {r["variant"]: r for r in load("decode_levers_bleu.json")["rows"]}
    batch = next(k for k in rows["eager"] if k.endswith("/batch"))

    def measured(variant: str) -> str:
        r = rows[variant]
        same = "same translations" if r[f"{batch} same as eager"] and r["1 at a time same as eager"] else \
            "translations differ from eager's"
        return (f"{x(r[f'{batch} vs eager'])} at {batch} ({r[batch]:.1f} sentences/s), {x(r['1 at a time vs eager'])} "
                f"one at a time ({r['1 at a time']:.1f}); {same}; warm-up {r['warmup_s']:.0f} s")

    def bleu_cost(variant: str) -> str:
        if variant not in bleu:
            return ""
        return f"; Multi30k test2016 BLEU {bleu[variant]['bleu']:.2f} against eager's {bleu['eager']['bleu']:.2f}"

    table = [
        ["self-attention keys/values written into preallocated, pooled buffers instead of a new tensor at each step "
         "(`prealloc_cache`)",
         "a few per cent at most: the copy of the past rows stays (beam search reorders them every step), only the "
         "allocation goes",
         measured("prealloc_cache"), "no: within run-to-run noise, and it would make the cache mutable"],
        ["`torch.compile(decode_step, dynamic=True)` (`compile`)",
         "10-30%: fewer operator dispatches per step, elementwise work fused",
         measured("compile"), "as part of the next row"],
        ["the same with inductor's freezing: weights folded in as constants and prepacked for oneDNN "
         "(`compile_freezing`, `relmt-translate compile=true`)",
         "up to 1.3x at 32 per batch (oneDNN linears alone gave 1.22x, the earlier row)",
         compiled_in_perf_cpu() + bleu_cost("compile_freezing"),
         "yes, as an option (`compile=true`, relmt/decode/compiled.py): translations unchanged, but compiling costs "
         "tens of seconds"],
        ["int8 dynamic quantisation of the decoder's linear layers (`torch.ao.quantization.quantize_dynamic`; "
         "W^Q and the output projection stay float32) (`int8_dynamic`)",
         "1.2-1.5x at 32 per batch, a BLEU cost of a few tenths",
         measured("int8_dynamic") + bleu_cost("int8_dynamic"),
         "no: torch 2.13 deprecates this API (quantisation moves to torchao); the supported int8 path is "
         "`relmt-export quantization=int8` for CTranslate2"],
    ]
    return table, {"speed": speed, "bleu": load("decode_levers_bleu.json")}


def compiled_in_perf_cpu() -> str:
    """`compile=true` against eager relmt, each decoding in processes of their own, from the side-by-side
    run (decode_levers.json's compile_freezing row shares dynamo's graphs with its compile row, which
    that process compiled first, so it times those)."""
    decode = load("perf_cpu.json")["summary"]["decode"]
    parts = []
    for regime, what in (("batch32", "at 32 per batch"), ("latency", "one at a time"), ("large", "in one batch")):
        eager, compiled = decode[f"relmt/rel/{regime}"][0], decode[f"relmt-compiled/rel/{regime}"][0]
        parts.append(f"{x(compiled / eager)} {what} ({eager:.1f} to {compiled:.1f} sentences/s)")
    return "; ".join(parts) + " (perf_cpu.md, medians, each in processes of its own)"


def profile_row() -> list[str]:
    prof = load("decode_profile.json")
    one = prof["modes"]["1 at a time"]
    ops = ", ".join(f"{e['op'].removeprefix('aten::')} {100 * e['self_share']:.0f}%" for e in one["top_ops"][:3])
    return ["per-step Python overhead of beam search at one sentence at a time (profiled first)",
            "the search's own tensor bookkeeping (topk, sort, gathers) as a large share of a 3-4 ms step",
            f"{one['ms_per_step']:.2f} ms per step: {100 * one['share_decode_step']:.0f}% inside the network "
            f"(`decode_step`), {100 * one['share_search']:.0f}% in the search around it, "
            f"{100 * one['share_encode']:.0f}% encoding; top operators by self time: {ops}",
            "no change: the search is not the bottleneck; the network's many small GEMMs (4 rows each) are"]


def processes_row() -> list[str]:
    proc = load("decode_processes.json")
    med = {k: sorted(v)[len(v) // 2] for k, v in proc["sentences_per_s"].items()}
    return ["two 1-thread processes against one 2-thread process, decoding at 32 per batch",
            "about 1.16x, as for training (threads_cpu.md)",
            f"{x(proc['ratio'])} ({med['threads x 1']:.1f} against {med['1 x threads']:.1f} sentences/s)",
            "a deployment choice for throughput jobs; training sweeps already run that way "
            "(scripts/reproduce/run_queue.sh)"]


def train_row() -> list[str]:
    eager = {r["positions"]: r for r in load("train_eager_cpu.json")["rows"]}
    compiled = {r["positions"]: r for r in load("train_compile_cpu.json")["rows"]}
    parts = [f"{pos} {x(compiled[pos]['tgt_tokens_per_s'] / eager[pos]['tgt_tokens_per_s'])} "
             f"({eager[pos]['tgt_tokens_per_s']:,.0f} to {compiled[pos]['tgt_tokens_per_s']:,.0f} target tokens/s)"
             for pos in ("abs", "rel") if pos in eager and pos in compiled]
    return ["`torch.compile` of the training step (`train.compile=true`, dynamic shapes)",
            "10-20%: the non-matmul third of a step (layer norms, softmax, dropout, residual adds) fused",
            "; ".join(parts) + " (`train_step` alone, after compiling)",
            "kept as the option it was (`train.compile`), off by default"]


def memory_row() -> list[str]:
    before = {r["n"]: r for r in load("attention_memory_before.json")["rows"]}
    after = {r["n"]: r for r in load("attention_memory_after.json")["rows"]}
    n = max(after)
    return ["a^V path: the q·a^K term added and the mask applied in place, so that one fewer (B, H, n, n) buffer "
            "is alive at once",
            "one (B, H, n, n) float32 buffer less at the forward peak",
            f"n = {n}: forward-only peak {before[n]['rel_forward_mb']:.0f} to {after[n]['rel_forward_mb']:.0f} MiB "
            f"(abs {after[n]['abs_forward_mb']:.0f}); forward + backward peak {before[n]['rel_mb']:.0f} to "
            f"{after[n]['rel_mb']:.0f} MiB, {after[n]['rel_over_abs_mem']:.2f}x abs (the backward pass holds the "
            "peak)",
            "yes (bitwise the same values)"]


def linear_row() -> list[str]:
    runs = {r["threads"]: r for r in load("linear_backend.json")["runs"]}
    r = runs[2]["sentences_per_s"]
    mean = {k: sum(v) / len(v) for k, v in r.items()}
    return ["every linear layer through oneDNN (weights converted once) instead of PyTorch's default MKL GEMM, "
            "measured by monkey-patching `F.linear` (`scripts/bench/bench_linear_backend.py`)",
            "up to 2x on the (128 x 256) x (256 x N) GEMMs of a 32-sentence beam-4 step (a microbenchmark under load)",
            f"{x(mean['onednn/32'] / mean['mkl/32'])} at 32 per batch, {x(mean['onednn/1'] / mean['mkl/1'])} one "
            "at a time (2 threads)",
            "through compiling: inductor's freezing prepacks the weights for oneDNN (the `compile=true` row)"]


def source(what: str, name: str) -> str:
    return f"- {what}: `{load(name)['command']}`: [{name}]({name})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log", type=Path, default=RESULTS / "perf_log.md")
    opts = parser.parse_args()
    decode, sources = decode_rows()
    rows = [
        ["decoding reuses the scaled W^Q, b^Q between steps (they were rescaled at every call)",
         "a few per cent at batch 1 (`aten::mul` was 7% of self time in a batch-1 profile)",
         "not measured on its own; it is in the side-by-side run",
         "yes until issue 42 §4, then dropped: keyed on tensor versions, it went stale after weight changes that "
         "keep them (fused Adam, `p.data.copy_()`); it saved 0.2-0.5% at 32 sentences per batch, 2-4% one at a "
         "time (1 thread)"],
        linear_row(), *decode, profile_row(), processes_row(), train_row(), memory_row(),
    ]
    speed, bleu = sources["speed"], sources["bleu"]
    hw = speed["hardware"]
    lines = [HEADING, "",
             "The side-by-side run left relmt's decoding behind CTranslate2 float32 and its training short of the "
             "1.3x goal ([perf_cpu.md](perf_cpu.md), Goals). Each lever: what it was expected to buy, what it "
             "bought, kept or not. Written by `python scripts/bench/perf_levers.py` from these measurements:", "",
             f"- decoding levers: `{speed['command']}` ({hw['cpu']}, {speed['threads']} threads, {hw['date']}, git "
             f"{hw['git']}; the rel checkpoint that scripts/peers/bench_peers.sh trains, beam 4, forced "
             f"{speed['length']} tokens, mean of {speed['repeats']} alternating repeats): "
             "[decode_levers.json](decode_levers.json) (its `compile_freezing` row is not used: in one process "
             "it reuses the graphs that the `compile` row compiled first; `compile=true` is timed in processes of "
             "its own by the side-by-side run, [perf_cpu.json](perf_cpu.json))",
             f"- BLEU cost: `{bleu['command']}` (free decoding, beam 4, alpha 0.6, the last checkpoint of the "
             "Multi30k run t1_rel_s1): [decode_levers_bleu.json](decode_levers_bleu.json)",
             source("profile", "decode_profile.json"),
             source("processes", "decode_processes.json"),
             source("training, eager", "train_eager_cpu.json"),
             source("training, compiled", "train_compile_cpu.json"),
             f"- memory: `{load('attention_memory_after.json')['command']}`, run on the code before and after the "
             "change (memory is counted tensor by tensor, so it does not depend on what else runs): "
             "[attention_memory_before.json](attention_memory_before.json), "
             "[attention_memory_after.json](attention_memory_after.json)",
             source("oneDNN linears", "linear_backend.json"),
             "", "| lever | predicted | measured | kept |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    text = opts.log.read_text()
    head = text.split("\n" + HEADING)[0].rstrip("\n")
    opts.log.write_text(head + "\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
