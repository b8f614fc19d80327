"""relmt-report, read in this order: runs -> aggregate -> paper -> tables, curves -> significance -> verdicts ->
claims -> controls, repeats -> build -> markdown, plots, length; the command is relmt/cli/report.py."""
