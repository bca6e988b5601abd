"""The quickstart notebook (docs/quickstart.ipynb), which the site shows with
the outputs stored in it: it runs headless in a fresh Jupyter kernel of this
Python without an error, and the stored outputs are the ones the current code
prints (tools/run_notebook.py; `make quickstart` stores them).

A kernel rather than the code cells run as a script: the notebook is what
users open in Jupyter and what the site shows, so it is run the way Jupyter
runs it (one interpreter for all cells, each cell's output captured on its
own), by the same code that stores the outputs (nbclient, which nbconvert's
--execute also uses).  It costs ipykernel and nbclient in .venv and a second
or two to start the kernel."""
import os
import sys

import pytest

# .venv has nbformat (NOTEBOOK_REQ); the old-TF lane's venv does not, and
# deselects this file by marker -- without the guard it failed to collect.
nbformat = pytest.importorskip("nbformat", reason="nbformat is in .venv (NOTEBOOK_REQ) only")
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output  # noqa: E402

import harness  # noqa: E402  tests/common: ROOT

sys.path.insert(0, os.path.join(harness.ROOT, "tools"))
import run_notebook  # noqa: E402  tools/run_notebook.py

NOTEBOOK = os.path.join(harness.ROOT, "docs", "quickstart.ipynb")


def _stored():
    return nbformat.read(NOTEBOOK, as_version=4)


def test_stored_notebook_was_executed_top_to_bottom_without_errors():
    """Every code cell ran once, in order, in one kernel, printed something,
    and no output is an error (`printed` raises on one)."""
    notebook = _stored()
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert len(code) >= 5
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    assert all(text.strip() for _, text in run_notebook.printed(notebook))


def test_kernel_is_this_python():
    """The kernel `execute` starts ("python3") is this interpreter's, so the
    notebook runs against the package built in this virtualenv."""
    from jupyter_client.kernelspec import KernelSpecManager
    argv = KernelSpecManager().get_kernel_spec("python3").argv
    same = os.path.realpath(argv[0]) == os.path.realpath(sys.executable)
    assert same or argv[0] == "python", argv


@pytest.mark.system  # a kernel: a child process running TensorFlow
def test_notebook_executes_and_prints_what_is_stored():
    fresh = run_notebook.execute(NOTEBOOK)  # raises CellExecutionError on a failing cell
    assert run_notebook.differences(_stored(), fresh) == [], (
        "docs/quickstart.ipynb's stored outputs are stale: run `make quickstart`")


def _notebook(*texts, error=False):
    notebook = new_notebook(cells=[new_markdown_cell("# A page")])
    for text in texts:
        notebook.cells.append(new_code_cell("print(...)", outputs=[
            new_output("stream", name="stdout", text=text),
            new_output("stream", name="stderr", text="a warning that varies %d" % len(text))]))
    if error:
        notebook.cells[-1].outputs.append(new_output(
            "error", ename="ValueError", evalue="bad", traceback=[]))
    return notebook


def test_differences_tolerate_the_last_digits_and_nothing_else():
    stored = _notebook("epoch 1  mean loss 0.697\n", "max |diff| 1.2e-07\n")
    assert run_notebook.differences(
        stored, _notebook("epoch 1  mean loss 0.698\n", "max |diff| 1.9e-06\n")) == []
    assert run_notebook.differences(   # a loss that is not the stored one
        stored, _notebook("epoch 1  mean loss 0.500\n", "max |diff| 1.2e-07\n"))
    assert run_notebook.differences(   # other words
        stored, _notebook("epoch 1  mean loss 0.697\n", "max |diff| 1.2e-07 (new)\n"))
    assert run_notebook.differences(   # a number more
        stored, _notebook("epoch 1  mean loss 0.697 0.1\n", "max |diff| 1.2e-07\n"))
    assert run_notebook.differences(stored, _notebook("epoch 1  mean loss 0.697\n"))
    with pytest.raises(ValueError, match="error output"):
        run_notebook.printed(_notebook("x\n", error=True))
