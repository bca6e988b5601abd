"""The pip package: its metadata (version, licence, requirements, extras) and
the portable build (no AVX outside the run-time-dispatched clones,
core/cpu_dispatch.h).  These pass for an editable install and for a wheel
(`make package-check` runs them against one)."""
import platform
import re
import shutil
import subprocess
from importlib import metadata

import pytest

import tf_tpu_emb
from tf_tpu_emb import _loader


def _dist():
    """The installed distribution; the metadata tests skip where the library
    was only built in place (the TensorFlow lanes of `make test-tf`, which
    never pip-install it: the main lane and `make package-check` do)."""
    try:
        return metadata.distribution("tf_tpu_emb")
    except metadata.PackageNotFoundError:
        pytest.skip("tf_tpu_emb is built in place, not installed: no distribution metadata")


def _tensorflow_distributions():
    names = metadata.packages_distributions().get("tensorflow", [])
    return {re.sub(r"[-_.]+", "-", n).lower() for n in names}


def test_version_is_the_package_version():
    assert _dist().version == tf_tpu_emb.__version__


def test_licence_and_classifiers():
    meta = _dist().metadata
    assert meta["License"] == "Apache-2.0" or "Apache-2.0" in (meta["License-Expression"] or "")
    classifiers = meta.get_all("Classifier")
    assert "License :: OSI Approved :: Apache Software License" in classifiers
    assert any(c.startswith("Programming Language :: Python :: 3") for c in classifiers)


def _installed_tensorflow_minor():
    import tensorflow as tf
    major, minor = tf.__version__.split(".")[:2]
    return int(major), int(minor)


def _pin_of(major, minor):
    return {">=%d.%d" % (major, minor), "<%d.%d" % (major, minor + 1)}


def test_tensorflow_requirement_is_met_by_the_installed_tensorflow():
    """The requirement names the distribution that provides `tensorflow` here
    (tensorflow-cpu for this suite), so pip never installs a second
    TensorFlow, and pins the minor of that TensorFlow: every installed build
    (a wheel, an editable install) compiled the library against it, and the
    library loads on no other minor (docs/install.md "The TensorFlow pin")."""
    requires = _dist().requires
    tf_reqs = [r for r in requires if re.match(r"(tensorflow|tf-)[-\w]*\s*[<>=!~]", r)
               and "extra ==" not in r]
    assert len(tf_reqs) == 1, requires
    name, spec = re.match(r"([-\w.]+)\s*(.*)", tf_reqs[0]).groups()
    assert re.sub(r"[-_.]+", "-", name).lower() in _tensorflow_distributions(), tf_reqs
    major, minor = _installed_tensorflow_minor()
    assert set(spec.replace(" ", "").split(",")) == _pin_of(major, minor), spec
    # ... a minor of the supported range (docs/install.md).
    assert (2, 16) <= (major, minor) < (2, 22), (major, minor)


def test_tensorflow_extras_pin_the_same_minor():
    """`pip install tf_tpu_emb[tensorflow]` (or `[tensorflow-cpu]`) asks for
    the TensorFlow minor the library was compiled against, as the plain
    requirement does."""
    requires = _dist().requires
    pin = _pin_of(*_installed_tensorflow_minor())
    for extra in ("tensorflow", "tensorflow-cpu"):
        reqs = [r for r in requires if 'extra == "%s"' % extra in r]
        assert len(reqs) == 1, requires
        name, spec = re.match(r"([-\w.]+)\s*([^;]*);", reqs[0]).groups()
        assert name == extra, reqs
        assert set(spec.replace(" ", "").split(",")) == pin, reqs


def test_demo_extra_brings_matplotlib():
    requires = _dist().requires
    assert any(r.startswith("matplotlib") and 'extra == "demo"' in r for r in requires), requires


def _portable_disassembly():
    """objdump -d of the library as built by default (portable, with CPU
    dispatch clones); skips for the native and the sanitizer builds, whose
    code layout differs, and where objdump is missing."""
    from tf_tpu_emb import _build_info

    if getattr(_build_info, "NATIVE", False):
        pytest.skip("built with TF_TPU_EMB_NATIVE=1 (the opt-in native build)")
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", _loader.library_path()],
                         capture_output=True, text=True, check=True).stdout
    if "__asan_report" in asm:
        pytest.skip("sanitizer build (make sanitize): core/cpu_dispatch.h turns the dispatch off")
    return asm


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the portable baseline is x86-64's")
def test_portable_build_uses_avx_only_in_dispatched_clones():
    """The default build targets x86-64-v2: an instruction on ymm/zmm
    registers (AVX, AVX2, AVX-512) may appear only in the clones the loader
    selects for a CPU that has them."""
    asm = _portable_disassembly()
    function, offenders, clones = None, set(), set()
    for line in asm.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            function = head.group(1)
        elif re.search(r"%[yz]mm\d", line):
            if re.search(r"\[clone \.arch_x86_64_v[34]\]", function or ""):
                clones.add(function)
            else:
                offenders.add(function)
    assert not offenders, sorted(offenders)[:10]
    # The hot loops do have their vector clones.
    assert any("LookupRange" in f for f in clones), sorted(clones)
    assert any("ApplyPartition" in f for f in clones), sorted(clones)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="checks x86-64 prefetch instructions")
def test_hot_loops_keep_their_prefetches():
    """The forward (LookupRange) and the update (ApplyPartition) prefetch the
    rows they are about to touch.  GCC deletes calls to a helper whose only
    effect is a prefetch (IPA pure-const), which once left the update with
    none (benchmarks/RESULTS.md, "The training profile"): every compiled
    variant of both must hold prefetch instructions (in the default build,
    where both are functions of their own: the dispatch clones)."""
    asm = _portable_disassembly()
    counts, function = {}, None
    for line in asm.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            function = head.group(1)
            if re.search(r"(LookupRange|ApplyPartition)\(", function) and \
                    ".resolver" not in function and ".cold" not in function:
                counts.setdefault(function, 0)
            continue
        if function in counts and re.search(r"\tprefetch", line):
            counts[function] += 1
    names = " ".join(counts)
    assert "LookupRange" in names and "ApplyPartition" in names, sorted(counts)
    assert all(n > 0 for n in counts.values()), counts
