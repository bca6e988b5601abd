"""Execute a notebook of docs/ in a fresh kernel, and compare its outputs.

    python tools/run_notebook.py docs/quickstart.ipynb           # execute, store the outputs
    python tools/run_notebook.py --check docs/quickstart.ipynb   # execute, compare with stored

The site renders the notebook with the outputs stored in it (mkdocs-jupyter,
``execute: false``), so they must be the ones the current code prints:
`make quickstart` stores them, and tests/demo/test_quickstart_notebook.py
executes the notebook again and compares (``differences``).

The kernel is a fresh Jupyter kernel (ipykernel) of the Python running this,
started in the repository root, as Jupyter runs a notebook: cells share one
interpreter and their printed output is captured per cell.  TensorFlow's
C++ log lines (which differ from machine to machine) are kept out of it with
TF_CPP_MIN_LOG_LEVEL=3 in the kernel's environment.
"""
import argparse
import os
import re
import sys

import nbclient
import nbformat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A number in printed output; numbers are compared with a tolerance, the rest exactly.
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def execute(path, timeout=600):
    """The notebook at `path`, executed in a fresh kernel (raises
    nbclient.exceptions.CellExecutionError on the first cell that fails)."""
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                                     record_timing=False,
                                     resources={"metadata": {"path": ROOT}})
    client.execute(env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))  # the kernel's environment
    return notebook


def printed(notebook):
    """[(cell index, [output text, ...])] of the code cells: stdout and results
    (text/plain); stderr (warnings, which vary with the library versions) is
    left out.  An error output is a ValueError: stored notebooks have none."""
    cells = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        texts = []
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                raise ValueError("cell %d has an error output: %s: %s" % (
                    index, output.get("ename"), output.get("evalue")))
            if output.output_type == "stream" and output.name == "stdout":
                texts.append(output.text)
            elif output.output_type in ("execute_result", "display_data"):
                texts.append(output.get("data", {}).get("text/plain", ""))
        cells.append((index, "".join(texts)))
    return cells


def _close(a, b, rtol, atol):
    x, y = float(a), float(b)
    return abs(x - y) <= atol + rtol * abs(y)


def differences(stored, fresh, rtol=0.05, atol=0.02):
    """What differs between two executions' printed output, cell by cell
    (empty if nothing): the same code cells, the same text between the
    numbers, and numbers within `rtol`/`atol` (float summation order differs
    between CPUs, so printed losses may differ in the last digits)."""
    a, b = printed(stored), printed(fresh)
    if [cell for cell, _ in a] != [cell for cell, _ in b]:
        return ["code cells differ: stored %s, fresh %s" % ([c for c, _ in a], [c for c, _ in b])]
    found = []
    for (cell, old), (_, new) in zip(a, b):
        old_words, new_words = _NUMBER.split(old), _NUMBER.split(new)
        old_numbers, new_numbers = _NUMBER.findall(old), _NUMBER.findall(new)
        if old_words != new_words or len(old_numbers) != len(new_numbers) or not all(
                _close(x, y, rtol, atol) for x, y in zip(old_numbers, new_numbers)):
            found.append("cell %d printed\n%s\nbut stored\n%s" % (cell, new, old))
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebook")
    parser.add_argument("--check", action="store_true",
                        help="compare with the stored outputs instead of storing")
    args = parser.parse_args(argv)
    fresh = execute(args.notebook)
    if args.check:
        found = differences(nbformat.read(args.notebook, as_version=4), fresh)
        print("\n\n".join(found) or "%s: the stored outputs are current" % args.notebook)
        return 1 if found else 0
    nbformat.write(fresh, args.notebook)
    print("%s: executed, outputs stored" % args.notebook)
    return 0


if __name__ == "__main__":
    sys.exit(main())
