"""int8 weights for engine=aoti (issue 62; relmt-export format=aoti quantization=int8, engine=aoti
quantization=int8): every linear map of a copy of the model becomes an int8 one with dynamic activation scales,
as CTranslate2's int8 is: the weights quantized once per output channel (symmetric), each activation row at every
call by its own absolute maximum, the product an int8 GEMM (`_int_mm`) accumulated in int32 and scaled back to
float32. torchao's `Int8DynamicActivationInt8WeightConfig` does it (`quantize_`), and AOTInductor compiles the
tensors it leaves into the graphs' native code, so loading the packages needs no torchao.

The attention's computed projections (the scaled W^Q, W^Q|W^K|W^V) and the tied output layer are made modules
first (`Transformer.freeze_projections`): a quantizer reaches modules only. The embeddings, layer norms, the
relative-position tables (Shaw §3, shared or per head) and attention itself stay float32.
"""

from __future__ import annotations

import copy
import logging

from torch import nn

from relmt.errors import UserError
from relmt.model.transformer import Transformer

UNUSED_ONCE_FROZEN = ("q_proj",)  # read by nothing after freeze_projections (the frozen "q" and "qkv" are)
INT8_VERSION = 2  # in the int8 artefacts' key (relmt/export/engines.py): 2, the encoder's W^K|W^V int8 too


def torchao_version() -> str:
    """The installed torchao's version, or a UserError saying how to get it."""
    # its CUDA kernels fail to load on a CPU machine, a warning each, and it registers an enum with torch's pytree
    # the deprecated way: neither is the user's business
    quiet = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        import torchao
    except ImportError as e:
        raise UserError(f"quantization=int8 for aoti quantizes with torchao ({e}): pip install 'relmt[int8]'") \
            from None
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
    return str(torchao.__version__)


def int8_copy(model: Transformer) -> Transformer:
    """A float32 copy of `model` whose linear maps are int8 with dynamic activation scales (the module's
    docstring); `model` itself is left as it was."""
    torchao_version()
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    copied = copy.deepcopy(model).float().cpu().eval()
    copied.freeze_projections()
    quantize_(copied, Int8DynamicActivationInt8WeightConfig(),
              filter_fn=lambda m, name: isinstance(m, nn.Linear) and not name.endswith(UNUSED_ONCE_FROZEN))
    return copied
