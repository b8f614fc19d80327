"""Several corpora with weights (data.source=corpora, data.corpora; docs/data.md, "Several corpora").

An epoch draws as many training pairs as all the corpora hold together, N, and corpus c gives its weight's
share of them: n_c = N w_c / sum(w), rounded by largest remainders so that the n_c add up to N. The shares
of the pairs are the weights' to within one pair; their shares of the tokens follow the corpora's lengths.

Each corpus gives its pairs from an endless stream of its own: random orders of all its pairs, one after
another, the k-th seeded by (seed, corpus, k). Epoch e takes the stream's pairs e n_c to (e + 1) n_c - 1. So
a corpus with a share smaller than its size shows every pair before it shows one twice, continuing where the
last epoch stopped, and one with a larger share repeats its pairs as evenly as it can. An epoch depends only
on (seed, epoch): a resume draws the same pairs, and the batches are cut from them as from one corpus
(relmt/data/batching.py).
"""

from __future__ import annotations

import numpy as np

from relmt.data.dataset import SplitIds
from relmt.errors import UserError


def shares(total: int, weights: list[float]) -> np.ndarray:
    """Pairs per corpus in an epoch of `total` pairs: proportional to the weights, by largest remainders."""
    w = np.asarray(weights, dtype=np.float64)
    exact = total * w / w.sum()
    n = np.floor(exact).astype(np.int64)
    n[np.argsort(-(exact - n), kind="stable")[:total - n.sum()]] += 1
    return n


def stream(members: np.ndarray, seed: int, corpus: int, start: int, count: int) -> np.ndarray:
    """Items start .. start+count-1 of the corpus's endless stream of random orders of `members`."""
    if count == 0:
        return members[:0]
    size = len(members)
    first, last = start // size, (start + count - 1) // size
    orders = [members[np.random.default_rng([seed, corpus, k]).permutation(size)] for k in range(first, last + 1)]
    return np.concatenate(orders)[start - first * size: start - first * size + count]


def take(ids: SplitIds, index: np.ndarray) -> SplitIds:
    """The pairs `index` of `ids` (repeats allowed) as a split of their own."""

    def side(flat: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        starts, lens = offsets[index], offsets[index + 1] - offsets[index]
        new = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(lens, out=new[1:])
        positions = np.repeat(starts - new[:-1], lens) + np.arange(new[-1])
        return flat[positions], new

    src, src_offsets = side(ids.src, ids.src_offsets)
    tgt, tgt_offsets = side(ids.tgt, ids.tgt_offsets)
    return SplitIds(src, src_offsets, tgt, tgt_offsets)


class Mix:
    """The pairs of each epoch, drawn from the corpora by weight (the module's docstring)."""

    def __init__(self, labels: np.ndarray, weights: list[float], names: list[str], seed: int) -> None:
        self.labels, self.names, self.seed = np.asarray(labels), names, seed
        self.members = [np.flatnonzero(self.labels == c) for c in range(len(names))]
        for i, (name, members, w) in enumerate(zip(names, self.members, weights)):
            if w > 0 and len(members) == 0:
                raise UserError(f"data.corpora[{i}] ({name}): weight {w:g}, but none of its training pairs is left "
                                "after the filters (the log says why each was dropped); give it weight 0 or pairs")
        self.per_epoch = shares(len(self.labels), weights)

    def epoch(self, epoch: int) -> np.ndarray:
        """The training pairs (indices, sorted) that epoch `epoch` draws."""
        parts = [stream(m, self.seed, c, epoch * int(n), int(n))
                 for c, (m, n) in enumerate(zip(self.members, self.per_epoch))]
        return np.sort(np.concatenate(parts))

    def plan(self) -> str:
        """Each corpus's pairs per epoch, and how many passes over it that is."""
        return ", ".join(f"{name} {n} pairs ({n / max(len(m), 1):.2f} passes)"
                         for name, n, m in zip(self.names, self.per_epoch, self.members))


def seen(pairs: list[int], tokens: list[int], names: list[str]) -> dict:
    """The realised mix from counts of trained pairs and target tokens per corpus: metrics' `mix`."""
    n_pairs, n_tokens = max(sum(pairs), 1), max(sum(tokens), 1)
    return {name: {"pairs": int(p), "pair_share": p / n_pairs, "tgt_tokens": int(t), "token_share": t / n_tokens}
            for name, p, t in zip(names, pairs, tokens)}


def describe(mix: dict) -> str:
    return "; ".join(f"{name} {m['pair_share']:.1%} of pairs, {m['token_share']:.1%} of target tokens"
                     for name, m in mix.items())
