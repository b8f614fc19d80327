"""Exporting trained checkpoints to inference engines (`relmt-export`).

`relmt.export.ctranslate2` writes a CTranslate2 model directory. Export reads checkpoints and
builds the model; it never imports the trainer.
"""
