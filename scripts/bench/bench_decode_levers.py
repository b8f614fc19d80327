#!/usr/bin/env python
"""Issue 14's decoding levers, each measured against plain eager relmt on one checkpoint.

Variants (each a fresh `Translator` from the checkpoint):
- `eager`: relmt as it ships;
- `compile`: `torch.compile(model.decode_step, dynamic=True)`;
- `compile_freezing`: the same with inductor's freezing, which treats the weights as constants and
  prepacks them for oneDNN (what `relmt-translate compile=true` does; relmt/decode/compiled.py);
- `int8_dynamic`: `torch.ao.quantization.quantize_dynamic` on the decoder layers' nn.Linear modules
  (int8 weights, activations quantised per call; the query projection, which relmt calls through
  F.linear with 1/sqrt(d_z) folded in, and the tied output projection stay float32);
- `prealloc_cache`: self-attention keys/values written into reused buffers instead of a new tensor
  at every step (a prototype: `relmt.model.cache.extend` replaced by a pooled version).

`speed`: the first --n lines of --src at --batch sentences per batch and the first --n1 one at a
time, beam 4, every hypothesis forced to --length tokens; the variants alternate --repeats times;
prints sentences/s and whether each variant's outputs equal eager's, and writes --out JSON.
`profile`: eager decoding, timed inside and outside the network, and torch.profiler's top operators
(the per-step Python overhead of beam search at small batches).
`processes`: one process with --threads threads against --threads one-thread processes side by side.
`bleu`: free decoding (the checkpoint's decode config, beam 4, alpha 0.6) of --src against --ref,
sacreBLEU per variant: the BLEU cost of a lever that changes the numbers (int8).

    python scripts/bench/bench_decode_levers.py speed --checkpoint /tmp/relmt-peers/r1/relmt-rel/checkpoints/last.pt \
        --src /tmp/relmt-peers/corpus/test.src --threads 2 --out docs/results/performance/decode_levers.json
    python scripts/bench/bench_decode_levers.py bleu --checkpoint runs/multi30k/t1_rel_s1/checkpoints/last.pt \
        --src ../shared/data/multi30k/test.en --ref ../shared/data/multi30k/test.de --variants eager int8_dynamic

(the first checkpoint and corpus are what scripts/peers/bench_peers.sh leaves in its scratch directory;
the second is a Multi30k run of scripts/reproduce/queues/multi30k_tables.txt)
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import sacrebleu
import torch
from torch import Tensor, nn

import relmt.model.cache as cache_module
import relmt.model.transformer as transformer_module
from relmt.bench import command_line, hardware, write_json
from relmt.decode.compiled import compile_decoding
from relmt.decode.translator import Translator
from relmt.runtime import tune_cpu

ORIGINAL_EXTEND = cache_module.extend
CAPACITY = 64  # target positions a pooled buffer holds; a longer cache falls back to `extend`
_pool: dict[tuple, list[Tensor]] = {}


def pooled_extend(past: Tensor, new: Tensor, order: Tensor | None) -> Tensor:
    """`extend` into a view of a preallocated (rows, H, CAPACITY, D) buffer taken from a pool,
    instead of a new tensor; the past's buffer goes back to the pool (beam search never reads a
    cache again once it has the next one). Two buffers per layer and per K/V ping-pong: the past
    rows are gathered from one into the other, so the copy is the same, only the allocation goes."""
    t, n = past.shape[2], past.shape[2] + new.shape[2]
    if torch.is_grad_enabled() or n > CAPACITY:
        return ORIGINAL_EXTEND(past, new, order)
    shape = (new.shape[0], new.shape[1], CAPACITY, new.shape[3])
    free = _pool.get(shape)
    out = (free.pop() if free else new.new_empty(shape))[:, :, :n]
    if order is None:
        out[:, :, :t] = past
    else:
        torch.index_select(past, 0, order, out=out[:, :, :t])
    out[:, :, t:] = new
    base = past._base
    if base is not None and base.shape[2] == CAPACITY:
        _pool.setdefault(tuple(base.shape), []).append(base)
    return out


def use_extend(fn: Callable) -> None:
    cache_module.extend = transformer_module.extend = fn


def int8_decoder(translator: Translator) -> Translator:
    model = copy.deepcopy(translator.model)
    for m in model.decoder_layers.modules():  # relmt's Linear as torch's own, which quantize_dynamic swaps by type
        if isinstance(m, nn.Linear):
            m.__class__ = nn.Linear
    # q_proj is left out: relmt reads its weight to fold in 1/sqrt(d_z) (MultiHeadAttention.scaled_query_weights)
    names = {name: torch.ao.quantization.default_dynamic_qconfig for name, m in model.decoder_layers.named_modules()
             if isinstance(m, nn.Linear) and not name.endswith("q_proj")}
    model.decoder_layers = torch.ao.quantization.quantize_dynamic(model.decoder_layers, names, dtype=torch.qint8)
    return Translator(model, translator.tokenizer, translator.decode, translator.device, translator.autocast_dtype)


def variant(name: str, checkpoint: str) -> tuple[Translator, Callable[[], None], Callable[[], None]]:
    """A translator for the variant, and what to do before and after it decodes."""
    tune_cpu()  # relmt-translate's CPU settings (the Translator API leaves them to its caller)
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    enter = leave = lambda: None
    if name == "compile":
        translator.model.decode_step = torch.compile(translator.model.decode_step, dynamic=True)
    elif name == "compile_freezing":
        compile_decoding(translator.model)
    elif name == "int8_dynamic":
        translator = int8_decoder(translator)
    elif name == "prealloc_cache":
        def enter() -> None:
            use_extend(pooled_extend)

        def leave() -> None:
            use_extend(ORIGINAL_EXTEND)
            _pool.clear()
    elif name != "eager":
        raise SystemExit(f"unknown variant {name}")
    return translator, enter, leave


VARIANTS = ["eager", "compile", "compile_freezing", "int8_dynamic", "prealloc_cache"]
DEFAULT_VARIANTS = ["eager", "compile", "int8_dynamic", "prealloc_cache"]  # compile_freezing: a run of its own


def speed(opts: argparse.Namespace) -> None:
    if {"compile", "compile_freezing"} <= set(opts.variants):
        # every torch.compile of one function shares its compiled graphs unless isolated, and the
        # isolated one still looks up the shared ones first: the second variant would time the first's
        raise SystemExit("compile and compile_freezing share dynamo's graphs in one process: time them "
                         "in separate runs")
    lines = Path(opts.src).read_text(encoding="utf-8").splitlines()
    modes = {f"{opts.batch}/batch": (lines[: opts.n], opts.batch), "1 at a time": (lines[: opts.n1], 1)}
    built = {name: variant(name, opts.checkpoint) for name in opts.variants}
    warm: dict[str, float] = {}
    for name, (translator, enter, leave) in built.items():  # compiles happen here
        t0 = time.perf_counter()
        enter()
        for sub, batch in modes.values():
            translator.translate(sub[: 2 * batch], **settings(opts, batch))
        leave()
        warm[name] = time.perf_counter() - t0
    speeds: dict[str, dict[str, list[float]]] = {name: {m: [] for m in modes} for name in built}
    outputs: dict[str, dict[str, list[str]]] = {name: {} for name in built}
    for _ in range(opts.repeats):
        for name, (translator, enter, leave) in built.items():
            enter()
            for mode, (sub, batch) in modes.items():
                t0 = time.perf_counter()
                outputs[name][mode] = translator.translate(sub, **settings(opts, batch))
                speeds[name][mode].append(len(sub) / (time.perf_counter() - t0))
            leave()
    rows = []
    for name in built:
        row = {"variant": name, "warmup_s": round(warm[name], 1)}
        for mode in modes:
            row[mode] = sum(speeds[name][mode]) / len(speeds[name][mode])
            row[f"{mode} vs eager"] = row[mode] / (sum(speeds["eager"][mode]) / len(speeds["eager"][mode])) \
                if "eager" in speeds else None
            row[f"{mode} same as eager"] = outputs[name][mode] == outputs.get("eager", {}).get(mode)
        rows.append(row)
    result = {"command": command_line(), "hardware": hardware(), "threads": opts.threads,
              "checkpoint": opts.checkpoint, "length": opts.length, "repeats": opts.repeats,
              "sentences_per_s": speeds, "rows": rows}
    for row in rows:
        print(json.dumps(row))
    if opts.out:
        write_json(opts.out, result)


def settings(opts: argparse.Namespace, batch: int) -> dict:
    return dict(beam=4, lenpen=0.6, min_len=opts.length, max_len_a=0.0, max_len_b=opts.length,
                max_sentences=batch, max_source_tokens=10 ** 9)


def bleu(opts: argparse.Namespace) -> None:
    src = Path(opts.src).read_text(encoding="utf-8").splitlines()
    ref = Path(opts.ref).read_text(encoding="utf-8").splitlines()
    rows = []
    for name in opts.variants:
        translator, enter, leave = variant(name, opts.checkpoint)
        enter()
        t0 = time.perf_counter()
        hyp = translator.translate(src, beam=4, lenpen=0.6)
        seconds = time.perf_counter() - t0
        leave()
        metric = sacrebleu.BLEU()
        score = metric.corpus_score(hyp, [ref])
        chrf = sacrebleu.corpus_chrf(hyp, [ref]).score
        rows.append({"variant": name, "bleu": round(score.score, 2), "chrf": round(chrf, 2),
                     "seconds": round(seconds, 1), "signature": str(metric.get_signature())})
        print(json.dumps(rows[-1]))
    if opts.out:
        write_json(opts.out, {"command": command_line(), "hardware": hardware(), "threads": opts.threads,
                              "checkpoint": opts.checkpoint, "src": opts.src, "ref": opts.ref, "rows": rows})


def profile(opts: argparse.Namespace) -> None:
    """Where the time of eager decoding goes, one sentence at a time and --batch per batch: the share
    inside `decode_step` (the network), in `encode`, and in the search around them (beam
    bookkeeping, per-step Python), then torch.profiler's top operators by self time."""
    lines = Path(opts.src).read_text(encoding="utf-8").splitlines()
    translator = Translator.from_checkpoint(opts.checkpoint, device="cpu")
    model = translator.model
    spent = {"decode_step": 0.0, "encode": 0.0}
    calls = {"decode_step": 0}

    def timed(name: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            spent[name] += time.perf_counter() - t0
            calls[name] = calls.get(name, 0) + 1
            return out
        return wrapper

    model.decode_step, model.encode = timed("decode_step", model.decode_step), timed("encode", model.encode)
    result = {"command": command_line(), "hardware": hardware(), "threads": opts.threads,
              "checkpoint": opts.checkpoint, "length": opts.length, "modes": {}}
    modes = (("1 at a time", lines[: opts.n1], 1), (f"{opts.batch}/batch", lines[: opts.n], opts.batch))
    for mode, sub, batch in modes:
        translator.translate(sub[: 2 * batch], **settings(opts, batch))
        for key in spent:
            spent[key] = 0.0
        calls["decode_step"] = 0
        t0 = time.perf_counter()
        translator.translate(sub, **settings(opts, batch))
        total = time.perf_counter() - t0
        row = {"sentences": len(sub), "seconds": total, "sentences_per_s": len(sub) / total,
               "steps": calls["decode_step"], "ms_per_step": 1000 * total / calls["decode_step"],
               "share_decode_step": spent["decode_step"] / total, "share_encode": spent["encode"] / total,
               "share_search": 1 - (spent["decode_step"] + spent["encode"]) / total}
        with torch.profiler.profile() as prof:
            translator.translate(sub[: max(batch, 10)], **settings(opts, batch))
        ops = prof.key_averages()
        profiled = sum(e.self_cpu_time_total for e in ops)
        row["top_ops"] = [{"op": e.key, "self_share": e.self_cpu_time_total / profiled, "calls": e.count}
                          for e in sorted(ops, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]]
        result["modes"][mode] = row
        print(mode, json.dumps({k: v for k, v in row.items() if k != "top_ops"}))
        for e in row["top_ops"]:
            print(f"    {e['op']:50s} {100 * e['self_share']:5.1f}%  {e['calls']}")
    if opts.out:
        write_json(opts.out, result)


def part(opts: argparse.Namespace) -> None:
    """(a child of `processes`) load and warm up, say READY, wait for the parent's GO on stdin, decode
    lines [--start, --start + --n) of --src; print when it started and ended."""
    translator = Translator.from_checkpoint(opts.checkpoint, device="cpu")
    lines = Path(opts.src).read_text(encoding="utf-8").splitlines()[opts.start: opts.start + opts.n]
    translator.translate(lines[:2], **settings(opts, opts.batch))
    print("READY", flush=True)
    sys.stdin.readline()
    start = time.time()
    translator.translate(lines, **settings(opts, opts.batch))
    print(f"SPAN {start:.6f} {time.time():.6f}", flush=True)


def processes(opts: argparse.Namespace) -> None:
    """Throughput of the first --n lines at --batch per batch: one process with --threads threads,
    against --threads one-thread processes side by side, each decoding its share. The children load
    and warm up, then all start decoding together when the last is ready; the figure is n over the time from that
    start to the last child's end. Alternated --repeats times."""
    def run(jobs: int, threads: int) -> float:
        share = -(-opts.n // jobs)
        args = ["--checkpoint", opts.checkpoint, "--src", opts.src, "--n", str(share), "--batch", str(opts.batch),
                "--threads", str(threads), "--length", str(opts.length)]
        children = [subprocess.Popen([sys.executable, __file__, "part", "--start", str(i * share), *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in range(jobs)]
        for child in children:  # a barrier: every child has loaded and warmed up before any starts
            if child.stdout.readline().strip() != "READY":
                raise SystemExit(f"a child exited while loading (exit {child.wait()})")
        for child in children:
            child.stdin.write("GO\n")
            child.stdin.flush()
        spans = [[float(x) for x in c.communicate()[0].split("SPAN ")[-1].split()] for c in children]
        return opts.n / (max(end for _, end in spans) - min(start for start, _ in spans))

    speeds: dict[str, list[float]] = {"1 x threads": [], "threads x 1": []}
    for _ in range(opts.repeats):
        speeds["1 x threads"].append(run(1, opts.threads))
        speeds["threads x 1"].append(run(opts.threads, 1))
    result = {"command": command_line(), "hardware": hardware(), "threads": opts.threads, "batch": opts.batch,
              "n": opts.n, "sentences_per_s": speeds,
              "ratio": statistics.median(speeds["threads x 1"]) / statistics.median(speeds["1 x threads"])}
    print(json.dumps(result, indent=1))
    if opts.out:
        write_json(opts.out, result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["speed", "bleu", "profile", "processes", "part"])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", help="bleu: the reference translations of --src")
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=VARIANTS)
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--n1", type=int, default=50)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--length", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path)
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    if opts.what == "bleu" and not opts.ref:
        parser.error("bleu needs --ref")
    {"speed": speed, "bleu": bleu, "profile": profile, "processes": processes, "part": part}[opts.what](opts)


if __name__ == "__main__":
    main()
