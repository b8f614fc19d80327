"""Stands in for rapidfuzz, which only OpenNMT-py's fuzzymatch transform imports (`from rapidfuzz import fuzz,
process`); scripts/peers/onmt_train.py never uses it."""

fuzz = process = None
