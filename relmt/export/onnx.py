"""ONNX Runtime as an inference engine of relmt (issue 33): the network runs in onnxruntime, the search stays relmt's.

`export_onnx(model, dir)` writes the two graphs of relmt/export/graphs.py with `torch.onnx.export` (the dynamo
exporter): encoder.onnx and step.onnx, and onnx.json (the shapes the engine needs). `OnnxModel` runs them as a
`GraphModel`, so every search and decoding option works on top of it.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path

import torch
from torch import Tensor

from relmt.errors import UserError
from relmt.export.graphs import STEP_INPUTS, EncoderGraph, GraphModel, StepGraph, examples, flat_names, shape_of
from relmt.model.transformer import Transformer

FILES = ("encoder.onnx", "step.onnx", "onnx.json")
OPSET = 18


class _NoTorchvisionNotice(logging.Filter):
    """torch.onnx's op registry logs "torchvision is not installed. Skipping torchvision::nms" (roi_align,
    roi_pool, deform_conv2d) each time it is built, twice per export: relmt's graphs hold no vision ops."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("torchvision is not installed")


logging.getLogger("torch.onnx._internal.exporter._registration").addFilter(_NoTorchvisionNotice())


@torch.no_grad()
def export_onnx(model: Transformer, directory: str | Path) -> Path:
    """Write encoder.onnx, step.onnx and onnx.json (the shapes the engine needs) into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = model.float().cpu().eval()
    src, step, encoder_dims, step_dims = examples(model)
    with warnings.catch_warnings():  # the exporter's deprecation chatter is not the user's business
        warnings.simplefilter("ignore")
        for name, module, args, dims in (("encoder", EncoderGraph(model), src, encoder_dims),
                                         ("step", StepGraph(model), step, step_dims)):
            program = torch.onnx.export(module, args, dynamic_shapes=dims, dynamo=True, opset_version=OPSET,
                                        optimize=True, verbose=False)
            tmp = directory / f".{name}.onnx.tmp"
            program.save(str(tmp))
            os.replace(tmp, directory / f"{name}.onnx")
    meta = shape_of(model) | {"opset": OPSET}
    (directory / "onnx.json").write_text(json.dumps(meta, indent=2) + "\n")
    return directory



class OnnxModel(GraphModel):
    """An exported model in onnxruntime, with the interface the searches use of a Transformer."""

    def __init__(self, directory: str | Path, threads: int = 0) -> None:
        import onnxruntime as ort

        directory = Path(directory)
        missing = [f for f in FILES if not (directory / f).is_file()]
        if missing:
            raise UserError(f"{directory}: not an ONNX export of relmt (missing {', '.join(missing)})")
        super().__init__(json.loads((directory / "onnx.json").read_text()))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        cpu = ["CPUExecutionProvider"]
        self.encoder = ort.InferenceSession(str(directory / "encoder.onnx"), options, providers=cpu)
        self.step = ort.InferenceSession(str(directory / "step.onnx"), options, providers=cpu)
        self._step_inputs = [i.name for i in self.step.get_inputs()]  # the exporter drops inputs a graph ignores

    def run_encoder(self, src: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return tuple(map(torch.from_numpy, self.encoder.run(None, {"src": src.numpy()})))

    def run_step(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        feed = {name: x.contiguous().numpy() for name, x in zip(flat_names(STEP_INPUTS, self.layers), inputs)}
        return tuple(map(torch.from_numpy, self.step.run(None, {k: feed[k] for k in self._step_inputs})))
