"""Runs the README's Concepts example as written (600 steps) and prints its metrics as JSON, to compare with
`tfdml train` (the main job it mirrors; `tests/test_readme.py` checks the two build the same model, loss,
optimizer and batches, with 2 steps).

    python scripts/readme_example.py
"""

import contextlib
import io
import json
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's tfdml, not an installed one
README = os.path.join(ROOT, "README.md")


def concepts_code():
    with open(README) as f:
        text = f.read()
    section = re.search(r"^## Concepts\n(.*?)(?=^## )", text, flags=re.S | re.M).group(1)
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return code


def main():
    code = concepts_code()
    code = code.replace("model.fit(train,", "model.fit(train, verbose=0,")  # no progress bar in the JSON
    names, printed = {}, io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md (Concepts)", "exec"), names)
    seconds = time.perf_counter() - started
    import tfdml

    assert os.path.dirname(os.path.dirname(os.path.abspath(tfdml.__file__))) == ROOT
    metrics = tfdml.retrieval.evaluate(
        names["embeddings"], names["labels"], ks=(1, 2, 4, 8), metrics=("recall", "map@r", "r_precision")
    )
    print(
        json.dumps(
            {"readme_example": {k: round(float(v), 4) for k, v in metrics.items()}, "seconds": round(seconds, 1)}
        )
    )


if __name__ == "__main__":
    main()
