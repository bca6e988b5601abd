#!/usr/bin/env python3
"""The peer side of bench_peers.py: FBGEMM's table-batched embedding bags and
torch.nn.EmbeddingBag, run in their own virtualenv (`make bench-peers` makes
it: torch CPU + fbgemm-gpu-cpu, no TensorFlow).

bench_peers.py starts this script as a child process and drives it with one
JSON command per line on stdin; each answer is one JSON line on stdout:

  {"cmd": "versions"}                       -> {"torch": ..., "fbgemm_gpu": ...}
  {"cmd": "setup", "peer": P, "mode": M, ...workload...}
                                            -> {"ok": true} or {"error": why}
  {"cmd": "forward0", "out": path}          -> writes batch 0's activations
                                               ([batch, tables * dim]) to path
  {"cmd": "time", "n": N}                   -> {"times": [seconds per step]}

P is "fbgemm" or "torch"; M is "forward" or an optimizer ("sgd", "adagrad",
"rowwise_adagrad", "adam").  The ids come from the parent's .npy file
([num_batches, tables, batch * ids_per_sample], int64) and the table values
from the same generator as bench_lookup.table_values, so both sides start
from the same tables and see the same ids.  The training step is FBGEMM's
fused backward + optimizer, with dL/d(out) = the same fixed N(0,1) tensor
as ours' loss (bench_train.loss_weights).
"""
import json
import sys
import time

import numpy as np


def table_values(seed, t, dim, rows):
    # Same as bench_lookup.table_values (not imported: that module needs TF's
    # venv only for its callers, but keep this side free of the package).
    rng = np.random.default_rng([seed, dim, t])
    return rng.standard_normal((rows, dim), dtype=np.float32)


def loss_grad(seed, dim, tables, batch):
    # Same as bench_train.loss_weights, concatenated per sample as FBGEMM's
    # output is laid out ([batch, tables * dim]).
    rng = np.random.default_rng([seed, dim, 7])
    cs = [rng.standard_normal((batch, dim), dtype=np.float32) for _ in range(tables)]
    return np.concatenate(cs, axis=1)


class Peer:
    def __init__(self, torch, w):
        self.torch, self.w = torch, w
        ids = np.load(w["ids"], mmap_mode="r")
        self.num_batches = ids.shape[0]
        T, B, L = w["tables"], w["batch"], w["ids_per_sample"]
        self.dim = w["dim"]
        self.mode = w["mode"]
        # FBGEMM's input: every table's ids concatenated, offsets over T * B bags.
        self.offsets = torch.arange(0, T * B * L + 1, L, dtype=torch.int64)
        self.flat = [torch.from_numpy(np.array(ids[b]).reshape(-1))
                     for b in range(self.num_batches)]
        self.per_table = [[torch.from_numpy(np.array(ids[b, t]))
                           for t in range(T)] for b in range(self.num_batches)]
        self.table_offsets = torch.arange(0, B * L, L, dtype=torch.int64)
        self.grad = torch.from_numpy(loss_grad(w["seed"], self.dim, T, B))
        self.i = 0

    def step(self):
        raise NotImplementedError

    def forward0(self):
        raise NotImplementedError


class FbgemmPeer(Peer):
    OPTIMIZERS = {"sgd": "EXACT_SGD", "adagrad": "EXACT_ADAGRAD",
                  "rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD", "adam": "ADAM"}

    def __init__(self, torch, w):
        super().__init__(torch, w)
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            EmbeddingLocation, PoolingMode)
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)
        opt = self.OPTIMIZERS.get(w["mode"], "EXACT_SGD")
        specs = [(w["rows"], self.dim, EmbeddingLocation.HOST, ComputeDevice.CPU)
                 for _ in range(w["tables"])]
        kwargs = dict(optimizer=getattr(EmbOptimType, opt), learning_rate=w["lr"],
                      eps=w["eps"], pooling_mode=PoolingMode.SUM,
                      weights_precision=SparseType.FP32)
        if w["mode"] == "adam":
            kwargs.update(beta1=0.9, beta2=0.999)
        self.tbe = SplitTableBatchedEmbeddingBagsCodegen(specs, **kwargs)
        for t, view in enumerate(self.tbe.split_embedding_weights()):
            view.copy_(torch.from_numpy(table_values(w["seed"], t, self.dim, w["rows"])))
        if w["mode"] in ("adagrad", "rowwise_adagrad"):
            # Accumulators start at the same value as ours' (bench_train's
            # --initial-accumulator).
            for states in self.tbe.split_optimizer_states():
                states[0].fill_(w["initial_accumulator"])

    def step(self):
        torch, b = self.torch, self.i % self.num_batches
        self.i += 1
        if self.mode == "forward":
            with torch.no_grad():
                out = self.tbe(self.flat[b], self.offsets)
            return out
        out = self.tbe(self.flat[b], self.offsets)
        out.backward(self.grad)
        return out

    def forward0(self):
        with self.torch.no_grad():
            return self.tbe(self.flat[0], self.offsets).numpy()


class TorchPeer(Peer):
    """torch.nn.EmbeddingBag per table (forward only)."""

    def __init__(self, torch, w):
        super().__init__(torch, w)
        if w["mode"] != "forward":
            raise ValueError("the torch peer only runs the forward pass")
        self.bags = []
        for t in range(w["tables"]):
            bag = torch.nn.EmbeddingBag(w["rows"], self.dim, mode="sum")
            with torch.no_grad():
                bag.weight.copy_(torch.from_numpy(table_values(w["seed"], t, self.dim, w["rows"])))
            self.bags.append(bag)

    def _forward(self, b):
        with self.torch.no_grad():
            return self.torch.cat([bag(ids, self.table_offsets)
                                   for bag, ids in zip(self.bags, self.per_table[b])], dim=1)

    def step(self):
        b = self.i % self.num_batches
        self.i += 1
        return self._forward(b)

    def forward0(self):
        return self._forward(0).numpy()


def answer(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    import torch
    peer = None
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "versions":
                try:
                    import fbgemm_gpu
                    fb = getattr(fbgemm_gpu, "__version__", "installed")
                except Exception as e:  # noqa: BLE001 - reported, not hidden
                    fb = "unavailable (%s)" % e
                answer({"torch": torch.__version__, "fbgemm_gpu": fb,
                        "threads": torch.get_num_threads()})
            elif cmd["cmd"] == "setup":
                torch.set_num_threads(cmd["threads"])
                peer = None
                peer = (FbgemmPeer if cmd["peer"] == "fbgemm" else TorchPeer)(torch, cmd)
                answer({"ok": True})
            elif cmd["cmd"] == "forward0":
                np.save(cmd["out"], peer.forward0())
                answer({"ok": True})
            elif cmd["cmd"] == "time":
                times = []
                for _ in range(cmd["n"]):
                    t0 = time.perf_counter()
                    peer.step()
                    times.append(time.perf_counter() - t0)
                answer({"times": times})
            elif cmd["cmd"] == "free":
                peer = None
                answer({"ok": True})
            else:
                answer({"error": "unknown command %r" % cmd["cmd"]})
        except Exception as e:  # noqa: BLE001 - the parent prints it
            answer({"error": "%s: %s" % (type(e).__name__, e)})


if __name__ == "__main__":
    main()
