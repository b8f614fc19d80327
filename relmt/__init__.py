"""relmt: Transformer NMT with relative position representations (Shaw et al., NAACL 2018)."""

__version__ = "0.1.0"
