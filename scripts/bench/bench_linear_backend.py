#!/usr/bin/env python
"""An issue-14 lever, measured before it is built in: relmt's beam search with every linear layer
(`F.linear`, so nn.Linear too) computed by oneDNN on weights converted once, against PyTorch's
default CPU GEMM (MKL), on a trained checkpoint. Decodes the first --n lines of --src at 32 sentences
per batch and one at a time (the first 50), beam 4, forced to --length tokens, alternating the two
backends --repeats times, and prints sentences/s and whether the outputs are identical.

    python scripts/bench/bench_linear_backend.py --checkpoint /tmp/relmt-peers/r1/relmt-rel/checkpoints/last.pt \
        --src /tmp/relmt-peers/corpus/test.src --threads 2

(the checkpoint and corpus that scripts/peers/bench_peers.sh leaves in its scratch directory)
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from relmt.bench import hardware
from relmt.decode.translator import Translator
from relmt.runtime import tune_cpu

DEFAULT_LINEAR = F.linear
_converted: dict[tuple, tuple] = {}


def onednn_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear through oneDNN (mkldnn_linear) with the weights converted to its layout once."""
    if torch.is_grad_enabled() or x.dtype != torch.float32:
        return DEFAULT_LINEAR(x, w, b)
    key = (w.data_ptr(), w._version, tuple(w.shape), None if b is None else (b.data_ptr(), b._version))
    if key not in _converted:
        _converted[key] = (w.contiguous().to_mkldnn(), None if b is None else b.contiguous().to_mkldnn())
    wm, bm = _converted[key]
    shape = x.shape
    y = torch._C._nn.mkldnn_linear(x.reshape(-1, shape[-1]).contiguous().to_mkldnn(), wm, bm).to_dense()
    return y.view(*shape[:-1], w.shape[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--length", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    tune_cpu()  # relmt-translate's CPU settings (the Translator API leaves them to its caller)
    translator = Translator.from_checkpoint(opts.checkpoint, device="cpu")
    lines = open(opts.src, encoding="utf-8").read().splitlines()[: opts.n]
    speed: dict[str, list[float]] = {}
    outputs: dict[str, list[str]] = {}
    for _ in range(opts.repeats):
        for backend in ("mkl", "onednn"):
            F.linear = onednn_linear if backend == "onednn" else DEFAULT_LINEAR
            for batch in (32, 1):
                sub = lines if batch == 32 else lines[:50]
                settings = dict(beam=4, lenpen=0.6, min_len=opts.length, max_len_a=0.0, max_len_b=opts.length,
                                max_sentences=batch, max_source_tokens=10 ** 9)
                translator.translate(sub[:2], **settings)
                t0 = time.perf_counter()
                outputs[f"{backend}/{batch}"] = translator.translate(sub, **settings)
                speed.setdefault(f"{backend}/{batch}", []).append(len(sub) / (time.perf_counter() - t0))
    F.linear = DEFAULT_LINEAR
    result = {"hardware": hardware(), "threads": opts.threads, "sentences_per_s": speed,
              "identical": {b: outputs[f"mkl/{b}"] == outputs[f"onednn/{b}"] for b in (32, 1)}}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
