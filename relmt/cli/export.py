"""`relmt-export`: a checkpoint as a CTranslate2 model, ONNX graphs, AOTInductor packages or an Argos Translate
package."""

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
    # format=argos (relmt/export/argos.py): the package's language codes (default: data.src and data.tgt) and version
    source_lang: str = ""
    target_lang: str = ""
    package_version: str = "1.0"


def _export(argv: list[str]) -> None:
    args = parse_args(ExportArgs, argv, EXAMPLES["relmt-export"])
    if args.format not in ("ctranslate2", "onnx", "aoti", "argos"):
        raise UserError(f"format={args.format}: the export formats are ctranslate2, onnx, aoti and argos")
    if args.format == "argos":
        return _export_argos(args)
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


def _export_argos(args: ExportArgs) -> None:
    try:
        from relmt.export.argos import decode_differences, export
    except ImportError as e:
        raise UserError(f"format=argos needs the ctranslate2 package ({e}): pip install 'relmt[argos]'") from None
    from relmt import checkpoint
    from relmt.config import from_dict

    out = export(args.checkpoint, args.output, quantization=args.quantization or None, source_lang=args.source_lang,
                 target_lang=args.target_lang, version=args.package_version, force=args.force)
    print(f"exported {args.checkpoint} to {out} (Argos Translate package, {args.quantization or 'float32'}); "
          "install it with argospm install or LibreTranslate, and set ARGOS_CHUNK_TYPE=SPACY")
    differences = decode_differences(from_dict(checkpoint.load(args.checkpoint)["config"]).decode)
    if differences:
        print("note: Argos decodes with beam 4 and length penalty 0.2 (power), not the checkpoint's "
              + ", ".join(differences), file=sys.stderr)


def main() -> None:
    """Console script `relmt-export`."""
    sys.exit(guarded("relmt-export", _export))
