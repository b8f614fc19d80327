#!/usr/bin/env python
"""Where one-sentence-at-a-time decoding on engine=aoti spends its time (issue 62 §1), at 1 and 2 threads.

Decodes --n sentences of --src one at a time, as bench_peers' "one at a time" regime does (beam 4, every
hypothesis forced to --length tokens), each thread setting in its own process, and splits each sentence's time
into the encoder graph, the search graphs (decoder step and beam step in one call; relmt/export/aoti.py) and
everything else (Python: the search loop, tokenising, detokenising). --variant compiles the graphs again with other
inductor settings into a folder of its own and decodes with those, to test a lever before building it into
relmt/export/aoti.py. Run nothing else meanwhile.

    python scripts/bench/one_sentence.py --checkpoint /tmp/relmt-peers/r1/relmt-rel/checkpoints/last.pt \
        --src /tmp/relmt-peers/corpus/test.src --variant default serial --out /tmp/one_sentence.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# inductor settings of each variant, over relmt/export/aoti.py's own ("default")
VARIANTS = {
    "default": {},
    "serial": {"cpp.threads": 1},  # every elementwise kernel and reduction on one thread; GEMMs still use both
    "threads2": {"cpp.threads": 2},  # compiled for 2 threads whatever the compiling process has
    # a loop is split over the threads only when each thread gets at least min_chunk_size elements (inductor's
    # default 512; relmt/export/aoti.py's MIN_CHUNK since the variants' first run): larger, the step's small
    # elementwise kernels run on one thread, the GEMMs and the output rows on both
    "chunk512": {"cpp.min_chunk_size": 512},
    "chunk4096": {"cpp.min_chunk_size": 4096},
    "chunk16384": {"cpp.min_chunk_size": 16384},
}


def decode(opts: argparse.Namespace) -> None:
    """One process: --threads threads, the --variant's packages; prints a JSON line of timings."""
    import torch

    from relmt.decode.translator import Translator
    from relmt.export.aoti import AotiModel
    from relmt.runtime import tune_cpu

    torch.set_num_threads(opts.threads)
    tune_cpu()
    base = Translator.from_checkpoint(opts.checkpoint, device="cpu")
    model = AotiModel(opts.packages)
    translator = Translator(model, base.tokenizer, base.decode, torch.device("cpu"))
    spent = {"encoder": 0.0, "search": 0.0}
    calls = {"encoder": 0, "search": 0}

    def timed(name, fn):
        def run(*inputs):
            t0 = time.perf_counter()
            out = fn(*inputs)
            spent[name] += time.perf_counter() - t0
            calls[name] += 1
            return out
        return run

    model.encoder = timed("encoder", model.encoder)
    model.run_search = timed("search", model.run_search)
    lines = opts.src.read_text(encoding="utf-8").splitlines()[: opts.n]
    settings = dict(beam=4, lenpen=0.6, min_len=opts.length, max_len_a=0.0, max_len_b=opts.length,
                    max_sentences=1, max_source_tokens=10 ** 9)
    translator.translate(lines[:2], **settings)
    best = None
    for _ in range(opts.repeats):
        for name in spent:
            spent[name], calls[name] = 0.0, 0
        t0 = time.perf_counter()
        for line in lines:
            translator.translate([line], **settings)
        total = time.perf_counter() - t0
        if best is None or total < best["total"]:
            best = {"total": total, **{f"{k}_s": v for k, v in spent.items()}, **{f"{k}_calls": v for k, v in
                                                                                 calls.items()}}
    n = len(lines)
    best |= {"sentences": n, "sentences_per_s": n / best["total"], "threads": opts.threads,
             "other_s": best["total"] - best["encoder_s"] - best["search_s"],
             "ms_per_search_call": 1000 * best["search_s"] / max(best["search_calls"], 1)}
    print("RESULT " + json.dumps(best), flush=True)


def compile_variant(checkpoint: Path, folder: Path, configs: dict) -> None:
    """relmt-export format=aoti's packages (relmt/export/aoti.py), compiled under the variant's inductor settings."""
    import torch

    from relmt.decode.translator import Translator
    from relmt.export.aoti import export_aoti

    model = Translator.from_checkpoint(checkpoint, device="cpu").model
    with torch._inductor.config.patch(configs):
        export_aoti(model, folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--length", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--variant", nargs="+", default=["default"], choices=list(VARIANTS))
    ap.add_argument("--work", type=Path, default=Path("/tmp/relmt-one-sentence"))
    ap.add_argument("--packages", type=Path, help=argparse.SUPPRESS)  # set in the child processes
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    opts = ap.parse_args()
    if opts.packages is not None:
        opts.threads = opts.threads[0]
        return decode(opts)
    rows = []
    for variant in opts.variant:
        folder = opts.work / variant
        if not (folder / "aoti.json").is_file():
            print(f"compiling {variant} ...", flush=True)
            compile_variant(opts.checkpoint, folder, VARIANTS[variant])
        for threads in opts.threads:
            out = subprocess.run([sys.executable, __file__, "--checkpoint", opts.checkpoint, "--src", opts.src,
                                  "--n", str(opts.n), "--length", str(opts.length), "--repeats", str(opts.repeats),
                                  "--threads", str(threads), "--packages", folder],
                                 check=True, capture_output=True, text=True, env=os.environ).stdout
            row = json.loads(out.split("RESULT ", 1)[1]) | {"variant": variant}
            rows.append(row)
            ms = {k: 1000 * row[f"{k}_s"] / row["sentences"] for k in ("encoder", "search", "other")}
            print(f"{variant:9s} {threads} thread(s): {row['sentences_per_s']:6.1f} sentences/s; per sentence "
                  f"{1000 * row['total'] / row['sentences']:.2f} ms: encoder {ms['encoder']:.2f}, search graph "
                  f"{ms['search']:.2f} ({row['ms_per_search_call']:.3f} ms a call), other {ms['other']:.2f}",
                  flush=True)
    from relmt.bench import command_line, hardware

    hw = hardware()
    if opts.out:
        opts.out.write_text(json.dumps({"command": command_line(), "hardware": hw, "rows": rows}, indent=2) + "\n")
    if opts.md:
        table = ["| variant | threads | sentences/s | ms per sentence | encoder | search graph | ms per search call "
                 "| other (Python) |", "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            per = {k: 1000 * r[k] / r["sentences"] for k in ("total", "encoder_s", "search_s", "other_s")}
            table.append(f"| {r['variant']} | {r['threads']} | {r['sentences_per_s']:.1f} | {per['total']:.2f} | "
                         f"{per['encoder_s']:.2f} | {per['search_s']:.2f} | {r['ms_per_search_call']:.3f} | "
                         f"{per['other_s']:.2f} |")
        opts.md.write_text(
            "# One sentence at a time on engine=aoti: where the time goes (CPU)\n\n"
            f"{opts.n} sentences of `{opts.src.name}` decoded one at a time, beam 4, every hypothesis forced to "
            f"{opts.length} tokens (bench_peers' \"one at a time\" regime), each thread setting in its own process, "
            f"the best of {opts.repeats} passes. A sentence's time is split into the encoder graph, the search graph "
            "(the decoder step and the beam search's step in one call per step; relmt/export/aoti.py) and the "
            "rest, Python's. Variants (`VARIANTS` in the script): " + "; ".join(
                f"{name}: {VARIANTS[name] or 'relmt-export format=aoti as it is'}" for name in opts.variant)
            + f".\n\n- command: `{command_line()}`\n- hardware: {hw['cpu']}, {hw['cpu_count']} cores, torch "
            f"{hw['torch']}\n- date: {hw['date']} (git {hw['git']})\n\n" + "\n".join(table) + "\n")

if __name__ == "__main__":
    main()
