"""Writes the committed seed inputs of the fuzz targets (fuzz/corpus/<name>/).

    .venv/bin/python fuzz/seeds.py [TARGET ...]     (default: every target with a generator)

Seeds start the fuzzer somewhere useful: a target whose input is a
serialized proto starts from real configurations, one whose input is
decoded field by field (fuzz/targets/fuzz_input.h) from byte strings of a
few lengths.  Generation is seeded, so rerunning the script writes the same
files; a target's folder is replaced whole.  Keep each target under 100 KB.

`sparsecore_preprocess`, `jax_ffi`: byte 0 each of the target's paths, the
rest random (their decoding makes mostly well-formed inputs of any bytes).

`host_packets` has no generator here: its seeds are packets the worker's
Router makes, which only the target (with its engine) can build; it writes
them itself at start-up with HOST_PACKETS_WRITE_SEEDS=<folder>
(fuzz/targets/host_packets.cc).

`config_init` (fuzz/targets/config_init.cc): byte 0 the configure variant,
byte 1 the shard count and id, then a TPUEmbeddingConfiguration from the
random-case fuzz suite's generator (tests/fuzz/fuzz_configs.py), in feature
and table mode, every optimizer TF's protos express, DIV and MOD sharding,
several hosts, pipelining, quantization, clipping and dynamic learning rates.
"""
import argparse
import hashlib
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MAX_BYTES = 100 * 1024


def _config_init(rng):
    sys.path.insert(0, ROOT)
    from tests.fuzz import fuzz_configs
    seeds = []
    templates = fuzz_configs.optimizer_templates()
    for i in range(40):
        c = fuzz_configs.valid_config(rng, max_replicas=4, max_tables=3)
        if i < len(templates):  # every optimizer at least once
            field = sorted(templates)[i]
            c.table_descriptor[0].optimization_parameters.CopyFrom(templates[field])
            if field == "frequency_estimator":
                c.table_descriptor[0].dimension = 1
            fuzz_configs._renumber_dynamic_tags(c)
        if i % 5 == 4:
            c.num_hosts = int(rng.integers(2, 5))
        variant = int(rng.integers(0, 256)) if i % 3 else 0
        shards = int(rng.integers(0, 256))
        seeds.append(bytes([variant, shards]) + c.SerializeToString())
    return seeds


def _random_bytes(lengths):
    def generate(rng):
        return [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]
    return generate


def _paths(count, lengths):
    """Byte 0 picks one of `count` paths (each path every length), the rest
    decoded field by field."""
    def generate(rng):
        return [bytes([path]) + rng.integers(0, 256, n, dtype=np.uint8).tobytes()
                for path in range(count) for n in lengths]
    return generate


GENERATORS = {
    "config_init": _config_init,
    # Inputs decoded field by field: byte strings of several lengths.
    "input_mappers": _random_bytes([64, 128, 256, 512, 1024] * 4),
    "load_retrieve": _random_bytes([32, 64, 128, 256, 512] * 4),
    # fuzz/targets/training_step.cc: a config, then batches and gradients.
    "training_step": _random_bytes([128, 256, 512, 1024, 2048] * 4),
    # fuzz/targets/routed_step.cc: a config, then two steps' batches and gradients.
    "routed_step": _random_bytes([256, 512, 1024, 2048, 4096] * 4),
    # fuzz/targets/sparsecore_preprocess.cc: its five paths (the V2 pipeline, the
    # minibatching path, the sort, the CSR buffers, the minibatching ops), whose
    # decoding makes mostly well-formed batches of any bytes.
    "sparsecore_preprocess": _paths(5, [48, 96, 192, 384, 768, 1536]),
    # fuzz/targets/jax_ffi.cc: the lookup, the gradient + update, the row gradients.
    "jax_ffi": _paths(3, [32, 64, 128, 256, 512, 1024]),
}


def write(name, seeds):
    folder = os.path.join(HERE, "corpus", name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    total = 0
    for data in seeds:
        total += len(data)
        with open(os.path.join(folder, "seed-" + hashlib.sha1(data).hexdigest()[:16]), "wb") as f:
            f.write(data)
    if total > MAX_BYTES:
        raise SystemExit("fuzz/seeds.py: %s's seeds take %d bytes, more than %d"
                         % (name, total, MAX_BYTES))
    print("fuzz/seeds.py: %d seeds (%d bytes) in %s" % (len(seeds), total,
                                                       os.path.relpath(folder, ROOT)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("targets", nargs="*", help="target names (default: %s)"
                   % ", ".join(sorted(GENERATORS)))
    a = p.parse_args()
    for name in a.targets or sorted(GENERATORS):
        if name not in GENERATORS:
            raise SystemExit("fuzz/seeds.py: no generator for %r" % name)
        # One stream per target, so adding a target changes no other's seeds.
        rng = np.random.default_rng(int(hashlib.sha1(name.encode()).hexdigest()[:8], 16))
        write(name, GENERATORS[name](rng))


if __name__ == "__main__":
    main()
