"""docs/troubleshooting.md cannot go stale: every message it quotes is still
one the product can print.

Each entry of the page (a `###` heading) quotes what the user sees in a
```` ```text ```` block; `…` stands for a value (a number, a name, a path).
The text between two `…` must be made of the product's string literals as
the code puts them together: a piece of one literal, or the end of one
literal, then whole literals, then the start of one (what `StrCat("a", x,
"b")`, `"%s: %s" % (A, B)` or a named constant produce).  The literals are
read from the product's source: the C++ of `core/`, `engine/`, `kernels/`,
`ops/` and the Python of `tf_tpu_emb/` (Python literals after implicit
concatenation, split at their `%` and `{}` fields; C++ literals after
adjacent ones are joined).  A block titled "TensorFlow's message" quotes
TensorFlow itself (the `Op type not registered` a SavedModel gives where the
library is not loaded): its text may also use the strings of TensorFlow's
framework library.  Any piece that no longer occurs fails here, naming the
entry."""
import ast
import bisect
import functools
import importlib.util
import pathlib
import re

import pytest
import harness  # tests/common: ROOT

ROOT = pathlib.Path(harness.ROOT)
PAGE = ROOT / "docs" / "troubleshooting.md"
PLACEHOLDER = "…"
TF_TITLE = "TensorFlow's message"
MIN_ENTRIES = 14

# ------------------------------------------------------------------ the page

_FENCE = re.compile(r"^```text(?P<info>[^\n]*)\n(?P<body>.*?)^```\s*$", re.S | re.M)


def entries(text):
    """[(heading, [(message, from_tensorflow)])] of the page's `###` entries;
    a message's lines are joined with one space."""
    out = []
    for chunk in re.split(r"^### ", text, flags=re.M)[1:]:
        heading, _, body = chunk.partition("\n")
        body = re.split(r"^#{1,2} ", body, flags=re.M)[0]  # up to the next section
        messages = [(" ".join(line.strip() for line in m.group("body").splitlines()
                              if line.strip()),
                     TF_TITLE in m.group("info"))
                    for m in _FENCE.finditer(body)]
        out.append((heading.strip(), messages))
    return out


# ------------------------------------------------------------ the literals

_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\d+|\*)?(?:\.\d+)?[sdrfgiuxXeEc]")
_BRACES = re.compile(r"(?<!\{)\{[^{}]*\}(?!\})")


def _python_pieces(source):
    """The constant pieces of a module's string literals: implicit
    concatenation joined (ast does it), split at %-fields and {}-fields,
    f-strings' constant parts."""
    pieces = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for part in _PERCENT.split(node.value):
                for sub in _BRACES.split(part):
                    pieces.append(sub.replace("%%", "%").replace("{{", "{").replace("}}", "}"))
        elif isinstance(node, ast.JoinedStr):
            pieces.extend(v.value for v in node.values
                          if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return pieces


_CPP_TOKEN = re.compile(
    r'//[^\n]*|/\*.*?\*/|'                  # comments
    r"'(?:\\.|[^'\\\n])*'|"                 # character literals
    r'"((?:\\.|[^"\\\n])*)"', re.S)         # string literals
_CPP_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "'": "'", "\\": "\\"}


def _cpp_pieces(source):
    """A C++ file's string literals, adjacent literals ("a" "b") joined."""
    pieces, current, last_end = [], None, None
    for m in _CPP_TOKEN.finditer(source):
        if m.group(1) is None:
            if m.group(0).startswith(("//", "/*")) and current is not None:
                continue  # a comment between two adjacent literals
            if current is not None:
                pieces.append(current)
                current = None
            continue
        text = re.sub(r"\\(.)", lambda e: _CPP_ESCAPES.get(e.group(1), e.group(0)), m.group(1))
        gap = re.sub(r"//[^\n]*|/\*.*?\*/", "", source[last_end:m.start()], flags=re.S)
        if current is not None and gap.strip() == "":
            current += text
        else:
            if current is not None:
                pieces.append(current)
            current = text
        last_end = m.end()
    if current is not None:
        pieces.append(current)
    return pieces


def product_sources(root=ROOT):
    """The product's source files: the package's Python, the library's C++."""
    files = sorted((root / "tf_tpu_emb").rglob("*.py"))
    for folder in ("core", "engine", "kernels", "ops"):
        files += sorted(p for p in (root / folder).rglob("*") if p.suffix in (".h", ".cc"))
    return files


@functools.lru_cache(maxsize=None)
def product_pieces():
    pieces = set()
    for path in product_sources():
        text = path.read_text()
        pieces.update(_python_pieces(text) if path.suffix == ".py" else _cpp_pieces(text))
    return frozenset(p for p in pieces if p)


@functools.lru_cache(maxsize=None)
def tensorflow_pieces():
    """The printable strings of TensorFlow's framework library (where its op
    registry's messages live)."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("TensorFlow is not installed")
    folder = pathlib.Path(list(spec.submodule_search_locations)[0])
    libraries = sorted(folder.glob("libtensorflow_framework.so*"))
    assert libraries, "no libtensorflow_framework.so under %s" % folder
    data = libraries[0].read_bytes()
    return frozenset(s.decode("ascii") for s in re.findall(rb"[\x20-\x7e]{4,}", data))


# ---------------------------------------------------------------- matching

class _Index:
    """The pieces, for the three questions `composed` asks: is a text inside
    one piece, the end of one, the start of one (sorted lists: a prefix or a
    reversed suffix is found by bisection).  Whitespace runs count as one
    space and case is ignored (a message may capitalise a constant)."""

    def __init__(self, pieces):
        norm = {_normal(p) for p in pieces} - {""}
        self.whole = norm
        self.joined = "\x00".join(sorted(norm))
        self.starts = sorted(norm)
        self.ends = sorted(p[::-1] for p in norm)

    def inside(self, text):
        return text in self.joined

    @staticmethod
    def _prefix_of_one(sorted_pieces, text):
        i = bisect.bisect_left(sorted_pieces, text)
        return i < len(sorted_pieces) and sorted_pieces[i].startswith(text)

    def starts_one(self, text):
        return self._prefix_of_one(self.starts, text)

    def ends_one(self, text):
        return self._prefix_of_one(self.ends, text[::-1])


def _normal(text):
    return re.sub(r"\s+", " ", text).lower()


def composed(text, index):
    """Whether `text` is a substring of one piece, or the end of one piece +
    whole pieces + the start of one."""
    text = _normal(text)
    if not text or index.inside(text):
        return True
    n = len(text)

    @functools.lru_cache(maxsize=None)
    def rest(i):  # text[i:] = whole pieces* + the start of a piece
        if index.starts_one(text[i:]):
            return True
        return any(text[i:j] in index.whole and rest(j) for j in range(i + 1, n))

    return any(index.ends_one(text[:i]) and rest(i) for i in range(1, n))


def stale(message, index):
    """The pieces of `message` (split at the placeholder) the code cannot produce."""
    return [part for part in (p.strip() for p in message.split(PLACEHOLDER))
            if part and not composed(part, index)]


@functools.lru_cache(maxsize=None)
def _indexes():
    ours = product_pieces()
    return _Index(ours), ours


def _tensorflow_index():
    return _Index(_indexes()[1] | tensorflow_pieces())


def _check(message, from_tensorflow):
    return stale(message, _tensorflow_index() if from_tensorflow else _indexes()[0])


ENTRIES = entries(PAGE.read_text()) if PAGE.exists() else []


# ------------------------------------------------------------------- tests

def test_the_page_has_its_entries_each_quoting_a_message():
    assert len(ENTRIES) >= MIN_ENTRIES, [h for h, _ in ENTRIES]
    assert [h for h, messages in ENTRIES if not messages] == [], \
        "entries without a ```text message block"
    headings = [h for h, _ in ENTRIES]
    assert len(set(headings)) == len(headings), "two entries with one heading"


@pytest.mark.parametrize("entry", ENTRIES, ids=[h[:60] for h, _ in ENTRIES])
def test_every_quoted_message_is_one_the_code_prints(entry):
    heading, messages = entry
    for message, from_tensorflow in messages:
        assert PLACEHOLDER in message or len(message) >= 20, (heading, message)
        missing = _check(message, from_tensorflow)
        assert missing == [], "%r quotes text the %s no longer has: %r" % (
            heading, "TensorFlow library" if from_tensorflow else "product source", missing)


def test_a_changed_message_is_caught():
    """The check can fail: each entry's first message with one word changed,
    or with a piece of the code's text left out, is reported."""
    caught = 0
    for heading, messages in ENTRIES:
        message, from_tensorflow = messages[0]
        words = [w for w in re.findall(r"[A-Za-z]{5,}", message)]
        assert words, heading
        word = max(words, key=len)
        mutant = message.replace(word, word[::-1] + "x", 1)
        assert _check(mutant, from_tensorflow) != [], (heading, mutant)
        caught += 1
    assert caught == len(ENTRIES) >= MIN_ENTRIES


def test_the_literal_readers(tmp_path):
    """The source readers against hand-written cases."""
    cpp = ('return Err(absl::StrCat(op, ": the table ", name, " is "\n'
           '    "too big" /* why */ " here", \'"\'));  // "not this"\n')
    assert _cpp_pieces(cpp) == [": the table ", " is too big here"]
    py = ('x = ("abc %s de" "f {name} g %%" % 1)\n'
          'y = f"pre {x} post"\n')
    assert set(_python_pieces(py)) >= {"abc ", " def ", " g %", "pre ", " post"}
    index = _Index({"embedding host", " is unreachable: ", "start it with `srv`"})
    assert composed("host is unreachable: start it", index)
    assert not composed("host is reachable: start it", index)
    assert stale("embedding host … is unreachable: …", index) == []
    assert stale("embedding host … is gone: …", index) == ["is gone:"]
    assert composed("Start it with `srv`", index)  # a capitalised constant

