"""The porting guide (docs/guides/porting.md): the example TPU script runs on
CPU, and the guide's diff is exactly what separates it from its TPU version."""
import pathlib
import re

import pytest

import harness  # tests/common: the one way to start a child process

ROOT = pathlib.Path(harness.ROOT)
EXAMPLE = ROOT / "examples" / "port_from_tpu.py"
GUIDE = (ROOT / "docs" / "guides" / "porting.md").read_text()
DIFF = re.search(r"```diff\n(.*?)```", GUIDE, re.S).group(1).splitlines()
MARK = "  # ported"


def test_guide_diff_is_the_example():
    """The `+` lines are, in order and contiguous, the example's lines marked
    ``# ported`` (context lines around them included); the TPU version the
    `-` lines make is the same script with TPUStrategy and TF's class."""
    example = EXAMPLE.read_text().splitlines()
    ported = [i for i, line in enumerate(example) if line.endswith(MARK)]
    assert ported and ported == list(range(ported[0], ported[-1] + 1))
    plus = [line[1:] for line in DIFF if line.startswith("+")]
    minus = [line[1:] for line in DIFF if line.startswith("-")]
    context = [line[1:] for line in DIFF if line.startswith(" ")]
    assert plus == [example[i][:-len(MARK)] for i in ported]
    # The diff's context lines sit right around the ported block.
    assert context[0] == example[ported[0] - 2] and context[-1] == example[ported[-1] + 2]
    assert not any(line.endswith(MARK) for line in example if line not in
                   [example[i] for i in ported])
    tpu_version = example[:ported[0]] + minus + example[ported[-1] + 1:]
    text = "\n".join(tpu_version)
    compile(text, "tpu_version.py", "exec")
    assert "tf_tpu_emb" not in text and "TPUStrategy(resolver)" in text
    assert "MirroredStrategy" not in text


@pytest.mark.system
def test_example_runs(tmp_path):
    proc = harness.run_python([str(EXAMPLE), str(tmp_path)], timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(
        proc, 3000, 5000)
    assert list(tmp_path.glob("ckpt-1.index"))
