"""relmt-report: run directories in, the paper's tables, claims and plots out.

Read in this order: runs (reading run directories) -> aggregate (seeds: mean ± std) -> paper (the
paper's numbers) -> tables (Tables 1-3, BLEU by length) -> significance (paired bootstrap, seed by
seed) -> curves (validation BLEU against updates) -> claims (verdicts) -> build (groups) -> text,
markdown, plots, length (the length-generalisation report) -> cli (`relmt-report`).
"""
