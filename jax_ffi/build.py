"""Builds the JAX FFI library (jax_ffi/*.cc) for the running Python's jax.

    .venv-jax/bin/python jax_ffi/build.py      # what `make jax-build` runs

g++ -O3 -std=c++17 -fPIC -shared against jaxlib's XLA FFI headers
(`jax.ffi.include_dir()`) and this tree's core/ (TF-free headers only); the
result is tf_tpu_emb/jax/_sparsecore_ffi.so, which tf_tpu_emb.jax loads.
No TensorFlow is needed or read.  CXX overrides the compiler; ccache is
used when it is on PATH (the object is compiled on its own, then linked:
ccache caches compiles, not links), with paths relative to the tree so
that a fresh clone hits the cache (setup.py's rule, CCACHE_BASEDIR).
"""
import os
import platform
import shlex
import shutil
import subprocess
import sys

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = [os.path.join(ROOT, "jax_ffi", "sparsecore_ffi.cc")]
OUTPUT = os.path.join(ROOT, "tf_tpu_emb", "jax", "_sparsecore_ffi.so")


def target_flags() -> list:
  """setup.py's portable baseline (x86-64-v2; the hot loops carry AVX2 and
  AVX-512 clones, core/cpu_dispatch.h), so the library runs on any x86-64
  CPU TensorFlow's and jaxlib's wheels run on."""
  if platform.machine().lower() in ("x86_64", "amd64"):
    return ["-march=x86-64-v2", "-mtune=generic"]
  return []


def compiler() -> list:
  cxx = shlex.split(os.environ.get("CXX", "g++"))
  if shutil.which("ccache") and "ccache" not in cxx[0]:
    cxx = ["ccache"] + cxx
  return cxx


def commands(output: str = OUTPUT) -> list:
  """The compile of each source (relative to the tree: run in ROOT) and the link."""
  objects, cmds = [], []
  for src in SOURCES:
    rel = os.path.relpath(src, ROOT)
    obj = os.path.join("build", "jax_ffi", os.path.splitext(os.path.basename(rel))[0] + ".o")
    objects.append(obj)
    cmds.append(compiler() + [
        "-O3", "-DNDEBUG", "-fno-math-errno", *target_flags(), "-std=c++17", "-fPIC",
        "-Wall", "-Werror", "-I", ".", "-isystem", jax.ffi.include_dir(),
        "-c", rel, "-o", obj,
    ])
  cmds.append(shlex.split(os.environ.get("CXX", "g++")) + ["-shared", *objects, "-o", output])
  return cmds


def main() -> int:
  os.makedirs(os.path.join(ROOT, "build", "jax_ffi"), exist_ok=True)
  env = dict(os.environ)
  env.setdefault("CCACHE_BASEDIR", ROOT)
  env.setdefault("CCACHE_NOHASHDIR", "true")
  for cmd in commands():
    print(" ".join(shlex.quote(c) for c in cmd), flush=True)
    status = subprocess.call(cmd, cwd=ROOT, env=env)
    if status:
      return status
  return 0


if __name__ == "__main__":
  sys.exit(main())
