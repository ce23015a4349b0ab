"""tfdml's tests, in folders that mirror the package's (`tests/losses/` tests `tfdml/losses/`, ...); a module
of tfdml's top level has its test file here (`tfdml/durable.py`: `tests/test_durable.py`). Helpers shared by
test files (`loss_checks`, `cli_process`, ...) sit here too; independent reference values and the code that
computes them are in `tests/references/`."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's top folder
REFERENCES = os.path.join(ROOT, "tests", "references")
