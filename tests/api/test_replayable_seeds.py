"""Every test's random data can be replayed: no test seeds with Python's
``hash()``.

``hash()`` of a str or bytes (and of a tuple holding one) is salted per
process (PYTHONHASHSEED), so data seeded by it differ from run to run and a
failure cannot be reproduced.  Seed with explicit ints or a stable digest
(``zlib.crc32(repr(case).encode())``) and put the seed in the assertion
messages.  The scan flags every ``hash(...)`` call in tests/ except the
operands of equality checks (``hash(a) == hash(b)``: a test of ``__hash__``
itself)."""
import ast
import pathlib

import harness  # tests/common: ROOT

TESTS = pathlib.Path(harness.ROOT) / "tests"


def _is_hash_call(node):
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "hash")


def salted_hash_uses(text):
    """(line number, line) of each ``hash(...)`` call that is not an operand
    of an ``==`` / ``!=`` comparison (comments and strings are no calls)."""
    tree = ast.parse(text)
    compared = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and all(
                isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
            compared.update(id(n) for n in [node.left] + node.comparators if _is_hash_call(n))
    lines = text.splitlines()
    return sorted((n.lineno, lines[n.lineno - 1].strip()) for n in ast.walk(tree)
                  if _is_hash_call(n) and id(n) not in compared)


def test_no_test_seeds_with_the_salted_hash():
    this = pathlib.Path(__file__).resolve()
    offenders = ["%s:%d: %s" % (path.relative_to(TESTS.parent), number, line)
                 for path in sorted(TESTS.rglob("*.py")) if path.resolve() != this
                 for number, line in salted_hash_uses(path.read_text())]
    assert offenders == [], ("seeded with Python's salted hash() (not replayable; use explicit "
                             "ints or zlib.crc32 and print the seed):\n" + "\n".join(offenders))


def test_the_scan_sees_a_salted_seed():
    assert salted_hash_uses("rng = np.random.default_rng(hash(name))") == [
        (1, "rng = np.random.default_rng(hash(name))")]
    assert salted_hash_uses("run_case(hash((a, b)) % 2**32, a, b)") != []
    assert salted_hash_uses("np.random.RandomState(hash(case) % 2**32)") != []
    assert salted_hash_uses("assert a == b and hash(a) == hash(b)") == []
    assert salted_hash_uses("seed = zlib.crc32(repr(case).encode())  # not hash(case)") == []
    assert salted_hash_uses("x = rehash(y); obj.hash(z)") == []
