#!/usr/bin/env python
"""Run a console entry point with flush-to-zero and a fixed intra-op thread count, both set before
torch's thread pool starts, so that every toolkit in scripts/peers/bench_peers.py runs under the same
CPU settings as relmt (relmt.runtime.tune_cpu sets flush-to-zero itself).

    python scripts/peers/ftz.py --threads 2 onmt.bin.train:main -config run.yaml

Runs in a peer's virtual environment: it imports only torch and the entry point's module.
"""

import argparse
import importlib
import sys

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("entry", help="module:function, e.g. onmt.bin.train:main")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    torch.set_flush_denormal(True)
    torch.set_num_threads(opts.threads)
    torch.set_num_interop_threads(1)
    module, _, func = opts.entry.partition(":")
    sys.argv = [module] + opts.args
    sys.exit(getattr(importlib.import_module(module), func)())


if __name__ == "__main__":
    main()
