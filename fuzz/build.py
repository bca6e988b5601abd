"""Builds the coverage-guided fuzz targets (fuzz/targets/*.cc) with clang++-14 and libFuzzer.

    python fuzz/build.py [--coverage] [TARGET ...]

Each target is one libFuzzer translation unit whose first comment block
names what it links (docs/contributing.md "Coverage-guided fuzzing"):

    // fuzz-sources: engine/engine.cc engine/table.cc
    // fuzz-needs: tensorflow | jax | none

(fuzz-sources: the repository-relative .cc files it links; may be empty.)

`tensorflow`: TensorFlow's headers (-isystem), defines and libraries from
setup.py's compiler_and_flags() (the flags the op library is built with,
never hard-coded), `-Wl,--no-undefined` and an rpath to TensorFlow's
directory.  `jax`: jaxlib's XLA FFI headers from `.venv-jax` (as
jax_ffi/build.py finds them), no TensorFlow.  `none`: this tree only.

Without --coverage: `-fsanitize=fuzzer,address,undefined -g -O1` into
build/fuzz/<name>; with it: `-fprofile-instr-generate -fcoverage-mapping`
linked with `-fsanitize=fuzzer` into build/fuzz-cov/<name> (for
`make fuzz-cov-report`).  Objects are cached per source and flag set under
build/fuzz/obj (recompiled when the source or a header it includes changed),
through ccache when it is on PATH.  Prints each binary's path.
"""
import argparse
import concurrent.futures
import glob
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TARGETS_DIR = os.path.join(HERE, "targets")
OBJ_DIR = os.path.join(ROOT, "build", "fuzz", "obj")
OUT_DIRS = {False: os.path.join(ROOT, "build", "fuzz"),
            True: os.path.join(ROOT, "build", "fuzz-cov")}
CLANG = os.environ.get("FUZZ_CXX", "clang++-14")
NEEDS = ("tensorflow", "jax", "none")

# The sanitized build: UBSan's findings stop the run (libFuzzer reports them
# as crashes, with the input); vptr is off: TensorFlow's libraries are not
# instrumented and their type information is not ours to check.
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize=vptr",
            "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"]
COVERAGE = ["-fprofile-instr-generate", "-fcoverage-mapping"]


def targets():
    """Every target's name: fuzz/targets/<name>.cc."""
    return sorted(os.path.splitext(os.path.basename(p))[0]
                  for p in glob.glob(os.path.join(TARGETS_DIR, "*.cc")))


def target_header(name):
    """(sources, needs) from the target's first comment block."""
    path = os.path.join(TARGETS_DIR, name + ".cc")
    sources, needs = None, None
    with open(path) as f:
        for line in f:
            if not line.startswith("//"):
                break
            m = re.match(r"//\s*fuzz-(sources|needs):(.*)$", line)
            if m and m.group(1) == "sources":
                sources = m.group(2).split()
            elif m:
                needs = m.group(2).strip()
    if sources is None or needs not in NEEDS:
        raise SystemExit("fuzz/build.py: %s: its first comment block needs a `// fuzz-sources: "
                         "...` line and a `// fuzz-needs: %s` line" % (path, " | ".join(NEEDS)))
    for src in sources:
        if not os.path.isfile(os.path.join(ROOT, src)):
            raise SystemExit("fuzz/build.py: %s: fuzz-sources names %s, which does not exist"
                             % (path, src))
    return sources, needs


def _setup_module():
    spec = importlib.util.spec_from_file_location("tf_tpu_emb_setup",
                                                  os.path.join(ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: setup() is not called
    return module


def tensorflow_flags():
    """(compile flags, link flags) of the installed TensorFlow, as setup.py
    gives them to the op library: its -isystem headers, its defines (the C++
    ABI among them) and language standard, this tree's -I; the optimisation,
    instruction set and GCC warning flags are the fuzz build's own.  Link: TF's
    libraries and rpaths."""
    _, common, lflags, _ = _setup_module().compiler_and_flags()
    cflags, i = [], 0
    while i < len(common):
        flag = common[i]
        if flag in ("-isystem", "-I"):
            cflags += [flag, common[i + 1]]
            i += 2
            continue
        if flag.startswith(("-D", "-std=", "-I", "-isystem")):
            cflags.append(flag)
        i += 1
    # g++ 12's default standard; clang++-14's is C++14, too old for TF's headers.
    if not any(f.startswith("-std=") for f in cflags):
        cflags.insert(0, "-std=c++17")
    return cflags, lflags


def jax_flags():
    """jaxlib's FFI headers, read from .venv-jax's jax (jax_ffi/build.py's way)."""
    python = os.path.join(ROOT, ".venv-jax", "bin", "python")
    if not os.path.exists(python):
        raise SystemExit("fuzz/build.py: a `fuzz-needs: jax` target needs .venv-jax "
                         "(`make venv-jax`)")
    include = subprocess.run([python, "-c", "import jax; print(jax.ffi.include_dir())"],
                             check=True, capture_output=True, text=True).stdout.strip()
    return ["-std=c++17", "-isystem", include], []


def _flags(needs, coverage, cache):
    if needs not in cache:
        if needs == "tensorflow":
            cache[needs] = tensorflow_flags()
        elif needs == "jax":
            cache[needs] = jax_flags()
        else:
            cache[needs] = (["-std=c++17"], [])
    cflags, lflags = cache[needs]
    mode = COVERAGE if coverage else SANITIZE
    # NDEBUG_SANITIZER: absl's hash tables keep the layout TensorFlow's
    # (uninstrumented) libraries were built with (setup.py says why).
    compile_flags = (["-g", "-O1", "-fPIC", "-DNDEBUG_SANITIZER", "-Wall", "-Wno-unused-parameter",
                      "-Wno-sign-compare", "-Wno-deprecated-declarations",
                      "-Wno-unknown-warning-option",
                      "-fsanitize=fuzzer-no-link", "-I", ROOT] + mode + cflags)
    link_flags = (["-fsanitize=fuzzer"] + (COVERAGE if coverage else SANITIZE) + lflags
                  + ["-Wl,--no-undefined", "-lpthread"])
    return compile_flags, link_flags


def _compiler():
    if not shutil.which(CLANG):
        raise SystemExit("fuzz/build.py: %s not found; `make fuzz-deps` installs clang-14, "
                         "libfuzzer-14-dev and llvm-14" % CLANG)
    cxx = [CLANG]
    if shutil.which("ccache"):
        cxx = ["ccache"] + cxx
    return cxx


def _object(src, cxx, flags):
    key = hashlib.sha256(json.dumps(cxx + flags).encode()).hexdigest()[:12]
    return os.path.join(OBJ_DIR, key, src.replace(os.sep, "_") + ".o")


def _up_to_date(obj):
    """True if `obj` and its -MMD dependency file exist and the object is
    newer than every file it lists."""
    try:
        built = os.path.getmtime(obj)
        with open(obj + ".d") as f:
            text = f.read().replace("\\\n", " ")
        files = text.split(":", 1)[1].split() if ":" in text else []
        return bool(files) and all(os.path.getmtime(os.path.join(ROOT, p)) <= built
                                   for p in files)
    except OSError:
        return False


def _compile(src, cxx, flags, env):
    obj = _object(src, cxx, flags)
    if _up_to_date(obj):
        return obj
    os.makedirs(os.path.dirname(obj), exist_ok=True)
    cmd = cxx + flags + ["-MMD", "-MF", obj + ".d", "-c", os.path.join(ROOT, src), "-o", obj]
    print("fuzz/build.py: compiling %s" % src, file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.stdout or proc.stderr:
        print(proc.stdout + proc.stderr, file=sys.stderr, flush=True)
    if proc.returncode != 0:
        raise SystemExit("fuzz/build.py: compiling %s failed (exit %d):\n%s"
                         % (src, proc.returncode, " ".join(shlex.quote(c) for c in cmd)))
    return obj


def build(names=None, coverage=False, jobs=None):
    """Builds the named targets (all when None); returns their binaries' paths."""
    names = names or targets()
    known = targets()
    for name in names:
        if name not in known:
            raise SystemExit("fuzz/build.py: no target %r (fuzz/targets/%s.cc); targets: %s"
                             % (name, name, ", ".join(known)))
    cxx = _compiler()
    env = dict(os.environ)
    env.setdefault("CCACHE_BASEDIR", ROOT)
    env.setdefault("CCACHE_NOHASHDIR", "true")
    cache, plans = {}, []
    for name in names:
        sources, needs = target_header(name)
        cflags, lflags = _flags(needs, coverage, cache)
        units = [os.path.join("fuzz", "targets", name + ".cc")] + sources
        plans.append((name, units, cflags, lflags))
    # Every distinct (source, flags) once, two at a time unless told.
    work = {}
    for _, units, cflags, _ in plans:
        for src in units:
            work[(src, tuple(cflags))] = None
    jobs = jobs or max(1, min(2, os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futures = {k: pool.submit(_compile, k[0], cxx, list(k[1]), env) for k in work}
        objs = {k: f.result() for k, f in futures.items()}
    out_dir = OUT_DIRS[coverage]
    os.makedirs(out_dir, exist_ok=True)
    binaries = []
    for name, units, cflags, lflags in plans:
        binary = os.path.join(out_dir, name)
        inputs = [objs[(src, tuple(cflags))] for src in units]
        if not (os.path.exists(binary) and all(os.path.getmtime(o) <= os.path.getmtime(binary)
                                               for o in inputs)):
            cmd = [CLANG] + inputs + ["-o", binary] + lflags
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit("fuzz/build.py: linking %s failed:\n%s\n%s"
                                 % (name, " ".join(shlex.quote(c) for c in cmd),
                                    proc.stderr[-6000:]))
        binaries.append(binary)
    return binaries


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--coverage", action="store_true",
                   help="source-based coverage build into build/fuzz-cov (no sanitizers)")
    p.add_argument("--jobs", type=int, default=None, help="parallel compiles (default 2)")
    p.add_argument("targets", nargs="*", help="target names (default: every fuzz/targets/*.cc)")
    a = p.parse_args()
    for binary in build(a.targets, a.coverage, a.jobs):
        print(binary, flush=True)


if __name__ == "__main__":
    main()
