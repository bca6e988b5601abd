"""Builds the JAX FFI library (jax_ffi/*.cc) for the running Python's jax.

    .venv-jax/bin/python jax_ffi/build.py      # what `make jax-build` runs

g++ -O3 -std=c++17 -fPIC -shared against jaxlib's XLA FFI headers
(`jax.ffi.include_dir()`) and this tree's core/ (TF-free headers only); the
result is tf_tpu_emb/jax/_sparsecore_ffi.so, which tf_tpu_emb.jax loads.
No TensorFlow is needed or read.  CXX overrides the compiler (ccache works).
"""
import os
import platform
import shlex
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


def command(output: str = OUTPUT) -> list:
  cxx = shlex.split(os.environ.get("CXX", "g++"))
  return cxx + [
      "-O3", "-DNDEBUG", "-fno-math-errno", *target_flags(), "-std=c++17", "-fPIC", "-shared",
      "-Wall", "-Werror",
      "-I", ROOT, "-isystem", jax.ffi.include_dir(),
      *SOURCES, "-o", output,
  ]


def main() -> int:
  cmd = command()
  print(" ".join(shlex.quote(c) for c in cmd), flush=True)
  return subprocess.call(cmd)


if __name__ == "__main__":
  sys.exit(main())
