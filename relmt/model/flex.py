"""The "flex" attention route: Shaw et al.'s relative attention on a fused attention kernel
(FlexAttention, `torch.nn.attention.flex_attention`), with no (B, H, n, m) tensor and no (n, m, d) one.

Shaw §3.3 splits each equation in two terms; here each term gets its own exact computation.

- Logits, eq. (4): e_ij = q_i·k_j + q_i·a^K_ij (q already scaled by 1/sqrt(d_z)), plus a per-head bias
  (ALiBi, T5) where the stack has one. The kernel computes q_i·k_j; a `score_mod` adds the rest:
  q_i·a^K_ij = R[i, clip(j - i, k) + k] with R = q·(w^K)^T, a captured (B, H, n, 2k+1) table (the
  pattern of attention-gym's learnable biases), and the bias read at [h, i, j]. Padding and causality
  are a block mask, so blocks that are masked whole are skipped. The kernel returns
  out_i = sum_j alpha_ij v_j (eq. (3), first term) and lse_i = log sum_j exp(e_ij).
- Values, eq. (3), second term: sum_j alpha_ij a^V_ij = sum_r S_ir w^V_r, where S_ir sums alpha_ij over
  the keys j with label r = clip(j - i, k) + k (Shaw §3.2). Every label but the two at the ends holds one
  key, j = i + r - k with |j - i| < k: its weight alpha_ij = exp(e_ij - lse_i) comes from the band's
  logits, recomputed offset by offset (d = j - i; q_i·k_{i+d} summed over D for all i at once, plus
  R[i, d + k]): O(n·k) memory, never an (n, 2k-1, D) gather. The two end labels are the clipped tails,
  j - i <= -k and j - i >= k: their masses are exp(lse^tail_i - lse_i), with lse^tail the log-sum-exp of
  a kernel pass masked to that tail. The upper tail gets its own pass rather than 1 - band - lower: that
  difference cancels catastrophically when the upper tail is light, while a pass gives every mass to
  relative precision (tests/test_attention_routes.py, test_the_upper_tail_has_its_own_pass). Both passes
  together visit about the blocks of one full pass, since their masks are disjoint. In the decoder the
  upper tail is empty (causality), so it has no pass. Gradients flow through out, every lse and the
  band's logits.

The kernel is pluggable: `flex_core` (FlexAttention; compiled on CUDA, for training and inference alike;
on the CPU torch runs it eagerly, for inference only: there is no backward there) and `dense_core`
(plain torch, the logits written out: a reference on any device, with gradients, to test the
decomposition). FlexAttention has no attention dropout of its own: `Dropped` hashes a keep-mask from each
weight's coordinates, which the kernel's passes and the band recompute alike, at the cost of one more pass.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch._dynamo.exc
import torch._inductor.exc
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, create_block_mask
from torch.nn.attention.flex_attention import flex_attention as _flex_attention

from relmt.dropout import counter_key, counter_threshold, keep_from_key
from relmt.model.positions import RelativePositions

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]  # (score, b, h, q_idx, kv_idx) -> score
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]  # (b, h, q_idx, kv_idx) -> keep
Core = Callable[[Tensor, Tensor, Tensor, ScoreMod | None, MaskMod | None, bool], tuple[Tensor, Tensor]]


def dense_core(q: Tensor, k: Tensor, v: Tensor, score_mod: ScoreMod | None, mask_mod: MaskMod | None,
               need_out: bool = True) -> tuple[Tensor, Tensor]:
    """What FlexAttention computes, written out: (out (B, H, n, D), lse (B, H, n)). score_mod and mask_mod
    get broadcastable index tensors instead of scalars, so the same functions serve both cores. A row
    with every key masked has lse -inf and out 0, as in flex (a causal row whose one key dropout took)."""
    b, h, n, _ = q.shape
    m = k.shape[2]
    idx = [torch.arange(s, device=q.device).view([s if d == i else 1 for d in range(4)])
           for i, s in enumerate((b, h, n, m))]  # b (B,1,1,1), h (1,H,1,1), q_idx (1,1,n,1), kv_idx (1,1,1,m)
    scores = torch.matmul(q, k.transpose(-1, -2))  # (B, H, n, m)
    if score_mod is not None:
        scores = score_mod(scores, *idx)
    if mask_mod is not None:
        scores = scores.masked_fill(~mask_mod(*idx), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    if not need_out:
        return q.new_zeros(0), lse
    weights = torch.exp(scores - lse.masked_fill(torch.isneginf(lse), 0.0)[..., None])  # softmax; 0 in empty rows
    return torch.matmul(weights, v), lse


_compiled_flex = None
_FAR = 2**30  # an offset j - i beyond any sequence: the open end of a band


def _scalar(value: int, device: torch.device) -> Tensor:
    """A 0-d int64 tensor on device, filled there: torch.tensor(value, device=cuda) would copy it from the host
    and wait for the stream."""
    return torch.full((), value, dtype=torch.int64, device=device)


def _kernel(q: Tensor) -> Callable:
    """FlexAttention compiled once per process off the CPU (the eager version writes the logits out); eager on
    the CPU (which has no backward) and inside a compiled step (the step compiles it)."""
    global _compiled_flex
    if q.device.type == "cpu" or torch.compiler.is_compiling():
        return _flex_attention
    if _compiled_flex is None:
        _compiled_flex = compile_flex()
    return _compiled_flex


def compile_flex(backend: str | Callable = "inductor") -> Callable:
    """FlexAttention compiled as the route compiles it: with symbolic sizes, one graph serves every batch shape.
    A run still compiles a graph per kernel variant: with and without dropout (training, validation), encoder
    and decoder (a padding mask or causality), and each of those for one sentence alone (torch specialises
    size 1). That is 8, torch's default limit per function, past which it falls back to the unfused kernel:
    the limit is raised to 16."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 16)
    return torch.compile(_flex_attention, dynamic=True, backend=backend)


def flex_core(q: Tensor, k: Tensor, v: Tensor, score_mod: ScoreMod | None, mask_mod: MaskMod | None,
              need_out: bool = True) -> tuple[Tensor, Tensor]:
    """FlexAttention with scale 1 (q is already scaled) and its block mask: (out, lse)."""
    if not torch.is_grad_enabled():  # flex refuses inputs that require grad on the CPU, even under no_grad
        q, k, v = q.detach(), k.detach(), v.detach()
    b, h, n, _ = q.shape
    m = k.shape[2]
    block_mask = None if mask_mod is None else _block_mask(mask_mod, b, n, m, q.device)
    kernel = _kernel(q)
    try:
        out, aux = kernel(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=1.0,
                          return_aux=AuxRequest(lse=True))
    except (torch._dynamo.exc.TorchDynamoException, torch._inductor.exc.InductorError) as e:
        if kernel is _flex_attention:
            raise
        first = next((line for line in str(e).splitlines() if line.strip()), "")
        raise FlexCompileError(f"FlexAttention does not compile here (torch {torch.__version__}): "
                               f"{type(e).__name__}: {first[:300]}") from e
    return out, aux.lse


class FlexCompileError(RuntimeError):
    """The compiled FlexAttention kernel failed to build (relmt.model.routes falls back to chunked under auto)."""


_last_mask: tuple = ()


def _block_mask(mask_mod: MaskMod, b: int, n: int, m: int, device: torch.device) -> BlockMask:
    """create_block_mask, kept for the next call with the same mask_mod object and sizes: with dropout, the passes
    over every key and over the kept ones share the mask (the cache holds the function, so its id stays its own)."""
    global _last_mask
    if torch.compiler.is_compiling():  # inside a compiled step: no state kept between calls
        return create_block_mask(mask_mod, b, None, n, m, device=device)
    key, last = (mask_mod, b, n, m, device), _last_mask  # read once: another thread may replace it meanwhile
    if last[:-1] == key:
        return last[-1]
    mask = create_block_mask(mask_mod, b, None, n, m, device=device)
    _last_mask = (*key, mask)
    return mask


def _keep4(mask: Tensor | None, b: int) -> Tensor | None:
    """A keep-mask broadcastable to (B, 1, n, m) as a 4-d tensor of B rows (a view)."""
    if mask is None:
        return None
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    return mask.expand(b, *mask.shape[1:])


def score_mod_for(r: Tensor | None, bias: Tensor | None, k: int, off: Tensor) -> ScoreMod | None:
    """e_ij = q_i·k_j + R[b, h, i, clip(j - i, k) + k] + bias[h, i, j] (Shaw eq. (4) and a stack's bias);
    query row i is position i + off."""
    if r is None and bias is None:
        return None
    b_at = None if bias is None else _reader(bias)
    # the clip's ends as captured 0-d tensors, not Python ints: compiled with symbolic sizes, an int becomes a
    # symbol and -k an expression, which torch 2.11's kernel lowering cannot capture (it realizes it as a buffer)
    lo, hi = _scalar(-k, off.device), _scalar(k, off.device)

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        if r is not None:
            score = score + r[b, h, q_idx, torch.clamp(kv_idx - q_idx - off, lo, hi) + hi]
        if b_at is not None:
            score = score + b_at(b, h, q_idx, kv_idx)
        return score

    return score_mod


def _reader(bias: Tensor) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """bias[(b,) h, i, j] for a bias of shape (H or 1, n, m) or (B or 1, H or 1, n, m), read in place."""
    if bias.dim() == 3:
        if bias.shape[0] == 1:
            return lambda b, h, i, j: bias[0, i, j]
        return lambda b, h, i, j: bias[h, i, j]
    lead = [bias.shape[0] > 1, bias.shape[1] > 1]
    return lambda b, h, i, j: bias[b if lead[0] else 0, h if lead[1] else 0, i, j]


def mask_mod_for(keep: Tensor | None, causal: bool, off: Tensor, tail: str = "", k: int = 0) -> MaskMod | None:
    """Padding keep-mask (4-d with the batch's B rows, `_keep4`) and causality (key j <= query position
    i + off); `tail` "lower" keeps only j - i <= -k, "upper" only j - i >= k (the clipped labels of Shaw §3.2).

    Causality and the tails are one band lo <= j - i <= hi whose ends are captured tensors, not Python
    values: the compiled kernel guards on the closure's Python values, so the full pass and both tails
    share one compiled graph instead of three (torch's limit is 8 graphs per function, after which it
    falls back to the unfused kernel that writes the logits out)."""
    if keep is None and not causal and not tail:
        return None
    lo = k if tail == "upper" else -_FAR
    hi = min(0 if causal else _FAR, -k if tail == "lower" else _FAR)
    lo_t, hi_t = _scalar(lo, off.device), _scalar(hi, off.device)
    rows = keep is not None and keep.shape[2] > 1

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        d = kv_idx - q_idx - off
        ok = (d >= lo_t) & (d <= hi_t)
        if keep is not None:  # (B, 1, n or 1, m): read at b even for one sentence (no guard on the batch size)
            ok = ok & keep[b, 0, q_idx if rows else 0, kv_idx]
        return ok

    return mask_mod


def band_logits(q: Tensor, k: Tensor, r: Tensor | None, bias: Tensor | None, keep: Tensor | None, causal: bool,
                q_offset: int, kk: int) -> Tensor:
    """e_i,i+d for the offsets |d| < kk, as (B, H, n, 2kk - 1) float32 (or float64), -inf where key i + d is
    absent, padded or in the future. Offset by offset: q_i·k_{i+d} multiplies views of q and k (autograd
    keeps views, not copies), R[i, d + kk] and the bias's diagonal are views too."""
    b, h, n, _ = q.shape
    m = k.shape[2]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    cols = []
    for d in range(-(kk - 1), kk):
        o = q_offset + d  # key j = i + o
        lo, hi = max(0, -o), min(n, m - o)
        if hi <= lo or (causal and d > 0):
            cols.append(q.new_full((b, h, n), float("-inf"), dtype=acc))
            continue
        e = (q[:, :, lo:hi] * k[:, :, lo + o:hi + o]).sum(-1, dtype=acc)  # (B, H, hi - lo)
        if r is not None:
            e = e + r[:, :, lo:hi, d + kk]
        if bias is not None:
            e = e + torch.diagonal(bias, offset=o, dim1=-2, dim2=-1)
        if keep is not None:
            e = e.masked_fill(~torch.diagonal(keep, offset=o, dim1=-2, dim2=-1), float("-inf"))
        cols.append(F.pad(e, (lo, n - hi), value=float("-inf")))
    return torch.stack(cols, dim=-1)


def _mass(lse_part: Tensor, lse: Tensor) -> Tensor:
    """exp(lse_part - lse): the weight of a set of keys; exactly 0 (and gradient 0) where it is empty."""
    empty = torch.isneginf(lse_part)
    return torch.where(empty, 0.0, torch.exp(lse_part.masked_fill(empty, 0.0) - lse))


def flex_attention(q: Tensor, k: Tensor, v: Tensor, rel: RelativePositions | None, bias: Tensor | None,
                   mask: Tensor | None, causal: bool, q_offset: int, core: Core | None = None,
                   p: float = 0.0) -> Tensor:
    """Attention with Shaw's terms and a logits bias through `core`, with attention dropout p. q: (B, H, n, D)
    already scaled; k, v: (B, H, m, D); bias: (H, n, m) or broadcastable to (B, H, n, m); mask: bool keep-mask
    broadcastable to (B, 1, n, m); query row i is position i + q_offset; core: `flex_core` when None.
    Returns (B, H, n, D)."""
    core = core or flex_core
    kk = 0 if rel is None else rel.max_relative_position
    off = _scalar(q_offset, q.device)
    r = None
    if rel is not None and rel.w_k is not None:  # R = q·(w^K)^T, (B, H, n, 2k+1)
        r = _per_label(q, rel.w_k, "bhnd,hrd->bhnr", "bhnd,rd->bhnr").contiguous()  # strides the kernel expects
    keep = _keep4(mask, q.shape[0])
    if bias is not None:
        bias = bias.contiguous()  # T5's is a permuted view; the kernel reads rows of keys
    score_mod = score_mod_for(r, bias, kk, off)
    drop = Dropped.draw(p, q.device) if p > 0 else None
    keys = None if drop is None else drop.keys(q.shape[0], q.shape[1])
    weights = score_mod if drop is None else drop.score_mod(score_mod, keys)  # the logits of the kept keys
    full = mask_mod_for(keep, causal, off)
    out, lse = core(q, k, v, score_mod, full, drop is None)  # every key: validation's kernel, no hashing
    if drop is not None:  # sum_j drop(alpha)_ij v_j = out_kept * (the kept keys' share of the weight) / (1 - p)
        out, lse_kept = core(q, k, v, weights, full, True)
        out = out * (_mass(lse_kept, lse) * drop.scale).to(out.dtype)[..., None]
    if rel is None or rel.w_v is None:
        return out
    if kk == 0:  # one label for every key: S = sum_j drop(alpha)_ij, 1 without dropout
        s = (torch.ones_like(lse) if drop is None else _mass(lse_kept, lse) * drop.scale)[..., None]
    else:
        band_keep = None if keep is None else keep.expand(-1, -1, q.shape[2], -1)  # (B or 1, 1, n, m), a view
        band = band_logits(q, k, r, bias, band_keep, causal, q_offset, kk)
        alpha = torch.exp(band - lse[..., None])  # (B, H, n, 2k - 1): labels 1 .. 2k - 1
        if drop is not None:
            alpha = alpha * drop.band(keys, q.shape[2], q_offset, kk, alpha.dtype)
        _, lse_lower = core(q, k, v, weights, mask_mod_for(keep, causal, off, "lower", kk), False)
        lower = _mass(lse_lower, lse)
        if causal:  # j - i >= k > 0 lies in the future
            upper = torch.zeros_like(lse)
        else:
            _, lse_upper = core(q, k, v, weights, mask_mod_for(keep, causal, off, "upper", kk), False)
            upper = _mass(lse_upper, lse)
        if drop is not None:
            lower, upper = lower * drop.scale, upper * drop.scale
        s = torch.cat((lower[..., None], alpha, upper[..., None]), dim=-1)  # (B, H, n, 2k + 1)
    return out + _per_label(s.to(out.dtype), rel.w_v, "bhnr,hrd->bhnd", "bhnr,rd->bhnd")


class Dropped:
    """Attention dropout that every pass recomputes (relmt.dropout.counter_keep: a (B, H) table of keys, then one
    hash per weight): a kernel pass gives the dropped keys -inf, and the band reads the same keep-mask.
    With lse the log-sum-exp over every key and lse_kept over
    the kept ones, sum_j keep_ij alpha_ij x_j = exp(lse_kept - lse) * (the kept pass's softmax average of x),
    exactly: so one pass over every key (for lse) and one over the kept keys give eq. (3)'s first term, and the
    tails' masses come from passes over their kept keys. The mask is a new draw of torch's generator each call,
    so seeds and checkpointed RNG state reproduce it, but it is not the mask F.dropout would draw."""

    def __init__(self, seed: Tensor, threshold: int, scale: float) -> None:
        self.seed, self.threshold, self.scale = seed, threshold, scale

    @classmethod
    def draw(cls, p: float, device: torch.device) -> Dropped:
        threshold, scale = counter_threshold(p)
        return cls(torch.randint(0, 2**32, (), device=device), threshold, scale)

    def keys(self, b: int, h: int) -> Tensor:
        """The (B, H) table of relmt.dropout.counter_key: the kernels read it, and hash only the positions."""
        device = self.seed.device
        return counter_key(self.seed, torch.arange(b, device=device)[:, None], torch.arange(h, device=device))

    def score_mod(self, score_mod: ScoreMod | None, keys: Tensor) -> ScoreMod:
        """score_mod, then -inf for the dropped keys; keys: `keys(B, H)`."""
        threshold = _scalar(self.threshold, self.seed.device)  # a tensor: no guard on its value

        def dropped(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            if score_mod is not None:
                score = score_mod(score, b, h, q_idx, kv_idx)
            return torch.where(keep_from_key(keys[b, h], threshold, q_idx, kv_idx), score, float("-inf"))

        return dropped

    def band(self, keys: Tensor, n: int, q_offset: int, kk: int, dtype: torch.dtype) -> Tensor:
        """The keep-mask of the band's keys j = i + q_offset + d, |d| < kk, as 0 or the scale: (B, H, n, 2kk - 1)."""
        i = torch.arange(n, device=keys.device).view(1, 1, n, 1)
        j = i + q_offset + torch.arange(-(kk - 1), kk, device=keys.device)
        return keep_from_key(keys[:, :, None, None], self.threshold, i, j).to(dtype) * self.scale


def _per_label(x: Tensor, table: Tensor, per_head: str, shared: str) -> Tensor:
    """Contract x with a (heads, 2k+1, D) table or one (1, 2k+1, D) table shared by the heads."""
    if table.shape[0] == 1:
        return torch.einsum(shared, x, table[0])
    return torch.einsum(per_head, x, table)
