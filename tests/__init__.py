"""radt's tests. Imported before conftest.py and anything of radt's, so the setting below reaches every test process.

Compiled modules are kept (__pycache__, and pytest's rewritten test modules) even where the machine's environment says
PYTHONDONTWRITEBYTECODE=1, as a user's shell does not: otherwise each of the suite's ~900 Python processes compiles radt
from source again (~0.06 s a `radt` run) and each worker rewrites every test module (~6 s). The processes the tests start
inherit it.
"""

import os
import sys

os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
