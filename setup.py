"""Builds tf_tpu_emb's op library with g++ and the flags of the installed TensorFlow.

TensorFlow is not a build requirement: the library must be compiled against the
exact TensorFlow that will load it, so build with

    pip install --no-build-isolation -e .      # or without -e

The compiler flags come from ``tf.sysconfig`` (never hard-coded), TensorFlow's
headers are passed as ``-isystem`` and the link uses ``-Wl,--no-undefined`` so an
ABI mistake fails at link time instead of at ``tf.load_op_library`` time.
ccache is used when it is on PATH, with its base directory (CCACHE_BASEDIR,
unless set) this tree, so that copies of the tree built elsewhere -- the
lanes' copies, an unpacked sdist -- hit what another copy compiled.
"""
import concurrent.futures
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
# Same sources as the Bazel BUILD: every translation unit of ops/ (op
# definitions), engine/ (the CPU engine) and kernels/ (op glue; the SparseCore
# family in kernels/sparsecore/); core/ is header-only.  Includes are
# repository-relative ("core/config.h").
SOURCE_DIRS = ("ops", "engine", "kernels", "kernels/sparsecore")
HEADER_DIRS = ("core", "engine", "kernels", "kernels/sparsecore", "ops")
SOURCES = sorted(os.path.relpath(p, HERE) for d in SOURCE_DIRS
                 for p in glob.glob(os.path.join(HERE, d, "*.cc")))
HEADERS = sorted(os.path.relpath(p, HERE) for d in HEADER_DIRS
                 for p in glob.glob(os.path.join(HERE, d, "*.h")))
LIB_NAME = "tf_tpu_emb._tf_tpu_emb_ops"

_FLAGS_SCRIPT = r"""
import json, tensorflow as tf
print(json.dumps({
    "version": tf.__version__,
    "cflags": tf.sysconfig.get_compile_flags(),
    "lflags": tf.sysconfig.get_link_flags(),
    "libdir": tf.sysconfig.get_lib(),
    "abi": tf.sysconfig.CXX11_ABI_FLAG,
}))
"""


def tf_build_flags():
    """Reads the installed TensorFlow's build flags in a subprocess."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    try:
        out = subprocess.run([sys.executable, "-c", _FLAGS_SCRIPT], check=True,
                             capture_output=True, text=True, env=env).stdout
    except subprocess.CalledProcessError as e:
        raise SystemExit(
            "tf_tpu_emb: cannot import tensorflow to read its build flags.\n"
            "Install tensorflow-cpu first and build with "
            "`pip install --no-build-isolation .`\n" + e.stderr[-2000:])
    info = json.loads(out.strip().splitlines()[-1])
    cflags = []
    for f in info["cflags"]:
        # TF headers are third-party: -isystem silences their warnings.
        cflags += ["-isystem", f[2:]] if f.startswith("-I") else [f]
    major, minor = (int(x) for x in info["version"].split(".")[:2])
    cflags.append("-DTF_TPU_EMB_TF_VERSION_INTEGER=%d" % (major * 1000 + minor * 10))
    # The TPU-embedding config protos are compiled into libtensorflow_cc, which
    # `import tensorflow` always loads; link it so --no-undefined holds.
    lflags = list(info["lflags"]) + ["-l:libtensorflow_cc.so.2"]
    # Run-time search path for TF's two libraries, so a process that loads
    # the plugin without Python (TF_LoadLibrary from C, TF-Java, Go) needs no
    # LD_LIBRARY_PATH: first TF beside the installed package
    # (site-packages/tensorflow), then TF's directory at build time.
    lflags += ["-Wl,-rpath,$ORIGIN/../tensorflow", "-Wl,-rpath," + info["libdir"]]
    return info, cflags, lflags


SANITIZE_FLAGS = ["-fsanitize=address,undefined",
                  "-fno-sanitize=null,nonnull-attribute,returns-nonnull-attribute,vptr"]


def sanitizing():
    """TF_TPU_EMB_SANITIZE=1 (``make sanitize``): an ASan + UBSan build."""
    return os.environ.get("TF_TPU_EMB_SANITIZE", "0") != "0"


def native_build():
    """TF_TPU_EMB_NATIVE=1: opt-in build for the build machine's CPU only."""
    return os.environ.get("TF_TPU_EMB_NATIVE", "0") != "0"


def target_flags():
    """The instruction set.  By default a portable baseline (x86-64-v2: any
    x86-64 CPU TensorFlow's own wheels run on), with the hot loops cloned for
    AVX2 and AVX-512 and picked at run time (core/cpu_dispatch.h); a wheel
    built here runs on other machines.  TF_TPU_EMB_NATIVE=1 compiles
    everything for this machine's CPU instead (the library then crashes with
    an illegal instruction on an older CPU)."""
    if native_build():
        return ["-march=native", "-DTF_TPU_EMB_NATIVE_BUILD"]
    if platform.machine().lower() in ("x86_64", "amd64"):
        return ["-march=x86-64-v2", "-mtune=generic"]
    return []


def compiler_and_flags():
    """(compiler command, compile flags, link flags, TF build info) for code
    compiled against the installed TensorFlow: the op library here, the C++
    unit tests (tests/cpp/build.py) with the same flags."""
    info, cflags, lflags = tf_build_flags()
    cxx = os.environ.get("CXX", "g++").split()
    if shutil.which("ccache") and "ccache" not in cxx[0]:
        cxx = ["ccache"] + cxx
    # -fno-math-errno: lets sqrt vectorise in the optimizer row updates.
    opt = ["-O3", "-DNDEBUG", "-fno-math-errno"]
    if sanitizing():
        # AddressSanitizer + UndefinedBehaviorSanitizer build for
        # `make sanitize` (never the normal build).  GCC 12 reports false
        # null/nonnull/vptr findings inside an absl header TF ships, so
        # those checks are off; every other UBSan check stays on.
        # NDEBUG_SANITIZER: absl's hash tables otherwise add generation
        # fields under ASan, and an absl container built here (e.g. in the
        # InstantiateOptions a kernel hands TF's function runtime) would not
        # have the layout TF's non-sanitized binary expects.
        opt = ["-O1", "-DNDEBUG", "-DNDEBUG_SANITIZER", "-fno-math-errno"] + SANITIZE_FLAGS + [
            "-fno-omit-frame-pointer", "-g"]
    opt += target_flags()
    common = cflags + opt + [
        "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wundef",
        "-Wno-unused-parameter", "-Wno-sign-compare",
        "-Wno-interference-size", "-Wno-deprecated-declarations", "-I", HERE]
    return cxx, common, lflags, info


def _say(text):
    """Build progress: on stderr, which pip shows with -v and `make build`
    always (pip -q would hide it)."""
    print(text, file=sys.stderr, flush=True)


def _up_to_date(obj):
    """True if `obj` and its -MMD dependency file exist and the object is
    newer than every file the dependency file lists (source and headers)."""
    dep = obj + ".d"
    try:
        built = os.path.getmtime(obj)
        with open(dep) as f:
            text = f.read().replace("\\\n", " ")
    except OSError:
        return False
    files = text.split(":", 1)[1].split() if ":" in text else []
    try:
        # Relative paths (ccache's base directory rewrites them) are this tree's.
        return bool(files) and all(os.path.getmtime(os.path.join(HERE, f)) <= built
                                   for f in files)
    except OSError:  # a header went away
        return False


def objects_dir(cxx, common):
    """Where the objects of one flag set live: per tree and per flag set, so a
    rebuild compiles only the translation units whose source or headers
    changed (their -MMD dependency files say which), whoever builds --
    `make build`, pip's editable install, build_ext --inplace, or the C++ unit
    tests (tests/cpp/build.py links the engine's objects from here)."""
    key = hashlib.sha256(json.dumps(cxx + common).encode()).hexdigest()[:12]
    return os.path.join(HERE, "build", "objs", key)


def object_of(src, cxx, common):
    """The object file of `src` (a path relative to this tree) for a flag set."""
    return os.path.join(objects_dir(cxx, common), src.replace(os.sep, "_") + ".o")


def compile_objects(sources, cxx, common, what):
    """Compiles the stale ones of `sources` (relative to this tree), in
    parallel, with a progress line each; returns every source's object."""
    os.makedirs(objects_dir(cxx, common), exist_ok=True)
    verbose = os.environ.get("TF_TPU_EMB_BUILD_VERBOSE", "0") != "0"
    stale = [src for src in sources if not _up_to_date(object_of(src, cxx, common))]
    jobs = max(1, min(len(stale), os.cpu_count() or 1))
    _say("tf_tpu_emb: building %s: %d of %d C++ files to compile, %d at a time (about "
         "10-20 s each: TensorFlow's headers)%s"
         % (what, len(stale), len(sources), jobs, ", ccache on" if "ccache" in cxx[0] else ""))
    done = []
    lock = threading.Lock()
    # ccache: absolute paths under the base directory are hashed relative to
    # the compiler's working directory, this tree; no working directory in
    # the hash of -g objects (the sanitizer build).
    env = dict(os.environ)
    env.setdefault("CCACHE_BASEDIR", HERE)
    env.setdefault("CCACHE_NOHASHDIR", "true")

    def compile_one(src):
        obj = object_of(src, cxx, common)
        cmd = cxx + common + ["-MMD", "-MF", obj + ".d", "-c", os.path.join(HERE, src),
                              "-o", obj]
        if verbose:
            _say(" ".join(cmd))
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, env=env)
        if proc.stdout or proc.stderr:
            _say(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise SystemExit("tf_tpu_emb: compiling %s failed (exit %d)" % (src, proc.returncode))
        with lock:
            done.append(src)
            _say("tf_tpu_emb: [%d/%d] %s (%.0f s)"
                 % (len(done), len(stale), src, time.monotonic() - t0))

    if stale:
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            list(pool.map(compile_one, stale))
    return [object_of(src, cxx, common) for src in sources]


class TFBuildExt(build_ext):
    def get_ext_filename(self, ext_name):
        return os.path.join(*ext_name.split(".")) + ".so"

    def build_extension(self, ext):
        cxx, common, lflags, info = compiler_and_flags()
        started = time.monotonic()
        objs = compile_objects(ext.sources, cxx, common, "the op library against TensorFlow "
                               + info["version"])
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        link = (cxx + ["-shared"] + (SANITIZE_FLAGS if sanitizing() else []) + objs
                + ["-o", target] + lflags + ["-Wl,--no-undefined"])
        if os.environ.get("TF_TPU_EMB_BUILD_VERBOSE", "0") != "0":
            _say(" ".join(link))
        subprocess.run(link, check=True)
        _say("tf_tpu_emb: linked %s in %.0f s" % (os.path.relpath(target, HERE),
                                                 time.monotonic() - started))
        # Record what the library was built against; the loader checks it.
        # Written beside the library and, for editable installs (which import
        # the source tree), into the source package too.
        text = ("# Generated by setup.py; do not edit.\n"
                "TF_VERSION = %r\nCXX11_ABI = %r\nNATIVE = %r\n"
                % (info["version"], info["abi"], native_build()))
        for pkg_dir in {os.path.dirname(target), os.path.join(HERE, "tf_tpu_emb")}:
            with open(os.path.join(pkg_dir, "_build_info.py"), "w") as f:
                f.write(text)


SUPPORTED_TF = ">=2.16,<2.22"


def _building_sdist():
    """True while setuptools runs this file for an sdist (``python -m build
    --sdist`` and ``setup.py sdist`` both name the command): an sdist compiles
    nothing, so its metadata keeps the whole supported range."""
    return "sdist" in sys.argv[1:]


def tensorflow_spec(dist_name):
    """The version range the package requires of TensorFlow.  A build that
    compiles the library (a wheel: ``make wheel``, pip building from the sdist,
    an editable install) pins the minor of the TensorFlow it compiled against,
    ``>=2.21,<2.22`` for 2.21.x: the library loads on no other minor (the
    loader refuses it, tf_tpu_emb/_loader.py), so pip must not pair the wheel
    with another one.  The sdist, and a tree without TensorFlow, keep the
    supported range."""
    from importlib import metadata
    if dist_name is None or _building_sdist():
        return SUPPORTED_TF
    try:
        built = metadata.version(dist_name)
    except metadata.PackageNotFoundError:
        return SUPPORTED_TF
    major, minor = (int(re.match(r"\d+", x).group()) for x in built.split(".")[:2])
    return ">=%d.%d,<%d.%d" % (major, minor, major, minor + 1)


def tensorflow_distribution():
    """The distribution that provides the `tensorflow` module here
    (tensorflow, tensorflow-cpu, ...), or None without one: the library is
    compiled against that TensorFlow, and requiring another distribution name
    would make pip install a second TensorFlow over it."""
    from importlib import metadata
    try:
        dists = metadata.packages_distributions().get("tensorflow", [])
    except Exception:  # very old importlib.metadata
        dists = []
    # keras and others also ship files under tensorflow/; keep the ones whose
    # name says TensorFlow.
    names = [d for d in dists if d.lower().replace("_", "-").startswith(("tensorflow", "tf-"))]
    return names[0].replace("_", "-") if names else None


def tensorflow_requirement(dist_name, spec):
    """The install requirement on TensorFlow under the installed distribution's
    name; without any TensorFlow installed, `tensorflow` (the build then
    stops with a message, tf_build_flags)."""
    return (dist_name or "tensorflow") + spec


def read(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return f.read()


def version():
    """The one version: tf_tpu_emb.__version__ (read, not imported: importing
    the package needs TensorFlow)."""
    match = re.search(r'^__version__ = "([^"]+)"', read("tf_tpu_emb/__init__.py"), re.M)
    return match.group(1)


# Guarded so that tests/cpp/build.py can import this file for
# compiler_and_flags() (pip runs it as __main__).
if __name__ == "__main__":
    TF_DIST = tensorflow_distribution()
    TF_SPEC = tensorflow_spec(TF_DIST)
    setup(
        name="tf_tpu_emb",
        version=version(),
        description="TensorFlow's TPU embedding ops, engine and APIs, running on CPU",
        long_description=read("README.md"),
        long_description_content_type="text/markdown",
        license="Apache-2.0",
        classifiers=[
            "Development Status :: 4 - Beta",
            "Intended Audience :: Developers",
            "Intended Audience :: Science/Research",
            "License :: OSI Approved :: Apache Software License",
            "Operating System :: POSIX :: Linux",
            "Programming Language :: C++",
            "Programming Language :: Python :: 3",
            "Programming Language :: Python :: 3 :: Only",
            "Topic :: Scientific/Engineering :: Artificial Intelligence",
        ],
        packages=find_packages(include=["tf_tpu_emb", "tf_tpu_emb.*"]),
        ext_modules=[Extension(LIB_NAME, sources=SOURCES, depends=HEADERS)],
        cmdclass={"build_ext": TFBuildExt},
        python_requires=">=3.9",
        install_requires=["numpy", tensorflow_requirement(TF_DIST, TF_SPEC)],
        extras_require={"demo": ["matplotlib"],
                        "tensorflow": ["tensorflow" + TF_SPEC],
                        "tensorflow-cpu": ["tensorflow-cpu" + TF_SPEC]},
        zip_safe=False,
    )
