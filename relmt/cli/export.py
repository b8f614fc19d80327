"""`relmt-export`: a checkpoint as a CTranslate2 model, ONNX graphs or AOTInductor packages."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from relmt.cli.common import EXAMPLES, guarded, parse_args
from relmt.errors import UserError


@dataclass
class ExportArgs:
    checkpoint: str = "???"
    output: str = "???"
    format: str = "ctranslate2"
    quantization: str = ""  # a CTranslate2 weight type, or int8 for aoti (onnx writes float32 only); default float32
    max_positions: int = 2048  # rows of the absolute-encoding table: the longest source or target
    force: bool = False  # replace an existing output directory


def _export(argv: list[str]) -> None:
    args = parse_args(ExportArgs, argv, EXAMPLES["relmt-export"])
    if args.format not in ("ctranslate2", "onnx", "aoti"):
        raise UserError(f"format={args.format}: the export formats are ctranslate2, onnx and aoti")
    from relmt.export.engines import Engine, check_quantization

    check_quantization(Engine(args.format), args.quantization)
    if args.format in ("onnx", "aoti"):
        from relmt.export.engines import export_checkpoint

        if args.format == "onnx":
            try:
                import onnxruntime  # noqa: F401
                import onnxscript  # noqa: F401
            except ImportError as e:
                raise UserError(f"format=onnx needs onnx, onnxscript and onnxruntime ({e}): "
                                "pip install 'relmt[onnx]'") from None
        out = export_checkpoint(args.checkpoint, args.output, Engine(args.format), force=args.force,
                                quantization=args.quantization or "float32")
        made = "ONNX: encoder.onnx and step.onnx" if args.format == "onnx" else \
            f"AOTInductor: encoder.pt2, step.pt2 and search.pt2, {args.quantization or 'float32'}"
        print(f"exported {args.checkpoint} to {out} ({made}, for relmt's searches)")
        return
    try:
        from relmt.export.ctranslate2 import export as export_ctranslate2
    except ImportError as e:
        raise UserError(f"format=ctranslate2 needs the ctranslate2 package ({e}): "
                        "pip install 'relmt[export]'") from None
    out = export_ctranslate2(args.checkpoint, args.output, quantization=args.quantization or None,
                 max_positions=args.max_positions, force=args.force)
    print(f"exported {args.checkpoint} to {out} (CTranslate2, {args.quantization or 'float32'})")


def main() -> None:
    """Console script `relmt-export`."""
    sys.exit(guarded("relmt-export", _export))
