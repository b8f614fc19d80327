"""Compiled decoding for translation (`relmt-translate compile=true`, `Translator(compile=True)`).

`torch.compile` of `Transformer.decode_step`, the per-token step that beam search, sampling and
greedy decoding all call, with two settings:
- dynamic shapes, so one compiled graph serves every target position t and batch size (dynamo still
  specialises sizes 0 and 1, so step 0, step 1 and one sentence at a time each compile once more);
- inductor's freezing: the weights become constants of the graph, which lets inductor fold the
  1/sqrt(d_z) of Shaw eq. (4) into W^Q and prepack every linear layer's weights for oneDNN, the
  GEMM library that CTranslate2 uses on these CPUs (docs/results/performance/perf_log.md, issue 14).

The search itself stays eager Python: the same code, decisions and decoding state as uncompiled
decoding, whose scores it matches up to float rounding (tests/test_compiled.py). Compiling costs
tens of seconds per shape family, so it pays off on large inputs only. Training's validation never
compiles: its weights change between validations.
"""

from __future__ import annotations

import inspect

import torch

from relmt.decode.ensemble import Ensemble
from relmt.model.transformer import Transformer

# Graphs one model may compile before dynamo gives up and runs the step eagerly: steps 0, 1 and
# later ones, each for one sentence and for more, with room to spare. Each model keeps its own count
# (isolate_recompiles): by default every torch.compile of one function shares a single count, 8
# graphs in all, and an ensemble of two would silently decode uncompiled.
GRAPHS_PER_MODEL = 16


def compile_decoding(model: Transformer | Ensemble) -> None:
    """Replace `decode_step` of the model (of each model of an ensemble) by its compiled form."""
    models = model.models if isinstance(model, Ensemble) else [model]
    own_count = "isolate_recompiles" in inspect.signature(torch.compile).parameters  # torch 2.12 and later
    if not own_count:  # torch 2.11: one count for every compile of decode_step, with room for each model's graphs
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, GRAPHS_PER_MODEL * len(models))
    for m in models:
        limits = dict(recompile_limit=GRAPHS_PER_MODEL, isolate_recompiles=True) if own_count else {}
        m.decode_step = torch.compile(m.decode_step, dynamic=True, options={"freezing": True}, **limits)
