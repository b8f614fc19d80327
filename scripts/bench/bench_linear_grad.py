"""The backward of relmt's CPU linear map (relmt/model/linear.py) when the loss reduces its output directly, so
that autograd hands it an expanded (stride-0) gradient, against the same backward with a dense gradient: issue 69
defect 8, where oneDNN given the expanded operand took about 750x longer at (4096, 512).

    python scripts/bench/bench_linear_grad.py --out docs/results/performance/linear_grad_cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from relmt.bench import command_line, hardware, write_json  # noqa: E402
from relmt.model.linear import linear, use_cpu_gemm  # noqa: E402


def seconds(x: torch.Tensor, w: torch.Tensor, expanded: bool, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        x.grad = w.grad = None
        out = linear(x, w)
        t0 = time.perf_counter()
        if expanded:
            out.sum().backward()  # the gradient is ones, expanded from one element
        else:
            out.backward(torch.ones_like(out))  # the same values, dense
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--features", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    x = torch.randn(args.rows, args.features, requires_grad=True)
    w = torch.randn(args.features, args.features, requires_grad=True)
    with use_cpu_gemm("onednn"):
        seconds(x, w, True, 1)  # warm
        expanded, dense = seconds(x, w, True, args.repeats), seconds(x, w, False, args.repeats)
    result = {"command": command_line(), "hardware": hardware(), "shape": [args.rows, args.features],
              "expanded_s": expanded, "dense_s": dense, "ratio": expanded / dense}
    print(json.dumps(result, indent=1))
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
