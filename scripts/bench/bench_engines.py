#!/usr/bin/env python
"""The candidates for relmt's inference engine (issue 33 §1), measured before choosing: one decoder step
(`Transformer.decode_step` on the explicit cache, as relmt/export/onnx.py exports it) and the time it takes
to make each engine's artefact, for eager PyTorch, ONNX Runtime (torch.onnx, dynamo exporter) and
AOTInductor (torch.export + torch._inductor.aoti_compile_and_package).

The model is the peer benchmark's shape (3+3 layers, d_model 256, 4 heads, FFN 1024, relative k = 16 with
per-head tables, which CTranslate2 cannot hold), random weights, vocabulary --vocab; each step advances
beam 4 for B sentences of --source tokens at target position --position. Run nothing else meanwhile.

    python scripts/bench/bench_engines.py --out docs/results/engines/engines_cpu.json \
        --md docs/results/engines/engines_cpu.md
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from relmt.bench import command_line, hardware, markdown_table, write_json
from relmt.config import ModelConfig, PosKind
from relmt.export.aoti import AotiModel, export_aoti
from relmt.export.graphs import STEP_INPUTS, StepGraph, nest
from relmt.export.onnx import OnnxModel, export_onnx
from relmt.model.transformer import build_model
from relmt.runtime import tune_cpu


def median_ms(fn, repeats: int, min_seconds: float) -> float:
    for _ in range(3):
        fn()
    times, start = [], time.perf_counter()
    while len(times) < repeats or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def inputs(model, batch: int, beam: int, source: int, position: int):
    first = model.decoder_layers[0].self_attn
    layers, heads, d_head = len(model.decoder_layers), first.n_heads, first.d_head
    n = batch * beam
    tokens = torch.randint(4, model.tgt_embed.num_embeddings, (batch, beam))
    # the step's inputs as an engine takes them (relmt.export.graphs.flat): the cache one tensor per layer
    return (tokens, torch.ones(batch, source, dtype=torch.bool),
            *(torch.randn(layers, batch, heads, source, d_head) for _ in range(2)),
            *(torch.randn(n, heads, position, d_head) for _ in range(2 * layers)), torch.arange(n).view(batch, beam),
            torch.zeros(batch, beam, dtype=torch.long))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 1])
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--source", type=int, default=20)
    ap.add_argument("--position", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--min-seconds", type=float, default=2.0)
    ap.add_argument("--no-aoti", action="store_true", help="leave AOTInductor out (its compile takes minutes)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tune_cpu()
    torch.manual_seed(1)
    cfg = ModelConfig(d_model=256, n_heads=4, d_ff=1024, encoder_layers=3, decoder_layers=3, positions=PosKind.rel)
    model = build_model(cfg, args.vocab, 0).eval()
    eager = StepGraph(model).eval()
    engines = {"eager": lambda *x: eager(*nest(x, STEP_INPUTS, len(model.decoder_layers)))}
    build = {"eager": 0.0}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        t0 = time.perf_counter()
        engines["onnx"] = OnnxModel(export_onnx(model, Path(tmp) / "onnx"), threads=torch.get_num_threads()).run_step
        build["onnx"] = time.perf_counter() - t0
        if not args.no_aoti:
            t0 = time.perf_counter()
            engines["aoti"] = AotiModel(export_aoti(model, Path(tmp) / "aoti")).run_step
            build["aoti"] = time.perf_counter() - t0
        rows = []
        for batch in args.batches:
            x = inputs(model, batch, args.beam, args.source, args.position)
            row = {"sentences": batch, "hypotheses": batch * args.beam}
            for name, fn in engines.items():
                row[f"{name}_ms"] = median_ms(lambda fn=fn, x=x: fn(*x), args.repeats, args.min_seconds)
            for name in engines:
                row[f"{name}_speedup"] = row["eager_ms"] / row[f"{name}_ms"]
            rows.append(row)
            print(row, flush=True)
    columns = [("sentences", "sentences"), ("hypotheses", "hypotheses"),
               *((f"{n}_ms", f"{n} ms per step") for n in engines),
               *((f"{n}_speedup", f"{n} speed-up") for n in engines if n != "eager")]
    table = markdown_table(rows, columns)
    made = ", ".join(f"{n} {s:.0f} s" for n, s in build.items() if n != "eager")
    fastest = "; ".join(f"at {r['sentences']} sentences {min(engines, key=lambda n, r=r: r[f'{n}_ms'])}" for r in rows)
    hw = hardware(torch.device("cpu"))
    print("\n" + table + f"\n\nartefact build time: {made}")
    if args.out:
        write_json(args.out, {"command": command_line(), "hardware": hw, "settings": vars(args) | {"out": None,
                              "md": None}, "rows": rows, "build_seconds": build})
    if args.md:
        args.md.write_text(
            "# Inference engine candidates (CPU)\n\n"
            f"One decoder step of a 3+3-layer d_model 256 model with per-head relative tables (k = 16), beam "
            f"{args.beam}, {args.source}-token sources, target position {args.position}, vocabulary {args.vocab}: "
            "the median of at least "
            f"{args.repeats} calls and {args.min_seconds} s. Artefact build time (export, or export and compile): "
            f"{made}. Fastest: {fastest}.\n\n- command: `{command_line()}`\n"
            f"- hardware: {hw['cpu']}, {hw['torch_threads']} torch "
            f"threads, torch {hw['torch']}\n- date: {hw['date']} (git {hw['git']})\n\n{table}\n")


if __name__ == "__main__":
    main()
