"""The package's import graph has no cycle (imports inside functions count:
a lazy import that closes a circle is still a circle)."""
import ast
import os
import harness  # tests/common: the one way to start a child process

ROOT = harness.ROOT
PACKAGE = "tf_tpu_emb"


def _modules():
    out = {}
    base = os.path.join(ROOT, PACKAGE)
    for dirpath, _, files in os.walk(base):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].replace(os.sep, ".")
                out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = \
                    os.path.join(dirpath, f)
    return out


def _imports(name, path, modules):
    """Package modules that `name` imports (a package import also runs the
    package's __init__, so `from pkg import mod` depends on pkg and pkg.mod)."""
    tree = ast.parse(open(path).read(), path)
    is_pkg = path.endswith("__init__.py")
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".")
                base = ".".join(parts[:len(parts) - node.level + (1 if is_pkg else 0)])
                mod = base + ("." + node.module if node.module else "")
            else:
                mod = node.module or ""
            targets = [mod] + ["%s.%s" % (mod, a.name) for a in node.names]
        else:
            continue
        for t in targets:
            parts = t.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in modules and prefix != name:
                    found.add(prefix)
    return found


def _graph():
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    # A package's own __init__ importing its submodules is how packages are
    # built, and a submodule importing its package's siblings goes through the
    # package: only edges between modules (not to an enclosing package) count.
    return {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}


def _cycle(graph):
    state, stack = {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle():
    graph = _graph()
    assert "tf_tpu_emb.ops" in graph and graph["tf_tpu_emb.optimizers"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_optimizer_source_imports_nothing_heavy():
    """The single optimizer source is read by the C++ generator without TensorFlow."""
    graph = _graph()
    assert graph["tf_tpu_emb.optimizer_specs"] == set()
    tree = ast.parse(open(os.path.join(ROOT, PACKAGE, "optimizer_specs.py")).read())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module}
    assert not names & {"tensorflow", "numpy", "keras", PACKAGE}, names
