"""Exporting trained checkpoints to inference engines (`relmt-export`).

`relmt.export.ctranslate2` writes a CTranslate2 model directory; `relmt.export.decoding` gives the
checkpoint's decoding settings as CTranslate2 options (without importing ctranslate2). Export reads
checkpoints and builds the model; it never imports the trainer.
"""
