"""What a translator can ask of the output: a target prefix it must begin with, and phrases it must
contain (lexically constrained decoding), as one explicit value the beam search carries (`Forced`).

**Prefix.** While a sentence's step t is inside its prefix, every row of it may only take prefix[t]:
the search scores the prefix under the model's distribution and continues from it, which is
teacher-forcing the prefix and then searching (tests/test_forced.py holds it to that).

**Constraints** (Hu et al., NAACL 2019, "Improved Lexically Constrained Decoding for Translation and
Monolingual Rewriting": vectorized dynamic beam allocation; fairseq's `--constraints`, whose
fairseq/token_generation_constraints.py this follows). *The rule*: each phrase is met by its own occurrence
in the output; a phrase given n times needs n occurrences; occurrences do not overlap (one output token
serves at most one phrase, so ["a b", "b c"] needs "a b ... b c", and "a b c" meets one of them); `ordered`
adds that the occurrences come in the given order, and nothing else: ordered is unordered with only the
first unmet phrase open. Occurrences are found greedily, left to right, as fairseq's constraint states do:
a beam holds the phrases it has met and one partial match, a path of tokens (as fairseq's trie node) shared
by the open phrases that begin with it (`progress`: a met phrase's length, the path's length for a phrase on
it, 0 for the others). A token that extends the path onto an open phrase advances it; a phrase the path
completes is met there and the path restarts, unless a longer open phrase goes on along it, in which case
the shorter one waits (`pending`) and is met where the path falls off (the deepest one, as fairseq's
rewind; the path's tokens after it are dropped). A token that extends nothing ends the path and may begin
a new one. Equal phrases take one occurrence each (the lowest-numbered unmet one first).

Where this departs from fairseq, on purpose: fairseq's unordered state checks whether it may restart at a
phrase's first token before it lets go of the partial match it abandons, so with ["a b"] it never meets
"a a b" (here it does); fairseq's completed count leaves out a pending phrase while the path goes on
(its bank keeps it; here both do); and fairseq's ordered state, on a mismatch inside a later phrase, goes
back to the first phrase and forgets the ones met (here only the current phrase's partial match drops).

Each step the candidates are the usual 2K best, plus for each live beam the next token of each open
phrase (on the path: its next token; off it: its first) and its own best token. A beam's *bank* is how
many constraint tokens it has met: those of the phrases it holds and its path (fairseq's `bank`; `banks`);
the K beams kept are taken from the banks in turn, most met first, best score first within a bank, so
hypotheses that make progress on the constraints survive beside the best-scoring ones (`allocate`). EOS is
banned while a beam misses a constraint, so every hypothesis that ends with EOS holds all of them. Only at
the step limit, where live beams finish as they stand, can a hypothesis miss one: it then ranks after
every hypothesis that holds them all, and says how many it misses (`Hypothesis.unmet`, a pending phrase
counting as met: the output ends there). The step limit is raised to leave room for the prefix and every
constraint token (with no overlap, each phrase's tokens are its own).

A sentence without constraints in a batch with some gets exactly the plain search's step: its K live
beams and its finishing hypotheses by the search's EOS rule (t2t or fairseq); a batch without any runs
`beam_step` untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

NONE = -1  # padding of prefixes and phrases
# A sentence's constraints bound its search's cost: each phrase raises the step limit, and each step's candidates
# (2K + K(1 + C)) each carry a progress of C phrases. relmt-translate and relmt-serve refuse more than these.
MAX_PHRASES = 16  # phrases per sentence
MAX_PIECES = 64  # sentencepiece pieces per sentence, over all its phrases


def narrow_beam(beam: int, phrases: int) -> str | None:
    """The warning for a beam search of width `beam` over a sentence with `phrases` constraint phrases, None where
    it has room: dynamic beam allocation shares the beam among the banks (Hu et al.), and a beam no wider than the
    phrases leaves none beside the banks that make progress. relmt.decode.translator logs it (for a batch's most
    phrases); relmt-serve returns it in the answer, naming the sentence."""
    if not phrases or beam > phrases:
        return None
    return (f"constraints with beam={beam}: a beam narrower than its sentence's phrases + 1 ({phrases + 1}) has no "
            "room beside the banks that make progress, and output tends to place the phrases at once; use "
            f"beam={max(4, phrases + 1)} or more")


@dataclass(frozen=True)
class Forced:
    """Per sentence (m of them, K beams each): `prefix` (m, P) ids and `phrases` (m, C, L) ids, padded with NONE;
    `lengths` (m, C) tokens per phrase (0: padding); `ordered`; per live beam, `progress` (m*K, C): a met phrase's
    length, for the open phrases on its partial match that match's length, 0 for the others (the module's
    docstring); per finished hypothesis, `pool_unmet` (m, K) the phrases it misses."""

    prefix: Tensor
    phrases: Tensor
    lengths: Tensor
    ordered: bool
    progress: Tensor
    pool_unmet: Tensor

    @property
    def constrained(self) -> bool:
        return self.phrases.shape[1] > 0

    def keep(self, sentences: Tensor) -> Forced:
        k = self.pool_unmet.shape[1]
        return replace(self, prefix=self.prefix[sentences], phrases=self.phrases[sentences],
                       lengths=self.lengths[sentences], progress=self.progress[sentences.repeat_interleave(k)],
                       pool_unmet=self.pool_unmet[sentences])

    def needed(self) -> Tensor:
        """(m,) the fewest tokens an output needs: its prefix, every constraint token and EOS."""
        return (self.prefix != NONE).sum(1) + self.lengths.sum(1) + 1


def padded(rows: Sequence[Sequence[int]], width: int | None = None) -> Tensor:
    width = max((len(r) for r in rows), default=0) if width is None else width
    out = torch.full((len(rows), width), NONE, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
    return out


def make_forced(prefixes: Sequence[Sequence[int]] | None, constraints: Sequence[Sequence[Sequence[int]]] | None,
                ordered: bool, n: int, k: int, device: torch.device) -> Forced | None:
    """The Forced value of n sentences (None: nothing forced): prefixes[i] the ids sentence i's output begins
    with, constraints[i] the id sequences it must contain (empty ones are ignored)."""
    prefixes = [list(p) for p in prefixes] if prefixes is not None else [[] for _ in range(n)]
    constraints = [[list(c) for c in cs if len(c)] for cs in constraints] if constraints is not None else \
        [[] for _ in range(n)]
    if len(prefixes) != n or len(constraints) != n:
        raise ValueError(f"{len(prefixes)} prefixes and {len(constraints)} constraint lists for {n} sentences")
    if not any(prefixes) and not any(constraints):
        return None
    c = max(len(cs) for cs in constraints)
    width = max((len(p) for cs in constraints for p in cs), default=0)
    phrases = torch.stack([padded(cs + [[]] * (c - len(cs)), width) for cs in constraints]) if c else \
        torch.full((n, 0, 0), NONE, dtype=torch.long)
    lengths = (phrases != NONE).sum(2)
    return Forced(padded(prefixes).to(device), phrases.to(device), lengths.to(device), ordered,
                  torch.zeros(n * k, c, dtype=torch.long, device=device),
                  torch.zeros(n, k, dtype=torch.long, device=device))


def inside_prefix(forced: Forced, t: int) -> Tensor:
    """(m,) the sentences whose step t is inside their prefix."""
    return forced.prefix[:, t] != NONE if t < forced.prefix.shape[1] else forced.prefix.new_zeros(
        forced.prefix.shape[0], dtype=torch.bool)


def force_prefix(logits: Tensor, alive: Tensor, forced: Forced, t: int) -> Tensor:
    """Inside a sentence's prefix its rows may only take prefix[t]: every other token of logits (m*K, V) goes to
    -inf, in place, and the live beams' log-probabilities alive (m, K) are returned with log p(prefix[t]) added,
    taken before the masking, so the prefix is scored as teacher forcing scores it."""
    m, k = alive.shape
    inside = inside_prefix(forced, t)
    if not inside.any():
        return alive
    token = forced.prefix[:, t].clamp(min=0).repeat_interleave(k)  # (m*K,)
    logp = logits.gather(1, token[:, None])[:, 0] - torch.logsumexp(logits, dim=1)
    rows = inside.repeat_interleave(k)
    logits.masked_fill_(rows[:, None] & (torch.arange(logits.shape[1], device=logits.device) != token[:, None]),
                        float("-inf"))
    return alive + torch.where(rows, logp, 0.0).view(m, k)


def all_met(forced: Forced, progress: Tensor) -> Tensor:
    """(m*K,) whether each live beam (progress (m*K, C)) holds every phrase: only then may EOS end it."""
    return (progress >= forced.lengths.repeat_interleave(progress.shape[0] // forced.lengths.shape[0], 0)).all(1)


def opened(forced: Forced, met: Tensor) -> Tensor:
    """(..., C) the phrases a beam may match next, of those met (..., C): every unmet one, or with `ordered` the
    first unmet one."""
    if forced.ordered:
        return ~met & (torch.cumsum((~met).int(), -1) == 1)
    return ~met


def path(forced: Forced, progress: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Of progress (..., C) and lengths broadcast to it: the phrases met, open, the partial match's length p
    (..., 1) and the open phrases on it (p == 0: every open one)."""
    met = progress >= lengths
    p = progress.masked_fill(met, 0).amax(-1, keepdim=True) if progress.shape[-1] else progress.sum(-1, True)
    open_ = opened(forced, met)
    return met, open_, p, open_ & (progress == p)


def pending(forced: Forced, progress: Tensor) -> Tensor:
    """(m, N, C) of candidates' progress (m, N, C): the one phrase each would meet where its partial match ends,
    if any: the longest open phrase, lowest-numbered of equal ones, that the path holds whole while a longer one
    goes on along it."""
    lengths = forced.lengths[:, None, :]
    met, open_, p, on = path(forced, progress, lengths)
    phrases, c = forced.phrases, forced.phrases.shape[1]
    inside = torch.arange(phrases.shape[2], device=phrases.device) >= forced.lengths[:, :, None]  # (m, C, L)
    # prefix[i, a, b]: phrase b is a prefix of phrase a (its tokens, where it has them, are a's)
    prefix = ((phrases[:, :, None, :] == phrases[:, None, :, :]) | inside[:, None, :, :]).all(3)
    on_path = (on & (p > 0)).int().argmax(2)  # (m, N) a phrase on the path, whose first p tokens are the path
    held = prefix.gather(1, on_path[:, :, None].expand(-1, -1, c)) & (lengths <= p) & (p > 0) & open_
    key = torch.where(held, lengths * c + torch.arange(c - 1, -1, -1, device=held.device), -1)
    return held & (key == key.amax(2, keepdim=True))


def wanted(forced: Forced) -> Tensor:
    """(m*K, C) the next token each live beam needs of each phrase: of a phrase on its partial match the next
    one, of another open phrase its first, NONE where the phrase is met or, for ordered phrases, not its turn."""
    k = forced.progress.shape[0] // forced.phrases.shape[0]
    phrases = forced.phrases.repeat_interleave(k, 0)  # (m*K, C, L)
    _, open_, p, on = path(forced, forced.progress, forced.lengths.repeat_interleave(k, 0))
    nxt = phrases.gather(2, torch.where(on, p, 0).clamp(max=phrases.shape[2] - 1)[:, :, None])[:, :, 0]
    return nxt.masked_fill(~open_, NONE)


def extend(forced: Forced, before: Tensor, met: Tensor, on: Tensor, p: Tensor, tok: Tensor) -> tuple[Tensor, Tensor]:
    """The progress (m, N, C) after tok (m, N, 1) extends the partial match of length p (m, N, 1) held by the
    phrases `on` (m, N, C), of a beam with progress `before` and phrases met: the phrases it extends that go on
    take p + 1; if none goes on, the first one it completes is met; every unmet other drops to 0. And whether
    it extended any ((m, N, 1) bool)."""
    lengths = forced.lengths[:, None, :]
    phrases = forced.phrases[:, None].expand(-1, tok.shape[1], -1, -1)  # (m, N, C, L)
    nxt = phrases.gather(3, p[..., None].expand(-1, -1, phrases.shape[2], 1).clamp(max=phrases.shape[3] - 1))
    ext = on & (p < lengths) & (nxt[..., 0] == tok)
    longer = ext & (lengths > p + 1)
    whole = ext & (lengths == p + 1) & ~longer.any(2, keepdim=True)
    first = whole & (torch.cumsum(whole.int(), 2) == 1)
    after = torch.where(met, before, torch.where(longer, p + 1, torch.where(first, lengths, 0)))
    return after, ext.any(2, keepdim=True)


def advance(forced: Forced, rows: Tensor, tokens: Tensor) -> Tensor:
    """The progress (m, N, C) of the candidates that extend live beam rows[i, j] (its row of progress) by
    tokens[i, j] (the rule: the module's docstring): a token that extends the partial match advances it (or
    meets the phrase it completes); any other ends it, meeting its pending phrase, and may begin a new one."""
    before = forced.progress[rows]  # (m, N, C)
    lengths, tok = forced.lengths[:, None, :], tokens[:, :, None]
    met, _, p, on = path(forced, before, lengths)
    after, took = extend(forced, before, met, on, p, tok)
    met = met | pending(forced, before)  # the partial match ends here unless the token extended it
    restart = torch.where(met, lengths, 0)
    again, _ = extend(forced, restart, met, opened(forced, met), torch.zeros_like(p), tok)
    return torch.where(took, after, again)


def allocate(scores: Tensor, banks: Tensor, live: Tensor, k: int) -> Tensor:
    """The K candidates (indices into the N, (m, K)) kept live: taken from the banks in turn, the bank with the most
    constraint tokens met first, and within a bank by score (dynamic beam allocation). scores (m, N), banks (m, N)
    int, live (m, N) bool: the candidates that may stay live (not EOS, finite)."""
    m, n = scores.shape
    order = torch.sort(scores.masked_fill(~live, float("-inf")), dim=1, descending=True, stable=True).indices
    sorted_banks = banks.gather(1, order)
    top = int(banks.max()) + 1 if banks.numel() else 1
    onehot = torch.nn.functional.one_hot(sorted_banks, top)  # (m, N, banks)
    rank_sorted = (onehot.cumsum(1) * onehot).sum(2) - 1  # each candidate's place within its bank
    rank = torch.empty_like(rank_sorted).scatter_(1, order, rank_sorted)
    key = (rank * (top + 1) + (top - banks)).masked_fill(~live, torch.iinfo(torch.long).max - 1)
    key = key.masked_fill(~live & torch.isfinite(scores), torch.iinfo(torch.long).max)  # EOS: never live
    return torch.sort(key, dim=1, stable=True).indices[:, :k]


def unique(rows: Tensor, tokens: Tensor, vocab: int) -> Tensor:
    """(m, N) True at the first occurrence of each (row, token) among a sentence's candidates."""
    key = rows * vocab + tokens
    sorted_key, order = torch.sort(key, dim=1, stable=True)
    repeat = torch.cat((torch.zeros_like(sorted_key[:, :1], dtype=torch.bool), sorted_key[:, 1:] == sorted_key[:, :-1]),
                       1)
    return ~torch.zeros_like(repeat).scatter_(1, order, repeat)


def extra_candidates(logits: Tensor, alive: Tensor, forced: Forced, banned: Tensor, eos_id: int, t: int,
                     lse: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The candidates constrained decoding adds to the 2K best (scores, origin beams, tokens; (m, K*(1 + C)) each):
    for each live beam its own best token (not EOS, nor banned) and the next token of each phrase open to it,
    scored log P(prefix) + log p(token) from logits (m*K, V) as the model gives them (before any ban), -inf for
    sentences inside their prefix and for phrases not open; lse (m*K,): each row's logsumexp. A beam's own best
    token is the best of its few top tokens that is neither EOS nor banned."""
    m, k = alive.shape
    lse = lse[:, None]
    top_scores, top = logits.topk(len(banned) + 2, dim=1)  # (m*K, few): one of them is allowed
    allowed = ~torch.isin(top, torch.cat((banned, banned.new_tensor([eos_id]))))
    first = allowed.int().argmax(1, keepdim=True)
    own_scores, own = top_scores.gather(1, first)[:, 0], top.gather(1, first)[:, 0]
    need = wanted(forced)  # (m*K, C)
    need_scores = logits.gather(1, need.clamp(min=0)).masked_fill(need == NONE, float("-inf"))
    scores = (torch.cat((own_scores[:, None], need_scores), 1) - lse + alive.reshape(-1, 1))  # (m*K, 1 + C)
    scores = scores.masked_fill(inside_prefix(forced, t).repeat_interleave(k)[:, None], float("-inf"))
    tokens = torch.cat((own[:, None], need.clamp(min=0)), 1)
    origin = torch.arange(k, device=logits.device).repeat(m)[:, None].expand_as(tokens)
    return scores.reshape(m, -1), origin.reshape(m, -1), tokens.reshape(m, -1)


def banks(forced: Forced, progress: Tensor) -> Tensor:
    """(m, N) each candidate's bank: the tokens of the phrases it has met, plus its partial match (its length: the
    progress of the open phrases on it), as fairseq's ConstraintState counts. Summing every phrase's partial match
    instead would let phrases that begin alike ("the dog", "the cat") hold a bank that "the the the ..." never
    leaves."""
    lengths = forced.lengths[:, None, :]  # (m, 1, C)
    met = progress >= lengths
    partial = progress.masked_fill(met, 0).amax(2) if progress.shape[2] else progress.sum(2)
    return (lengths * met).sum(2) + partial


def select(forced: Forced, best: tuple[Tensor, Tensor, Tensor], extra: tuple[Tensor, Tensor, Tensor], last: Tensor,
           eos_id: int, vocab: int, plain: tuple[Tensor, Tensor]) -> tuple[Tensor, ...]:
    """The constrained step's candidates: the 2K best (`best`: scores, origin beams, tokens, (m, 2K)) and the
    `extra` ones, each (row, token) once. Returns their scores, origins and tokens (m, N), their progress (m, N, C),
    the K kept live ((m, K) indices, `allocate`), those that finish ((m, N) bool: an EOS, which only a beam holding
    every phrase can take, or at the step limit `last` (m, 1) a beam kept live) and the phrases each misses (m, N).
    `plain`: the plain step's choice among the 2K best (kept (m, K), finishing (m, 2K); beam.live_and_finishing,
    by the search's EOS rule), which a sentence without constraints takes, as it would in a batch without any."""
    m = last.shape[0]
    k = forced.pool_unmet.shape[1]
    cand, origin, token = (torch.cat(pair, 1) for pair in zip(best, extra))
    rows = torch.arange(m, device=cand.device)[:, None] * k + origin
    cand = cand.masked_fill(~unique(rows, token, vocab), float("-inf"))
    progress = advance(forced, rows, token)  # (m, N, C)
    is_eos, finite = token == eos_id, torch.isfinite(cand)
    keep = allocate(cand, banks(forced, progress), ~is_eos & finite, k)
    kept = torch.zeros_like(is_eos).scatter_(1, keep, True)
    finishing = finite & (is_eos | (last & kept))
    free = (forced.lengths.sum(1) == 0)[:, None]  # (m, 1): sentences without constraints
    keep = torch.where(free, plain[0], keep)
    finishing = torch.where(free, torch.nn.functional.pad(plain[1], (0, cand.shape[1] - plain[1].shape[1])),
                            finishing)
    return cand, origin, token, progress, keep, finishing, unmet_count(forced, progress)


def unmet_count(forced: Forced, progress: Tensor) -> Tensor:
    """(m, N) the phrases each candidate (progress (m, N, C)) misses if its output ends there, where its pending
    phrase, if any, is met."""
    return (progress < forced.lengths[:, None, :]).sum(2) - pending(forced, progress).sum(2)

