#!/usr/bin/env python3
"""The JAX side of bench_sparsecore.py: the same Adagrad training step
written with jax-tpu-embedding 0.2.0 as its examples write it, on CPU
through tf_tpu_emb.jax (its primitives' CPU lowerings), in `.venv-jax`
(`make venv-jax jax-build`; no TensorFlow).

One CPU device of `num_sc` SparseCores; one table per feature, as the V2
side's; per step: the package's input preprocessing
(`embedding.preprocess_sparse_dense_matmul_input`, its C++ on the host;
its buffers sized from the batches' statistics, as the package's warning
asks a program to: `embedding.update_preprocessing_parameters`),
then one jitted program: the lookup (`tpu_sparse_dense_matmul`), the loss
gradient (the fixed c_t of bench_train.loss_weights) and the gradient +
Adagrad update (`tpu_sparse_dense_matmul_grad`), the variables donated so
the update is in place, as the V2 side's.

bench_sparsecore.py starts this script as a child process and drives it
with one JSON command per line on stdin; each answer is one JSON line:

  {"cmd": "versions"}                         -> {"jax": ..., "jax_tpu_embedding": ...}
  {"cmd": "setup", ...workload..., "ids": path} -> {"ok": true} or {"error": why}
  {"cmd": "step_tables", "batch": b, "out": path}
                                              -> one step on batch b from the
                                                 initial tables, the logical
                                                 tables and accumulators written
                                                 to path (.npz, t<k>/p, t<k>/a)
  {"cmd": "time", "n": N}                     -> {"times": [seconds per step],
                                                 "preprocessing": [seconds of it]}
"""
import functools
import json
import os
import sys
import time

import numpy as np


def table_values(seed, t, dim, rows):
    # bench_lookup.table_values (not imported: that module needs TF's venv).
    rng = np.random.default_rng([seed, dim, t])
    return rng.standard_normal((rows, dim), dtype=np.float32)


def loss_weights(seed, dim, tables, batch):
    # bench_train.loss_weights.
    rng = np.random.default_rng([seed, dim, 7])
    return [rng.standard_normal((batch, dim), dtype=np.float32) for _ in range(tables)]


class JaxSide:
    def __init__(self, w):
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P
        from jax_tpu_embedding.sparsecore.lib.nn import embedding
        from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec as es
        from jax_tpu_embedding.sparsecore.utils import utils

        import tf_tpu_emb.jax
        tf_tpu_emb.jax.install()
        self.jax, self.embedding, self.utils = jax, embedding, utils
        self.w = w
        T, B, L, D, S = w["tables"], w["batch"], w["ids_per_sample"], w["dim"], w["num_sc"]
        ids = np.load(w["ids"], mmap_mode="r")  # [num_batches, tables, B * L]
        self.batches = [[np.ascontiguousarray(ids[b, t]).reshape(B, L).astype(np.int32)
                         for t in range(T)] for b in range(ids.shape[0])]
        self.ones = np.ones((B, L), np.float32)
        limit = -(-B * L // 8) * 8  # every id of the batch in one partition fits
        optimizer = es.AdagradOptimizerSpec(learning_rate=w["lr"],
                                            initial_accumulator_value=w["initial_accumulator"])
        self.features = {}
        for t in range(T):
            table = es.TableSpec(vocabulary_size=w["rows"], embedding_dim=D,
                                 initializer=jax.nn.initializers.zeros, optimizer=optimizer,
                                 combiner="sum", name="table_%d" % t,
                                 max_ids_per_partition=limit,
                                 max_unique_ids_per_partition=limit)
            self.features["f%d" % t] = es.FeatureSpec(
                table_spec=table, input_shape=(B, L), output_shape=(B, D), name="f%d" % t)
        embedding.prepare_feature_specs_for_training(
            self.features, global_device_count=1, num_sc_per_device=S)
        self.mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
        self.sharding = NamedSharding(self.mesh, P("x"))
        self.c = {"f%d" % t: jax.device_put(x)
                  for t, x in enumerate(loss_weights(w["seed"], D, T, B))}

        def step(inputs, variables, c):
            acts = embedding.tpu_sparse_dense_matmul(
                inputs, variables, feature_specs=self.features, global_device_count=1,
                num_sc_per_device=S)
            loss = sum(jax.numpy.sum(acts[f] * c[f]) for f in acts)
            # The gradient after the lookup, as in a model whose gradient
            # needs the activations (this loss's does not): otherwise XLA
            # may order the in-place update first and copy every table to
            # keep the lookup's operand (the V2 side's control edge).
            acts, c = jax.lax.optimization_barrier((acts, c))
            new = embedding.tpu_sparse_dense_matmul_grad(
                c, inputs, variables, feature_specs=self.features, global_device_count=1,
                num_sc_per_device=S)
            return loss, new

        mapped = jax.shard_map(step, mesh=self.mesh, in_specs=(P("x"), P("x"), P()),
                               out_specs=(P(), P("x")), check_vma=False)
        self.step_fn = jax.jit(mapped, donate_argnums=(1,))
        self.tune_buffers()
        self.i = 0
        self.variables = self.initial()

    def tune_buffers(self):
        """The package's documented tuning (its preprocessing warns that the
        default COO buffers may be far too large): the batches' statistics,
        element-wise max, given to `embedding.update_preprocessing_parameters`,
        so the buffers fit these batches as a tuned program's fit its data."""
        merged = None
        for b in range(len(self.batches)):
            stats = self.preprocess(b, with_stats=True)[1]
            if merged is None:
                merged = stats
                continue
            for field in ("max_ids_per_partition", "max_unique_ids_per_partition",
                          "required_buffer_size_per_sc"):
                mine, theirs = getattr(merged, field), getattr(stats, field)
                for k, v in theirs.items():
                    mine[k] = np.maximum(mine[k], v) if k in mine else v
        self.embedding.update_preprocessing_parameters(self.features, merged,
                                                       self.w["num_sc"])

    def initial(self):
        w, es_vars = self.w, {}
        for name, spec in self.features.items():
            t = int(name[1:])
            table = table_values(w["seed"], t, w["dim"], w["rows"])
            acc = np.full_like(table, w["initial_accumulator"])
            stack = spec.table_spec.setting_in_stack.stack_name
            shard = functools.partial(self.utils.shard_emb_table, num_devices=1,
                                      num_sc_per_device=w["num_sc"])
            put = functools.partial(self.jax.device_put, device=self.sharding)
            from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec as es
            es_vars[stack] = self.embedding.EmbeddingVariables(
                table=put(shard(table).reshape(-1, w["dim"])),
                slot=es.AdagradSlotVariables(put(shard(acc).reshape(-1, w["dim"]))))
        return es_vars

    def preprocess(self, b, with_stats=False):
        feats = {"f%d" % t: x for t, x in enumerate(self.batches[b])}
        weights = {f: self.ones for f in feats}
        out, stats = self.embedding.preprocess_sparse_dense_matmul_input(
            feats, weights, self.features, local_device_count=1, global_device_count=1,
            num_sc_per_device=self.w["num_sc"])
        return (out, stats) if with_stats else out

    def step(self, b):
        """One step; returns the seconds its preprocessing took."""
        t0 = time.perf_counter()
        inputs = self.preprocess(b)
        prep = time.perf_counter() - t0
        loss, self.variables = self.step_fn(inputs, self.variables, self.c)
        loss.block_until_ready()
        return prep

    def step_tables(self, b, out):
        self.variables = self.initial()
        self.step(b)
        arrays = {}
        for name, spec in self.features.items():
            v = self.variables[spec.table_spec.setting_in_stack.stack_name]
            for key, value in (("p", v.table), ("a", v.slot.accumulator)):
                per_device = np.asarray(value).reshape(1, -1, self.w["dim"])
                arrays["t%s/%s" % (name[1:], key)] = self.utils.unshard_emb_table(
                    per_device, num_sc_per_device=self.w["num_sc"])
        np.savez(out, **arrays)


def answer(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    side = None
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "versions":
                import jax
                from importlib import metadata
                answer({"jax": jax.__version__,
                        "jax_tpu_embedding": metadata.version("jax-tpu-embedding")})
            elif cmd["cmd"] == "setup":
                side = JaxSide(cmd)
                answer({"ok": True})
            elif cmd["cmd"] == "step_tables":
                side.step_tables(cmd["batch"], cmd["out"])
                answer({"ok": True})
            elif cmd["cmd"] == "time":
                times, prep = [], []
                for _ in range(cmd["n"]):
                    t0 = time.perf_counter()
                    prep.append(side.step(side.i % len(side.batches)))
                    times.append(time.perf_counter() - t0)
                    side.i += 1
                answer({"times": times, "preprocessing": prep})
            else:
                answer({"error": "unknown command %r" % cmd["cmd"]})
        except Exception as e:  # reported to the parent, which stops
            answer({"error": "%s: %s" % (type(e).__name__, e)})


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
