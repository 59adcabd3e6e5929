"""`python -m radt train.py ...` is the same as `radt train.py ...`."""

import sys

from radt.cli import main

if __name__ == "__main__":
    sys.exit(main())
