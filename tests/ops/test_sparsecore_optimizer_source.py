"""The SparseCore optimizer source (tf_tpu_emb/optimizer_specs.py's
SPARSECORE_OPTIMIZERS -> core/sparsecore_optimizers.gen.h): what the op
registration, the kernels and tf_tpu_emb/ops.py read, and the walk of
ARCHITECTURE.md's "Adding a SparseCore optimizer": one spec entry plus its
formula, nothing else.

The walk adds a hypothetical SparseCore optimizer to a copy of the spec (a
momentum optimizer over core/optimizer_formulas.h's Momentum formula),
generates the header from it, and compiles a TensorFlow-free C++ program
against the generated header that reads its attrs and scalar inputs through
the generated visitors, finds its input positions in the generated layout and
runs its row update through the generated dispatch; the results are checked
against tests/common/optimizer_reference.py."""
import os
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from tf_tpu_emb import ops as tte_ops
from tf_tpu_emb import optimizer_specs as S
import harness  # tests/common
import optimizer_reference as ref

ROOT = harness.ROOT
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_optimizers  # noqa: E402

# The hypothetical entry of the walk (ARCHITECTURE.md shows the same one).
MOMENTUM = S.SparseCoreOptimizerInfo(
    "Momentum", "Momentum", "momentum", slots=("momenta",),
    grad_attrs=(S.ScHyper("use_nesterov", "use_nesterov", S.BOOL),
                S.ScHyper("momentum", "momentum", nonzero=True)),
    standalone_inputs=("embedding_table", "momenta", "indices", "gradient",
                       "learning_rate", "momentum"),
    standalone_slots=("momenta",),
    standalone_outputs=("embedding_table", "momenta"),
    standalone_attrs=(S.ScHyper("use_nesterov", "use_nesterov", S.BOOL),),
    standalone_scalars=(S.ScHyper("momentum", "momentum", nonzero=True),))


def test_spec_entries_are_consistent():
    """Every entry's names resolve: its formula's hyper struct is a V1
    optimizer's, every member it sets exists there, every standalone input is
    a role, a slot or a scalar, and its outputs are among its inputs."""
    for sc in S.SPARSECORE_OPTIMIZERS:
        if sc.own_hypers:
            assert sc.hyper not in S.BY_PROTO_FIELD, sc.name
            fields = {member for member, _ in sc.own_hypers}
        else:
            fields = {h.field for h in S.BY_PROTO_FIELD[sc.hyper].engine_hypers}
        for hp in (sc.grad_attrs + sc.standalone_attrs + sc.standalone_scalars +
                   sc.jax_hypers + sc.jax_attrs):
            assert hp.member in fields, (sc.name, hp)
        assert sc.tf_ops or sc.jax_name, sc.name  # some front end runs it
        if not sc.tf_ops:
            assert not (sc.grad_attrs or sc.standalone_inputs or sc.op_names), sc.name
            continue
        roles = {"indices", "gradient", "learning_rate", "embedding_table"}
        scalars = {h.name for h in sc.standalone_scalars}
        assert set(sc.standalone_inputs) == roles | set(sc.standalone_slots) | scalars, sc.name
        assert len(sc.standalone_inputs) == len(set(sc.standalone_inputs)), sc.name
        assert len(sc.standalone_slots) == len(sc.slots), sc.name
        assert set(sc.standalone_outputs) == {"embedding_table"} | set(sc.standalone_slots)


def test_op_names_come_from_the_spec():
    """tf_tpu_emb/ops.py's SparseCore name lists are the spec's."""
    per_opt = {n for sc in S.SPARSECORE_OPTIMIZERS for n in sc.op_names}
    assert per_opt <= set(tte_ops.SPARSECORE_OP_NAMES)
    assert len(per_opt) == 4 * sum(sc.tf_ops for sc in S.SPARSECORE_OPTIMIZERS)
    assert set(tte_ops.SPARSECORE_IN_PLACE_OP_NAMES) == {
        n for sc in S.SPARSECORE_OPTIMIZERS for n in sc.in_place_op_names}


def _walk_specs():
    """The spec module with the hypothetical entry appended (the only edit)."""
    specs = gen_optimizers.load_specs()
    names = {k: getattr(specs, k) for k in dir(specs) if not k.startswith("__")}
    names["SPARSECORE_OPTIMIZERS"] = specs.SPARSECORE_OPTIMIZERS + (MOMENTUM,)
    return types.SimpleNamespace(**names)


_PROGRAM = r"""
#include <cstdio>
#include <cstring>
#include <string>

#include "core/sparsecore_optimizers.gen.h"

using namespace tf_tpu_emb;
using sc_opt::Opt;

int main() {
  // Every optimizer, in order, as the kernels' registration walks them.
  sc_opt::ForEachOptimizer([](auto o) {
    std::printf("opt %s %d\n", sc_opt::NameOf(o), sc_opt::NumSlotsOf(o));
  });
  // The JAX front end's names, as the FFI handler finds them.
  for (int k = 0; k < sc_opt::kNumOptimizers; ++k) {
    const char* jax = sc_opt::kJaxNames[k];
    Opt found;
    if (jax != nullptr && sc_opt::FindJaxOptimizer(jax, &found)) {
      std::printf("jax %s %s %d\n", jax, sc_opt::NameOf(found), sc_opt::NumJaxScalars(found));
    }
  }
  Opt none;
  std::printf("jax unknown %s\n", sc_opt::FindJaxOptimizer("no_such", &none) ? "found" : "-");
  const Opt o = Opt::kMomentum;
  // Attrs as a kernel reads them (TF's GetAttr / an FFI attr dictionary).
  sc_opt::Hyper h{};
  int attrs = 0;
  sc_opt::VisitGradAttrs(o, &h, [&](const char* name, auto* value) {
    ++attrs;
    if (std::strcmp(name, "use_nesterov") == 0) *value = 1;
    if (std::strcmp(name, "momentum") == 0) *value = 0.5f;
    return true;
  });
  int scalars = 0, scalar_input = -1;
  sc_opt::Hyper zero{};
  sc_opt::VisitStandaloneScalars(o, &zero, [&](int input, const char*, float* value) {
    ++scalars;
    scalar_input = input;
    *value = 0;
    return true;
  });
  const char* refused = sc_opt::ZeroHyper(o, zero);
  std::printf("attrs %d scalars %d at %d zero %s ok %s\n", attrs, scalars, scalar_input,
              refused ? refused : "-", sc_opt::ZeroHyper(o, h) ? "no" : "yes");
  const sc_opt::StandaloneLayout L = sc_opt::StandaloneLayoutOf(o);
  std::printf("layout %d %d %d %d %d %d\n", L.indices, L.gradient, L.learning_rate, L.table,
              L.slots[0], L.slot_outputs[0]);
  for (const sc_opt::OpDef& d : sc_opt::OpDefs()) {
    if (d.opt != o) continue;
    std::string line = std::string("def ") + d.name;
    for (const char* a : d.grad_attrs) line += std::string(" | ") + a;
    std::printf("%s\n", line.c_str());
  }
  // Two steps of the row update through the generated dispatch.
  float w[3] = {1.0f, -2.0f, 0.5f}, m[3] = {0.1f, 0.0f, -0.3f};
  const float g[2][3] = {{0.25f, -1.0f, 2.0f}, {-0.5f, 0.75f, 1.0f}};
  for (int step = 0; step < 2; ++step) {
    RowArgs a{};
    a.w = w;
    a.s[0] = m;
    a.g = g[step];
    a.dim = 3;
    a.lr = 0.1f;
    sc_opt::Update(o, a, h);
  }
  std::printf("w %.9g %.9g %.9g m %.9g %.9g %.9g\n", w[0], w[1], w[2], m[0], m[1], m[2]);
  return 0;
}
"""


@pytest.mark.system
def test_adding_a_sparsecore_optimizer_is_one_entry_and_its_formula(tmp_path):
    """ARCHITECTURE.md's walk: the entry above, generated and compiled without
    TensorFlow, registers, reads its attrs and scalars, lays out its
    standalone op and updates rows with its formula."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    specs = _walk_specs()
    core = tmp_path / "core"
    core.mkdir()
    # The checked-in TensorFlow-free headers, and the generated ones from the walk's spec.
    for name in ("optimizer_formulas.h", "cpu_dispatch.h"):
        shutil.copy(os.path.join(ROOT, "core", name), core / name)
    (core / "optimizer_hypers.gen.h").write_text(gen_optimizers.hypers_header(specs))
    (core / "sparsecore_optimizers.gen.h").write_text(gen_optimizers.sparsecore_header(specs))
    (tmp_path / "walk.cc").write_text(_PROGRAM)
    exe = tmp_path / "walk"
    subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-Werror", "-I", str(tmp_path),
                    str(tmp_path / "walk.cc"), "-o", str(exe)], check=True, timeout=300)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True,
                         timeout=60).stdout.splitlines()
    names = [line.split()[1] for line in out if line.startswith("opt ")]
    assert names == [sc.name for sc in S.SPARSECORE_OPTIMIZERS if sc.tf_ops] + ["Momentum"]
    jax = sorted(line for line in out if line.startswith("jax "))
    assert jax == sorted(["jax unknown -"] + [
        "jax %s %s %d" % (sc.jax_name, sc.name, 1 + len(sc.jax_hypers))
        for sc in S.SPARSECORE_OPTIMIZERS if sc.jax_name])
    assert "opt Momentum 1" in out
    assert "attrs 2 scalars 1 at 5 zero momentum ok yes" in out
    # indices, gradient, learning_rate, table, the slot's input and output.
    assert "layout 2 3 4 0 1 1" in out
    assert "def Momentum | use_nesterov: bool | momentum: float" in out
    w_line = next(line for line in out if line.startswith("w "))
    vals = [float(x) for x in w_line.split()[1:4] + w_line.split()[5:8]]
    # The numpy reference, in float32 as the engine's arithmetic.
    w = np.array([1.0, -2.0, 0.5], np.float32)
    m = np.array([0.1, 0.0, -0.3], np.float32)
    g = np.array([[0.25, -1.0, 2.0], [-0.5, 0.75, 1.0]], np.float32)
    hp = {"momentum": 0.5, "use_nesterov": True}
    for step in range(2):
        w, (m,) = ref.momentum(w, (m,), g[step], np.float32(0.1), hp)
        w, m = w.astype(np.float32), m.astype(np.float32)
    np.testing.assert_allclose(vals[:3], w, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(vals[3:], m, rtol=1e-6, atol=1e-7)
