"""`python -m sdq.experiments ...`: the same as `sdq experiments ...`."""

import sys

from sdq.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["experiments", *sys.argv[1:]]))
