#!/usr/bin/env python
"""Which GEMMs a one-sentence search step should take (issue 76 §3, one at a time): search_small.pt2 compiled with
the weights prepacked for oneDNN (inductor's freezing, as engine=aoti compiles it) against the same graph with
`cpp.weight_prepack` off, where the linear maps go to inductor's C++ GEMM template or ATen's GEMM (MKL), whichever
autotuning picks, and to ATen's GEMM alone; and prepacked with `cpp.enable_concat_linear` (the linear maps that take
one input, such as a layer's query and key-value maps, as one GEMM: fewer calls at 4 rows); and int8, as engine=aoti
quantization=int8 compiles its small graph (int8 weights and activations, `_int_mm`), against torchao's weight-only
int8 (float32 activations times dequantized int8 weights: a quarter of the bytes, no quantizing of the rows). Run it
alone on the machine.

    python scripts/bench/small_rows_gemm.py --out docs/results/engines/small_rows_gemm.json \\
        --md docs/results/engines/small_rows_gemm.md

One sentence's step at beam 4 (scripts/bench/step_profile.py's inputs: --slots slots so far, --source source
tokens), the packages called in turn over --repeats rounds of --calls calls at 1 and 2 threads; the best round
counts. (The C++ template alone cannot compile the graph: the attention's batched products have no template, and
inductor refuses a backend list without ATen for them.)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts/bench"))

from step_profile import step_inputs  # noqa: E402

from relmt.bench import best_per_call, command_line, hardware, markdown_table, page_head, write_json  # noqa: E402
from relmt.decode.translator import Translator  # noqa: E402
from relmt.export.aoti import SMALL_CONFIGS, compile_graph, flat_call  # noqa: E402
from relmt.export.graphs import SearchGraph, search_examples  # noqa: E402
from relmt.export.quantize import UNUSED_ONCE_FROZEN, int8_copy  # noqa: E402

# each variant: the model's weights (float32; int8 as engine=aoti quantization=int8 makes them; int8 weight-only) and
# the inductor configs its graph is compiled with
VARIANTS = {
    "oneDNN, prepacked (engine=aoti)": ("float32", SMALL_CONFIGS),
    "not prepacked: C++ template or ATen, autotuned": ("float32", {**SMALL_CONFIGS, "cpp.weight_prepack": False}),
    "not prepacked: ATen (MKL)": ("float32", {"cpp.weight_prepack": False}),
    "prepacked, and linear maps of one input concatenated": ("float32",
                                                             {**SMALL_CONFIGS, "cpp.enable_concat_linear": True}),
    "int8 weights and activations (engine=aoti quantization=int8)": ("int8", {}),
    "int8 weights only, float32 activations": ("int8 weights", {}),
    "int8 weights only, autotuned": ("int8 weights", SMALL_CONFIGS),
}


def weights(model, kind: str):
    """The model as `kind` (VARIANTS) has it: int8 is relmt/export/quantize.py's copy; int8 weights, torchao's
    weight-only int8 (the product of float32 activations and dequantized int8 weights)."""
    if kind == "float32":
        return model
    if kind == "int8":
        return int8_copy(model)
    import copy

    from torch import nn
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    copied = copy.deepcopy(model).float().eval()
    copied.freeze_projections()
    quantize_(copied, Int8WeightOnlyConfig(),
              filter_fn=lambda m, name: isinstance(m, nn.Linear) and not name.endswith(UNUSED_ONCE_FROZEN))
    return copied


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=Path("/tmp/relmt-peers/r1/relmt-rel/checkpoints/last.pt"))
    ap.add_argument("--slots", type=int, default=10)
    ap.add_argument("--source", type=int, default=20)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    model = Translator.from_checkpoint(args.checkpoint, device="cpu", engine="torch").model.float().eval()
    inputs = step_inputs(model, args.slots, args.source)
    names = list(VARIANTS)
    with tempfile.TemporaryDirectory(prefix="small-rows-gemm-") as tmp, torch.no_grad():
        runs, seconds = {}, {}
        for i, name in enumerate(names):
            kind, configs = VARIANTS[name]
            variant = weights(model, kind)
            path = Path(tmp) / f"v{i}.pt2"
            seconds[name] = compile_graph(SearchGraph(variant).eval(), *search_examples(variant, "few"), path, configs)
            runs[name] = flat_call(path)
        ref = runs[names[0]](*inputs)
        diffs = {name: max(float((a.float() - b.float()).abs().max()) for a, b in zip(ref, runs[name](*inputs))
                           if a.numel() and a.is_floating_point()) for name in names[1:]}
        same_ids = {name: all(torch.equal(a, b) for a, b in zip(ref, runs[name](*inputs)) if not a.is_floating_point())
                    for name in names[1:]}
        rows = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            best = best_per_call({name: (lambda run=run: run(*inputs)) for name, run in runs.items()}, args.repeats,
                                 args.calls, warmup=20)
            rows += [{"threads": threads, "gemms": name, "us": 1e6 * best[name],
                      "over_onednn": best[name] / best[names[0]], "difference": diffs.get(name, 0.0),
                      "same_ids": "yes" if same_ids.get(name, True) else "no"} for name in names]
    hw = hardware()
    table = markdown_table(rows, [("threads", "threads"), ("gemms", "the step's linear maps"),
                                  ("us", "µs per step"), ("over_onednn", "÷ oneDNN prepacked"),
                                  ("same_ids", "same tokens, rows and done"),
                                  ("difference", "largest score, key or value difference")])
    said = ("The last two columns compare each package's step with the prepacked float32 one's, on the same inputs "
            "(the int8 variants round the weights, so their scores, keys and values move).")
    print(table, said, sep="\n\n")
    payload = {"command": command_line(), "hardware": hw, "checkpoint": str(args.checkpoint), "slots": args.slots,
               "source": args.source, "compile_s": seconds, "rows": rows}
    if args.out:
        write_json(args.out, payload)
    if args.md:
        args.md.write_text(
            page_head("A one-sentence search step: oneDNN's prepacked GEMMs or not (issue 76 §3)", hw,
                      payload["command"]) +
            f"- model: {args.checkpoint}; one sentence's step at beam 4, {args.slots} slots in, {args.source} source "
            f"tokens; search_small.pt2's graph compiled each way; best of {args.repeats} interleaved rounds of "
            f"{args.calls} calls\n\n{table}\n\n{said}\n")


if __name__ == "__main__":
    main()
