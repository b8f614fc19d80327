"""relmt-report, read in this order: runs -> aggregate -> paper -> tables -> significance -> verdicts -> claims ->
curves, controls, repeats -> build -> text, markdown, plots, length, tuning -> cli (`relmt-report`)."""
