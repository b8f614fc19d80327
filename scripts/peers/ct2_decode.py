#!/usr/bin/env python
"""Beam-search decoding with a CTranslate2 model directory, timed, for scripts/peers/bench_peers.py.

    python scripts/peers/ct2_decode.py --model DIR --src test.src --out hyp.txt --batch 32 \
        --length 20 --compute-type float32 --threads 2

Input is word level (one token per space-separated word); each hypothesis is forced to --length
tokens (min = max decoding length, EOS not counted). Sentences are sorted by length within the
call and cut into batches of --batch sentences, as CTranslate2 does with max_batch_size. Runs in
any environment with ctranslate2 (and sentencepiece for --spm) installed; imports nothing of relmt.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--src", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=0, help="first N sentences only (0 = all)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--lenpen", type=float, default=0.6)
    parser.add_argument("--length", type=int, default=20)
    parser.add_argument("--compute-type", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--spm", type=Path, help="a sentencepiece model to cut the input and join the output "
                        "(relmt-export writes one beside the model); default: split on spaces")
    opts = parser.parse_args()

    import ctranslate2

    translator = ctranslate2.Translator(str(opts.model), device="cpu", compute_type=opts.compute_type,
                                        intra_threads=opts.threads, inter_threads=1)
    lines = opts.src.read_text(encoding="utf-8").splitlines()[: opts.n or None]
    if opts.spm:
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_file=str(opts.spm))
        tokens, join = sp.encode(lines, out_type=str), sp.decode_pieces
    else:
        tokens, join = [line.split() for line in lines], " ".join
    t0 = time.perf_counter()
    results = translator.translate_batch(tokens, max_batch_size=opts.batch, batch_type="examples",
                                         beam_size=opts.beam, length_penalty=opts.lenpen,
                                         min_decoding_length=opts.length, max_decoding_length=opts.length)
    seconds = time.perf_counter() - t0
    opts.out.write_text("\n".join(join(r.hypotheses[0]) for r in results) + "\n", encoding="utf-8")
    print(f"SECONDS {seconds:.6f}")


if __name__ == "__main__":
    main()
