"""Builds (and with --run, runs) the C++ unit tests of tests/cpp.

Two translation units -- core_test.cc (core/, header-only) and
engine_test.cc (engine/) -- compiled with the op library's own compiler and
flags (setup.py's compiler_and_flags: TensorFlow's tf.sysconfig flags, its
headers as -isystem, ccache when present) and linked with the engine's object
files (the library's own, setup.py's compile_objects: shared with the library
build of the same flags, compiled only when stale) against the installed
TensorFlow.

    python tests/cpp/build.py [--run] [--out DIR]

Prints the binary's path (and with --run its output; the exit status is the
binary's).  tests/cpp/test_cpp_units.py runs it under pytest.
"""
import argparse
import importlib.util
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SOURCES = ("core_test.cc", "engine_test.cc")
DEFAULT_OUT = os.path.join(ROOT, "build", "cpp_tests")


def _setup_module():
    spec = importlib.util.spec_from_file_location("tf_tpu_emb_setup",
                                                  os.path.join(ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: setup() is not called
    return module


def build(out=DEFAULT_OUT):
    """Compiles and links the unit-test binary; returns its path."""
    setup_module = _setup_module()
    cxx, common, lflags, info = setup_module.compiler_and_flags()
    # An ASan/UBSan build (TF_TPU_EMB_SANITIZE=1) links the sanitizer runtimes too.
    san = setup_module.SANITIZE_FLAGS if setup_module.sanitizing() else []
    os.makedirs(out, exist_ok=True)
    engine = [s for s in setup_module.SOURCES if s.startswith("engine" + os.sep)]
    tests = [os.path.join("tests", "cpp", src) for src in SOURCES]
    objs = setup_module.compile_objects(engine + tests, cxx, common, "the C++ unit tests")
    binary = os.path.join(out, "unit_tests")
    link = cxx + san + objs + ["-o", binary] + lflags + [
        "-Wl,--no-undefined", "-Wl,-rpath," + info["libdir"], "-lpthread"]
    subprocess.run(link, check=True)
    return binary


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", action="store_true", help="run the binary after building it")
    p.add_argument("--out", default=DEFAULT_OUT, help="build directory (%(default)s)")
    a = p.parse_args()
    binary = build(a.out)
    print(binary, flush=True)
    if a.run:
        sys.exit(subprocess.run([binary]).returncode)


if __name__ == "__main__":
    main()
