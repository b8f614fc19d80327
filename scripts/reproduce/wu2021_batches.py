"""Target tokens per update and updates per epoch: fairseq's batching of Wu et al. (2021)'s Multi30k data
against relmt's of experiment=multi30k_wu2021, to set train.max_padded_tokens (issue 30 §2).

    python scripts/reproduce/wu2021_batches.py --wu ../Revisit-MMT/data/multi30k-en-de [--data ../shared/data/multi30k]

--wu is the data folder of github.com/LividWo/Revisit-MMT (train.en, train.de: lowercased, Moses-tokenized,
BPE'd); --data the Multi30k raw text relmt trains on (default ../shared/data/multi30k: this project's machines).
fairseq (their fork's batch_by_size): examples sorted by (target, source) length, each with its EOS; a batch
grows while its size x the longest of its sources and targets is at most --max-tokens 4096, and is cut to a
multiple of 8 (required_batch_size_multiple); 2 GPUs give 2 batches per update.
"""

import argparse
import json
from pathlib import Path

import numpy as np

from relmt.config import compose
from relmt.data.batching import BatchSampler
from relmt.data.dataset import prepare


def fairseq_batches(src: list[int], tgt: list[int], max_tokens: int = 4096, multiple: int = 8) -> list[list[int]]:
    batches, batch, widest = [], [], 0
    for i in sorted(range(len(src)), key=lambda i: (tgt[i], src[i])):
        width = max(widest, src[i], tgt[i])
        if batch and (len(batch) + 1) * width > max_tokens:
            cut = len(batch) if len(batch) < multiple else len(batch) - len(batch) % multiple
            batches.append(batch[:cut])
            batch = batch[cut:]
            widest = max((max(src[j], tgt[j]) for j in batch), default=0)
        batch.append(i)
        widest = max(widest, src[i], tgt[i])
    return batches + [batch] * bool(batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wu", type=Path, required=True)
    ap.add_argument("--data", default="../shared/data/multi30k")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--budgets", type=int, nargs="+", default=[15360, 16384, 17408])
    args = ap.parse_args()
    src = [len(line.split()) + 1 for line in (args.wu / "train.en").open(encoding="utf-8")]
    tgt = [len(line.split()) + 1 for line in (args.wu / "train.de").open(encoding="utf-8")]
    batches = fairseq_batches(src, tgt)
    per_batch = float(np.mean([sum(tgt[i] for i in b) for b in batches]))
    out = {"fairseq": {"updates_per_epoch": len(batches) / args.gpus,
                       "target_tokens_per_update": args.gpus * per_batch}}
    corpus = prepare(compose(["experiment=multi30k_wu2021", f"data.dir={args.data}"]).data)
    ids = corpus.ids("train")
    for budget in args.budgets:
        sampler = BatchSampler(ids, budget)
        epoch = sampler.epoch(0)
        out[f"relmt {budget}"] = {"updates_per_epoch": len(epoch), "target_tokens_per_update": float(
            np.mean([int(sampler.tgt_lens[b].sum()) + len(b) for b in epoch]))}
    for name, row in out.items():
        print(f"{name:12s} {row['updates_per_epoch']:6.1f} updates per epoch {row['target_tokens_per_update']:8.0f} "
              "target tokens per update")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
