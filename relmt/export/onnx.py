"""ONNX Runtime as relmt's inference engine (issue 33): the network runs in onnxruntime, the search stays relmt's.

`export_onnx(model, dir)` writes two graphs with `torch.onnx.export` (the dynamo exporter):
- encoder.onnx: source ids (B, S) -> the keep-mask (B, S) and every decoder layer's cross-attention keys and
  values, stacked (L, B, H, S, D): what `Transformer.encode` and `init_cache` compute once per batch;
- step.onnx: one `Transformer.decode_step` on the explicit state: tokens (N,), the keep-mask, the cross keys
  and values, the self-attention keys and values of the t positions so far (L, N', H, t, D) and `order`
  (N,), the stored row each hypothesis continues; it returns the logits (N, V) and the keys and values of
  the t + 1 positions (L, N, H, t + 1, D).
Every position mode goes through the same graphs, since they are traced from the model itself: Shaw's
per-head and shared tables (which CTranslate2 cannot hold), rope, alibi and t5 included.

`OnnxModel` offers what the searches use of a `Transformer` (pad_id, encode, decode_step, eval), with
`OnnxMemory` and `OnnxCache` as its decoding state, so beam search, sampling, n-best, the t2t/fairseq EOS
rules and ensembles run unchanged on top of it.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from relmt.errors import UserError
from relmt.model.cache import DecoderCache, LayerCache
from relmt.model.transformer import Transformer

FILES = ("encoder.onnx", "step.onnx", "onnx.json")
OPSET = 18


class _Encoder(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        memory, keep = self.model.encode(src)
        keys, values = zip(*(layer.cross_attn.project_kv(memory) for layer in self.model.decoder_layers))
        return keep, torch.stack(keys), torch.stack(values)


class _Step(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, keep: Tensor, cross_k: Tensor, cross_v: Tensor, self_k: Tensor,
                self_v: Tensor, order: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # tokens and order come as (B, K), K hypotheses per sentence: N = B * K stays symbolic in the graph
        tokens, order = tokens.reshape(-1), order.reshape(-1)
        layers = tuple(LayerCache(self_k[i], self_v[i], cross_k[i], cross_v[i]) for i in range(self_k.shape[0]))
        memory = keep[:, :, None]  # decode_step reads only its batch size
        logits, cache = self.model.decode_step(tokens, memory, keep, DecoderCache(layers, order), step=self_k.shape[3])
        return (logits, torch.stack([lc.self_k for lc in cache.layers]),
                torch.stack([lc.self_v for lc in cache.layers]))


def _examples(model: Transformer) -> tuple[tuple, tuple, dict, dict]:
    """Inputs to trace with (sizes over 1, so that no dimension is taken for a constant) and the dynamic
    dimensions of each graph."""
    first = model.decoder_layers[0].self_attn
    layers, heads, d_head = len(model.decoder_layers), first.n_heads, first.d_head
    b, k, m, s, t = 2, 3, 4, 5, 3
    src = torch.full((b, s), model.pad_id + 4, dtype=torch.long)
    step = (torch.full((b, k), model.pad_id + 4, dtype=torch.long), torch.ones(b, s, dtype=torch.bool),
            *(torch.randn(layers, b, heads, s, d_head) for _ in range(2)),
            *(torch.randn(layers, m, heads, t, d_head) for _ in range(2)), (torch.arange(b * k) % m).view(b, k))
    big = 1 << 20
    B, K, S, M = (torch.export.Dim(name, min=1, max=big) for name in ("B", "K", "S", "M"))
    T = torch.export.Dim("T", min=0, max=big)
    encoder_dims = {"src": {0: B, 1: S}}
    step_dims = {"tokens": {0: B, 1: K}, "keep": {0: B, 1: S}, "cross_k": {1: B, 3: S}, "cross_v": {1: B, 3: S},
                 "self_k": {1: M, 3: T}, "self_v": {1: M, 3: T}, "order": {0: B, 1: K}}
    return (src,), step, encoder_dims, step_dims


@torch.no_grad()
def export_onnx(model: Transformer, directory: str | Path) -> Path:
    """Write encoder.onnx, step.onnx and onnx.json (the shapes the engine needs) into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = model.float().cpu().eval()
    src, step, encoder_dims, step_dims = _examples(model)
    with warnings.catch_warnings():  # the exporter's deprecation chatter is not the user's business
        warnings.simplefilter("ignore")
        for name, module, args, dims in (("encoder", _Encoder(model), src, encoder_dims),
                                         ("step", _Step(model), step, step_dims)):
            program = torch.onnx.export(module, args, dynamic_shapes=dims, dynamo=True, opset_version=OPSET,
                                        optimize=True, verbose=False)
            tmp = directory / f".{name}.onnx.tmp"
            program.save(str(tmp))
            os.replace(tmp, directory / f"{name}.onnx")
    first = model.decoder_layers[0].self_attn
    meta = {"pad_id": model.pad_id, "layers": len(model.decoder_layers), "heads": first.n_heads,
            "d_head": first.d_head, "vocab": model.tgt_embed.num_embeddings, "opset": OPSET}
    (directory / "onnx.json").write_text(json.dumps(meta, indent=2) + "\n")
    return directory


@dataclass(frozen=True)
class OnnxMemory:
    """The encoder's output as the step graph takes it: cross keys and values (L, B, H, S, D) as numpy."""

    cross_k: np.ndarray
    cross_v: np.ndarray

    @property
    def shape(self) -> tuple[int]:
        return (self.cross_k.shape[1],)  # the batch size, which is what the searches read

    def __getitem__(self, keep: Tensor) -> OnnxMemory:
        rows = keep.nonzero().view(-1).numpy() if keep.dtype == torch.bool else keep.numpy()
        return OnnxMemory(np.take(self.cross_k, rows, axis=1), np.take(self.cross_v, rows, axis=1))


@dataclass(frozen=True)
class OnnxCache:
    """The decoder state between steps: self-attention keys and values (L, N', H, t, D) as numpy, and the
    stored row each hypothesis continues (`order`, None: row b), as `DecoderCache` keeps them."""

    self_k: np.ndarray
    self_v: np.ndarray
    order: Tensor | None = None

    @property
    def length(self) -> int:
        return self.self_k.shape[3]

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> OnnxCache:
        """Hypothesis b becomes what hypothesis rows[b] was; the sentences live in OnnxMemory."""
        order = rows if self.order is None else self.order.index_select(0, rows)
        return OnnxCache(self.self_k, self.self_v, order)


class OnnxModel:
    """An exported model in onnxruntime, with the interface the searches use of a Transformer."""

    training = False

    def __init__(self, directory: str | Path, threads: int = 0) -> None:
        import onnxruntime as ort

        directory = Path(directory)
        missing = [f for f in FILES if not (directory / f).is_file()]
        if missing:
            raise UserError(f"{directory}: not an ONNX export of relmt (missing {', '.join(missing)})")
        meta = json.loads((directory / "onnx.json").read_text())
        self.pad_id, self.layers, self.heads, self.d_head = (meta[k] for k in ("pad_id", "layers", "heads", "d_head"))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        cpu = ["CPUExecutionProvider"]
        self.encoder = ort.InferenceSession(str(directory / "encoder.onnx"), options, providers=cpu)
        self.step = ort.InferenceSession(str(directory / "step.onnx"), options, providers=cpu)
        self._step_inputs = [i.name for i in self.step.get_inputs()]

    def eval(self) -> OnnxModel:
        return self

    def train(self, mode: bool = True) -> OnnxModel:
        return self

    def encode(self, src: Tensor) -> tuple[OnnxMemory, Tensor]:
        keep, cross_k, cross_v = self.encoder.run(None, {"src": src.cpu().numpy()})
        return OnnxMemory(cross_k, cross_v), torch.from_numpy(keep)

    def decode_step(self, tokens: Tensor, memory: OnnxMemory, src_mask: Tensor, cache: OnnxCache | None = None,
                    step: int = 0, out_weight: Tensor | None = None) -> tuple[Tensor, OnnxCache]:
        n = tokens.shape[0]
        if cache is None:
            empty = np.zeros((self.layers, n, self.heads, 0, self.d_head), dtype=np.float32)
            cache = OnnxCache(empty, empty)
        if cache.length != step:
            raise ValueError(f"decode_step(step={step}) got a cache holding {cache.length} positions")
        order = (cache.order if cache.order is not None else torch.arange(n)).numpy()
        b = src_mask.shape[0]
        values = {"tokens": tokens.numpy().reshape(b, -1), "keep": src_mask.numpy(), "cross_k": memory.cross_k,
                  "cross_v": memory.cross_v, "self_k": cache.self_k, "self_v": cache.self_v,
                  "order": order.reshape(b, -1)}
        logits, self_k, self_v = self.step.run(None, {k: values[k] for k in self._step_inputs})
        return torch.from_numpy(logits), OnnxCache(self_k, self_v)


def export_checkpoint(checkpoint_path: str | Path, output_dir: str | Path, force: bool = False) -> Path:
    """relmt-export format=onnx: the checkpoint's two graphs, its sentencepiece.model and relmt_export.json (the
    decode config), written beside `output_dir` and moved into place, so a failed export leaves nothing."""
    import shutil

    from relmt import checkpoint
    from relmt.config import from_dict, to_dict
    from relmt.data.tokenizer import PAD_ID, Tokenizer
    from relmt.export.decoding import INFO_FILE
    from relmt.model.transformer import build_model

    out = Path(output_dir)
    if out.exists() and not force:
        raise UserError(f"output={out}: already exists (give force=true to replace it)")
    ck = checkpoint.load(checkpoint_path)
    cfg = from_dict(ck["config"])
    tokenizer = Tokenizer("sentencepiece.model", model=ck["spm"]["model"])
    model = build_model(cfg.model, tokenizer.vocab_size, PAD_ID)
    checkpoint.load_model_state(model, ck["model"], Path(checkpoint_path))
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        export_onnx(model, tmp)
        (tmp / "sentencepiece.model").write_bytes(tokenizer.model_bytes())
        (tmp / INFO_FILE).write_text(json.dumps({"checkpoint": str(checkpoint_path), "format": "onnx",
                                                 "decode": to_dict(cfg)["decode"]}, indent=2) + "\n")
        if out.is_dir():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
