#!/usr/bin/env python
"""HF transformers' MarianMTModel on the peer workload, for scripts/peers/bench_peers.py: training and
beam-search decoding. transformers has no training command for translation, so this is the plain
PyTorch loop of its examples: token batches, Adam with Noam's schedule, label-smoothed cross
entropy (0.1), one log line every --log-every updates with the target tokens they held.

    python scripts/peers/marian.py train --corpus DIR --out DIR --steps 110 --threads 2
    python scripts/peers/marian.py decode --model DIR --src test.src --out hyp.txt --batch 32 --length 20

The model is randomly initialised at the peer size (3+3 layers, d_model 256, 4 heads, FFN 1024,
dropout 0.1, shared embeddings; MarianMTModel has absolute sinusoidal positions only). Runs in the
Marian virtual environment: it imports torch and transformers, never relmt.
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

PAD, EOS, UNK = 0, 1, 2
log = logging.getLogger("marian")


def read_vocab(path: Path) -> dict[str, int]:
    words = [line.split()[0] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {w: i + 3 for i, w in enumerate(words)}


def encode(path: Path, vocab: dict[str, int]) -> list[list[int]]:
    return [[vocab.get(w, UNK) for w in line.split()] + [EOS] for line in path.read_text(encoding="utf-8").splitlines()]


def build(vocab_size: int):
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(vocab_size=vocab_size, d_model=256, encoder_layers=3, decoder_layers=3,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=1024,
                          decoder_ffn_dim=1024, dropout=0.1, attention_dropout=0.1, activation_dropout=0.0,
                          activation_function="relu", max_position_embeddings=512, scale_embedding=True,
                          pad_token_id=PAD, eos_token_id=EOS, forced_eos_token_id=EOS, decoder_start_token_id=PAD,
                          share_encoder_decoder_embeddings=True, tie_word_embeddings=True)
    return MarianMTModel(config)


def token_batches(src: list[list[int]], tgt: list[list[int]], max_padded: int, seed: int) -> list[list[int]]:
    """Length-sorted batches of at most max_padded (source + target) padded tokens, shuffled."""
    order = sorted(range(len(src)), key=lambda i: (len(src[i]), len(tgt[i])))
    batches, batch, width = [], [], 0
    for i in order:
        size = len(src[i]) + len(tgt[i])
        if batch and max(width, size) * (len(batch) + 1) > max_padded:
            batches.append(batch)
            batch, width = [], 0
        batch.append(i)
        width = max(width, size)
    batches.append(batch)
    random.Random(seed).shuffle(batches)
    return batches


def pad(rows: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), PAD, dtype=torch.long)
    for r, row in enumerate(rows):
        out[r, : len(row)] = torch.tensor(row)
    return out


def train(opts: argparse.Namespace) -> None:
    torch.manual_seed(opts.seed)
    vocab = read_vocab(opts.corpus / "vocab.shared")
    src, tgt = encode(opts.corpus / "train.src", vocab), encode(opts.corpus / "train.tgt", vocab)
    model = build(len(vocab) + 3).train()
    d_model, warmup = 256, 4000
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    batches, epoch, step, tokens = [], 0, 0, 0
    while step < opts.steps:
        if not batches:
            batches = token_batches(src, tgt, opts.max_padded_tokens, opts.seed + epoch)
            epoch += 1
        index = batches.pop()
        x, y = pad([src[i] for i in index]), pad([tgt[i] for i in index])
        decoder_in = torch.cat([torch.full((len(index), 1), PAD, dtype=torch.long), y[:, :-1]], dim=1)
        logits = model(input_ids=x, attention_mask=x.ne(PAD), decoder_input_ids=decoder_in).logits
        n = int(y.ne(PAD).sum())
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=PAD,
                               label_smoothing=0.1, reduction="sum")
        step += 1
        for group in optimizer.param_groups:  # Noam: 2 * d^-0.5 * min(step^-0.5, step * warmup^-1.5)
            group["lr"] = 2.0 * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
        optimizer.zero_grad(set_to_none=True)
        (loss / n).backward()
        optimizer.step()
        tokens += n
        if step % opts.log_every == 0:
            log.info("step %d | loss %.3f | %d tgt tokens", step, loss.item() / n, tokens)
            tokens = 0
    opts.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(opts.out)
    (opts.out / "vocab.shared").write_text((opts.corpus / "vocab.shared").read_text(encoding="utf-8"), encoding="utf-8")


def decode(opts: argparse.Namespace) -> None:
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(opts.model).eval()
    vocab = read_vocab(opts.model / "vocab.shared")
    words = {i: w for w, i in vocab.items()}
    src = encode(opts.src, vocab)[: opts.n or None]
    order = sorted(range(len(src)), key=lambda i: -len(src[i]))
    out: list[str] = [""] * len(src)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, len(order), opts.batch):
            index = order[start: start + opts.batch]
            x = pad([src[i] for i in index])
            # min = max new tokens = length + 1: opts.length tokens, then the EOS that generate forces at
            # its last position; PAD (Marian's decoder start) is never a prediction
            ys = model.generate(input_ids=x, attention_mask=x.ne(PAD), num_beams=opts.beam,
                                length_penalty=opts.lenpen, min_new_tokens=opts.length + 1,
                                max_new_tokens=opts.length + 1, forced_eos_token_id=EOS, early_stopping=False,
                                do_sample=False, suppress_tokens=[PAD])
            for i, y in zip(index, ys.tolist()):
                out[i] = " ".join(words.get(t, "<unk>") for t in y if t not in (PAD, EOS))
    seconds = time.perf_counter() - t0
    opts.out.write_text("\n".join(out) + "\n", encoding="utf-8")
    log.info("decoded %d sentences in %.3f s", len(src), seconds)
    print(f"SECONDS {seconds:.6f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("--corpus", type=Path, required=True)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--steps", type=int, default=110)
    t.add_argument("--log-every", type=int, default=10)
    t.add_argument("--max-padded-tokens", type=int, default=8192)
    t.add_argument("--seed", type=int, default=1234)
    d = sub.add_parser("decode")
    d.add_argument("--model", type=Path, required=True)
    d.add_argument("--src", type=Path, required=True)
    d.add_argument("--out", type=Path, required=True)
    d.add_argument("--n", type=int, default=0, help="first N sentences only (0 = all)")
    d.add_argument("--batch", type=int, default=32)
    d.add_argument("--beam", type=int, default=4)
    d.add_argument("--lenpen", type=float, default=0.6)
    d.add_argument("--length", type=int, default=20)
    opts = parser.parse_args()
    torch.set_flush_denormal(True)  # before the thread pool starts, as for every toolkit
    torch.set_num_threads(opts.threads)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(levelname)s] %(message)s")
    train(opts) if opts.command == "train" else decode(opts)


if __name__ == "__main__":
    main()
