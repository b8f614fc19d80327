"""Stands in for ahocorasick, which only an OpenNMT-py data transform that scripts/peers/onmt_train.py never
uses imports (OpenNMT-py imports every transform at start-up)."""
