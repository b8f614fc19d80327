"""`python -m relmt.serve key=value ...`, the same as the console script relmt-serve."""

from relmt.serve.main import main

main()
