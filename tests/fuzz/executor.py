"""Runs one generated case (worker side) against the op library and checks it.

Checks, per step: a rejected op raises a TensorFlow error of an allowed type
(a Python exception or another TF error type is ``wrong_error``); valid input
is accepted and invalid input rejected (else ``wrong_error``); a rejected op
leaves every table and slot bit-identical and the engine's queues and
configured state as they were (else ``corruption``); accepted Load/Retrieve,
Recv and EmbeddingBag results match the executor's model / a numpy
reference (else ``corruption``).  Crashes and hangs are seen by the runner.

The model: configured config, per-replica queues of enqueued batches (their
mode), the in-flight batch of each replica, the replicas that have sent
gradients for the current step, and a snapshot of all table state taken with
RetrieveAllTPUEmbeddingParameters after every accepted state change.
"""
import ctypes
import threading
import os
import time

import numpy as np
import tensorflow as tf

import fuzz_configs
import fuzz_inputs
from tf_tpu_emb import ops as tte_ops
from tf_tpu_emb.optimizers import BY_PROTO_FIELD

E = tf.errors
ALLOWED_ERRORS = (E.InvalidArgumentError, E.FailedPreconditionError, E.UnimplementedError,
                  E.ResourceExhaustedError, E.OutOfRangeError, E.AbortedError, E.CancelledError,
                  E.DeadlineExceededError)
MAX_SNAPSHOT_FLOATS = 4 << 20  # larger (fuzzed) configs are not snapshotted
NUM_GROUPS = 8


class Finding(Exception):
    def __init__(self, outcome, detail):
        super().__init__(detail)
        self.outcome = outcome


class Skip(Exception):
    """The step would block by the protocol's design (a Recv waiting for
    other replicas' gradients that the case never sends)."""


def _config_proto(data):
    c = fuzz_configs.config_protos().TPUEmbeddingConfiguration()
    c.ParseFromString(data)
    return c


def shard_rows(vocab, num_shards, shard_id, mod):
    """Global rows of a shard: DIV = contiguous ranges (the first vocab % n
    one longer), MOD = ids with id % n == shard_id (README, Load/Retrieve)."""
    if mod:
        return np.arange(shard_id, vocab, num_shards)
    base, extra = divmod(vocab, num_shards)
    start = shard_id * base + min(shard_id, extra)
    return np.arange(start, start + base + (1 if shard_id < extra else 0))


def reference_bags(params, splits, ids, weights, combiner):
    """float64 reference of EmbeddingBag: per bag sum_k w_k params[id_k],
    divided by sum w (mean) or sqrt(sum w^2) (sqrtn); 0 when that is 0."""
    out = np.zeros([len(splits) - 1, params.shape[1]])
    scales = []
    for b in range(len(splits) - 1):
        lo, hi = int(splits[b]), int(splits[b + 1])
        w = weights[lo:hi].astype(np.float64) if weights.size else np.ones(hi - lo)
        s = (w[:, None] * params[ids[lo:hi]].astype(np.float64)).sum(0)
        norm = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}[combiner]
        scale = 1.0 / norm if norm != 0 else 0.0
        out[b] = s * scale
        scales.append(scale)
    return out, scales


class Executor:
    def __init__(self, verbose=False):
        self.verbose = verbose
        # A Recv reaches replica r by running on /CPU:r; the worker has this
        # many logical CPUs, and TF places an op for a missing device on
        # CPU:0 (replica 0).
        self.devices = len(tf.config.list_logical_devices("CPU"))
        self.reset()

    # ------------------------------------------------------------ model
    def reset(self):
        tte_ops.shutdown_tpu_embedding()
        self.config = None       # proto of the configured engine
        self.config_bytes = None
        self.queues = {}
        self.in_flight = {}
        self.sent = set()
        self.maybe_aborted = set()
        self.snapshot = None
        self.abandoned_threads = []
        self.restart_worker = False  # a case that changed the process (a cluster)

    def replicas(self):
        return max(1, self.config.num_tensor_cores) if self.config is not None else 0

    def _on_configured(self, config_bytes):
        self.config_bytes = config_bytes
        self.config = _config_proto(config_bytes)
        self.queues = {r: [] for r in range(self.replicas())}
        self.in_flight = {r: None for r in range(self.replicas())}
        self.sent = set()
        self.maybe_aborted = set()
        self.snapshot = self.take_snapshot()

    def _on_shutdown(self):
        self.config = self.config_bytes = self.snapshot = None
        self.queues, self.in_flight = {}, {}
        self.sent, self.maybe_aborted = set(), set()

    def take_snapshot(self):
        """Every state variable of every table ([group][table] numpy), or None
        when the engine is too large to copy."""
        if self.config is None:
            return None
        total = sum(max(d.vocabulary_size, 0) * max(d.dimension, 0)
                    for d in self.config.table_descriptor)
        if total * NUM_GROUPS > MAX_SNAPSHOT_FLOATS or len(self.config.table_descriptor) > 64:
            return None
        groups = tte_ops.retrieve_all_tpu_embedding_parameters(
            NumTables=len(self.config.table_descriptor), config="", num_shards=1, shard_id=0)
        return [[np.array(t) for t in g] for g in groups]

    def check_snapshot(self, what):
        if self.snapshot is None:
            return
        now = self.take_snapshot()
        for i, (a, b) in enumerate(zip(self.snapshot, now)):
            for t, (x, y) in enumerate(zip(a, b)):
                if x.shape != y.shape or x.tobytes() != y.tobytes():
                    differ = (int(np.sum(x.view(np.uint32) != y.view(np.uint32)))
                              if x.shape == y.shape else -1)
                    raise Finding("corruption", "%s: table %d state variable %d changed "
                                  "(%d of %d values differ)" % (what, t, i, differ, x.size))

    # ----------------------------------------------------------- driver
    def run(self, case):
        """Runs a case; returns (outcome, detail)."""
        try:
            self.reset()
            if tte_ops.is_tpu_embedding_initialized().numpy():
                raise Finding("corruption", "engine still configured after shutdown")
            for n, st in enumerate(case):
                try:
                    self.run_step(st)
                except Finding as f:
                    f.args = ("step %d (%s): %s" % (n, st["op"], f.args[0]),)
                    raise
            return "ok", ""
        except Finding as f:
            return f.outcome, str(f)
        finally:
            try:
                tte_ops.shutdown_tpu_embedding()
            except Exception:  # reported by the next case's checks
                pass

    def resolve(self, st):
        expect = st["expect"]
        if expect != "model":
            return expect
        return getattr(self, "expect_" + st["op"])(**st["args"])

    def run_step(self, st):
        op, args = st["op"], st["args"]
        try:
            expect = self.resolve(st)
        except Skip:
            return
        if self.verbose:
            print("step %s expect %s" % (op, expect), flush=True)
        fn = getattr(self, "op_" + op)
        configured_before = self.config is not None
        try:
            fn(**args)
        except Skip:
            return
        except Finding:
            raise
        except tf.errors.OpError as e:
            self.rejected(op, expect, e, configured_before)
            return
        except Exception as e:  # noqa: BLE001 - not a TF error: a finding
            raise Finding("wrong_error", "%s raised %s: %s" % (op, type(e).__name__, e))
        if expect == "fail":
            raise Finding("wrong_error", "%s accepted input that must be rejected" % op)

    def rejected(self, op, expect, error, configured_before):
        if self.verbose:
            print("  rejected: %s: %s" % (type(error).__name__, error.message[:500]), flush=True)
        if not isinstance(error, ALLOWED_ERRORS):
            raise Finding("wrong_error", "%s raised %s: %s" % (
                op, type(error).__name__, error.message[:500]))
        if not error.message:
            raise Finding("wrong_error", "%s raised %s without a message" % (
                op, type(error).__name__))
        if expect == "ok":
            raise Finding("wrong_error", "%s rejected valid input: %s: %s" % (
                op, type(error).__name__, error.message[:500]))
        initialized = bool(tte_ops.is_tpu_embedding_initialized().numpy())
        if initialized != configured_before:
            raise Finding("corruption", "rejected %s changed the configured state (%s -> %s)"
                          % (op, configured_before, initialized))
        self.check_snapshot("rejected %s" % op)

    # ------------------------------------------------------------- ops
    def expect_configure(self, config, **_):
        return "fail" if self.config is not None else "ok"

    def op_configure(self, config, probe=False):
        if probe:
            self.probe_shape_fn(config)
        tf.raw_ops.ConfigureTPUEmbedding(config=config)
        if self.config is not None:
            raise Finding("wrong_error", "a second ConfigureTPUEmbedding was accepted")
        self._on_configured(config)
        if not tte_ops.is_tpu_embedding_initialized().numpy():
            raise Finding("corruption", "configure succeeded but the engine is not initialized")
        if self.snapshot is not None:
            for t, d in enumerate(self.config.table_descriptor):
                if self.snapshot[0][t].shape != (d.vocabulary_size, d.dimension):
                    raise Finding("corruption", "table %d parameters have shape %s" % (
                        t, self.snapshot[0][t].shape))

    def probe_shape_fn(self, config):
        """Traces Recv / Send / LoadAll graphs with `config` as their attr, which
        runs the ops' shape functions on it."""
        try:
            n = max(1, len(fuzz_configs.outputs_of(_config_proto(config))))
        except Exception:
            n = 1
        n = min(n, 64)

        @tf.function(autograph=False)
        def graph():
            outs = tte_ops.recv_tpu_embedding_activations(num_outputs=n, config=config)
            tte_ops.send_tpu_embedding_gradients(list(outs), config=config)
            return outs
        try:
            graph.get_concrete_function()
        except (ValueError, TypeError) as e:  # shape-function errors in graph mode
            if "tf_tpu_emb" in repr(type(e)) or not str(e):
                raise Finding("wrong_error", "shape function: %r" % e)

    def op_shutdown(self):
        tte_ops.shutdown_tpu_embedding()
        self._on_shutdown()

    def expect_is_initialized(self):
        return "ok"

    def op_is_initialized(self):
        got = bool(tte_ops.is_tpu_embedding_initialized().numpy())
        if got != (self.config is not None):
            raise Finding("corruption", "IsTPUEmbeddingInitialized is %s, model says %s"
                          % (got, self.config is not None))

    def expect_load_random(self, **_):
        return "ok" if self.config is not None else "fail"

    def op_load_random(self, seed, record=True):
        if self.config is None:
            tte_ops.load_all_tpu_embedding_parameters(
                parameters=[np.zeros([1, 1], np.float32)],
                **{"auxiliary%d" % i: [np.zeros([0], np.float32)] for i in range(1, 8)},
                config="", num_shards=1, shard_id=0)
            return
        rng = np.random.default_rng(seed)
        for t, d in enumerate(self.config.table_descriptor):
            field = d.optimization_parameters.WhichOneof("parameters")
            op = self.table_op("Load", field)
            shape = (d.vocabulary_size, d.dimension)
            tensors = {"parameters": rng.standard_normal(shape).astype(np.float32)}
            for s in fuzz_configs.slots_of(field):
                tensors[s] = rng.uniform(0.1, 2.0, shape).astype(np.float32)
            op(num_shards=1, shard_id=0, table_id=t, **tensors)
        if record:
            self.snapshot = self.take_snapshot()

    def expect_enqueue(self, name, kwargs, config=None):
        if self.config is None:
            return "fail"
        return "ok" if config is None or config == self.config_bytes else "any"

    def op_enqueue(self, name, kwargs, config=None):
        getattr(tf.raw_ops, name)(**kwargs)
        if self.config is None:
            raise Finding("wrong_error", "%s accepted without a configured engine" % name)
        replica = int(np.asarray(kwargs.get("device_ordinal", -1)).reshape(-1)[0])
        replica = 0 if replica < 0 else replica
        mode = kwargs.get("mode_override", "unspecified")
        training = mode == "train" or (
            mode == "unspecified" and self.config.mode != self.config.INFERENCE)
        self.queues[replica].append(training)

    def _blocks(self, replica):
        return (self.config is not None and not self.config.pipeline_execution_with_tensor_core
                and replica in self.sent and len(self.sent) < self.replicas())

    def expect_recv(self, replica, config=None):
        if self.config is None or replica >= self.replicas():
            return "fail"
        if self._blocks(replica):
            raise Skip()
        if config is not None and config != self.config_bytes:
            return "any"
        if replica in self.maybe_aborted:
            return "any"
        return "ok" if self.queues[replica] else "fail"

    def op_recv(self, replica, config=None):
        cfg = config if config is not None else (self.config_bytes or b"")
        try:
            n = len(fuzz_configs.outputs_of(_config_proto(cfg)))
        except Exception:
            n = 1
        try:
            with tf.device("/CPU:%d" % replica):
                outs = tte_ops.recv_tpu_embedding_activations(num_outputs=n, config=cfg)
        except tf.errors.AbortedError:
            self.maybe_aborted.discard(replica)
            raise
        self.maybe_aborted.discard(replica)
        if self.config is None or not self.queues.get(replica):
            raise Finding("wrong_error", "Recv on replica %d succeeded with nothing queued"
                          % replica)
        training = self.queues[replica].pop(0)
        self.in_flight[replica] = training
        for o, ((t, shape), out) in enumerate(zip(fuzz_configs.outputs_of(self.config), outs)):
            want = tuple(shape) + (self.config.table_descriptor[t].dimension,)
            if tuple(out.shape) != want:
                raise Finding("corruption", "Recv output %d has shape %s, expected %s"
                              % (o, tuple(out.shape), want))

    def expect_send(self, replica, grads, rates):
        if self.config is None:
            return "fail"
        return "ok" if self.in_flight.get(replica) is True else "fail"

    def op_send(self, replica, grads, rates):
        with tf.device("/CPU:%d" % replica):
            try:
                tte_ops.send_tpu_embedding_gradients(
                    list(grads), config=self.config_bytes or b"", learning_rates=list(rates))
            except tf.errors.OpError:
                if self.sent and self.config is not None and not self._valid_send(grads, rates):
                    # a Send rejected by validation fails the step of every replica
                    self.maybe_aborted |= self.sent
                    self.sent = set()
                raise
        if self.in_flight.get(replica) is not True:
            raise Finding("wrong_error", "Send accepted without a training batch in flight")
        self.in_flight[replica] = None
        self.sent.add(replica)
        if len(self.sent) == self.replicas():
            self.sent = set()
            self.snapshot = self.take_snapshot()  # the step was applied

    def _valid_send(self, grads, rates):
        """Send's arguments pass its validation (which aborts the step when
        they do not); a valid Send can still fail for want of a batch."""
        outs = fuzz_configs.outputs_of(self.config)
        shapes = [tuple(s) + (self.config.table_descriptor[t].dimension,) for t, s in outs]
        return (len(grads) == len(shapes) and all(g.shape == s for g, s in zip(grads, shapes))
                and len(rates) == fuzz_configs.num_dynamic(self.config)
                and all(np.asarray(r).size == 1 for r in rates))

    def op_drain(self):
        """Every queued batch comes out, then the queue is empty, and the
        tables are as last recorded."""
        if self.config is None:
            return
        # Replicas beyond the worker's devices (a mutated config that asks
        # for more and is accepted) cannot be reached by a Recv.
        for r in range(min(self.replicas(), self.devices)):
            if self._blocks(r):
                continue
            if r in self.maybe_aborted:
                # The step may have been aborted for this replica: its next
                # Recv returns the abort's error, or (not aborted) behaves as
                # any Recv: a queued batch, or the wait for one times out.
                # A Finding here (a Recv that succeeds with nothing queued,
                # outputs of the wrong shape) is a real one: it propagates.
                try:
                    self.op_recv(r)
                except (tf.errors.AbortedError, tf.errors.DeadlineExceededError):
                    pass
            while self.queues[r]:
                try:
                    self.op_recv(r)
                except tf.errors.OpError as e:
                    raise Finding("corruption", "replica %d: %d batch(es) should be queued, "
                                  "Recv failed: %s" % (r, len(self.queues[r]), e.message[:300]))
            try:
                with tf.device("/CPU:%d" % r):
                    tte_ops.recv_tpu_embedding_activations(
                        num_outputs=len(fuzz_configs.outputs_of(self.config)),
                        config=self.config_bytes)
                raise Finding("corruption", "replica %d: the queue holds more batches than "
                              "were accepted" % r)
            except tf.errors.DeadlineExceededError as e:  # the wait for a batch timed out
                if "nothing was enqueued for replica %d" % r not in e.message:
                    raise Finding("wrong_error", "replica %d: an empty queue's Recv failed "
                                  "with: %s" % (r, e.message[:300]))
        self.check_snapshot("after the case")

    # ---------------------------------------------------- load / retrieve
    @staticmethod
    def table_op(kind, field):
        info = BY_PROTO_FIELD[field]
        bare = "%sTPUEmbedding%sParameters" % (kind, info.op_infix)
        if info.core_has_table_ops:
            return getattr(tf.raw_ops, bare)
        return getattr(tte_ops, tte_ops._snake(bare))

    def _table_index(self, table_id=None, table_name=None):
        if table_name is not None:
            names = [d.name for d in self.config.table_descriptor]
            return names.index(table_name) if table_name in names else None
        return table_id if 0 <= table_id < len(self.config.table_descriptor) else None

    def _rows(self, t, num_shards, shard_id):
        d = self.config.table_descriptor[t]
        if num_shards <= 0 or not 0 <= shard_id < num_shards:
            return None
        return shard_rows(d.vocabulary_size, num_shards, shard_id,
                          self.config.sharding_strategy == self.config.MOD)

    def op_load(self, optimizer, num_shards, shard_id, seed, table_id=None, table_name=None,
                shape_delta=(0, 0)):
        rng = np.random.default_rng(seed)
        t = self._table_index(table_id, table_name)
        d = self.config.table_descriptor[t if t is not None else 0]
        rows = self._rows(t if t is not None else 0, num_shards, shard_id)
        shape = (max(0, (len(rows) if rows is not None else 1) + shape_delta[0]),
                 max(0, d.dimension + shape_delta[1]))
        names = ("parameters",) + fuzz_configs.slots_of(optimizer)
        tensors = {n: rng.standard_normal(shape).astype(np.float32) for n in names}
        sel = {"table_name": table_name} if table_name is not None else {"table_id": table_id}
        self.table_op("Load", optimizer)(num_shards=num_shards, shard_id=shard_id, **sel, **tensors)
        if t is None or rows is None or len(rows) == 0:
            raise Finding("wrong_error", "Load accepted an invalid table / shard selection")
        if self.snapshot is not None:
            for i, n in enumerate(names):
                self.snapshot[i][t] = self.snapshot[i][t].copy()
                self.snapshot[i][t][rows] = tensors[n]
            self.check_snapshot("Load (the loaded shard is not what Retrieve returns)")

    def op_retrieve(self, optimizer, num_shards, shard_id, seed, table_id=None, table_name=None):
        sel = {"table_name": table_name} if table_name is not None else {"table_id": table_id}
        outs = self.table_op("Retrieve", optimizer)(num_shards=num_shards, shard_id=shard_id, **sel)
        outs = [outs] if isinstance(outs, tf.Tensor) else list(outs)
        t = self._table_index(table_id, table_name)
        rows = self._rows(t, num_shards, shard_id) if t is not None else None
        if t is None or rows is None or len(rows) == 0:
            raise Finding("wrong_error", "Retrieve accepted an invalid table / shard selection")
        if self.snapshot is not None:
            for i, out in enumerate(outs):
                want = self.snapshot[i][t][rows]
                if np.asarray(out).tobytes() != want.tobytes():
                    raise Finding("corruption", "Retrieve of table %d shard %d/%d, variable %d "
                                  "differs from the engine's state" % (t, shard_id, num_shards, i))

    def op_load_all(self, num_shards, shard_id, seed, num_tables, group_delta=0):
        rng = np.random.default_rng(seed)
        tables = self.config.table_descriptor
        groups = [[] for _ in range(NUM_GROUPS)]
        plan = []
        for t in range(num_tables):
            d = tables[t % len(tables)]
            field = d.optimization_parameters.WhichOneof("parameters")
            used = 1 + len(fuzz_configs.slots_of(field))
            has_acc = self.snapshot is not None and used < NUM_GROUPS and \
                self.snapshot[used][t % len(tables)].size > 0
            used += int(has_acc) + group_delta
            rows = self._rows(t % len(tables), num_shards, shard_id)
            n = len(rows) if rows is not None else 1
            for i in range(NUM_GROUPS):
                groups[i].append(rng.standard_normal([n, d.dimension]).astype(np.float32)
                                 if i < used else np.zeros([0], np.float32))
            plan.append((used - int(has_acc), rows))
        tte_ops.load_all_tpu_embedding_parameters(
            parameters=groups[0], **{"auxiliary%d" % i: groups[i] for i in range(1, NUM_GROUPS)},
            config="", num_shards=num_shards, shard_id=shard_id)
        if num_tables != len(tables) or group_delta != 0:
            raise Finding("wrong_error", "LoadAll accepted a wrong table / group count")
        if self.snapshot is not None:
            for t, (used, rows) in enumerate(plan):
                for i in range(used):
                    self.snapshot[i][t] = self.snapshot[i][t].copy()
                    self.snapshot[i][t][rows] = groups[i][t]
            self.check_snapshot("LoadAll (the loaded shard is not what RetrieveAll returns)")

    def op_retrieve_all(self, num_shards, shard_id, seed, num_tables):
        groups = tte_ops.retrieve_all_tpu_embedding_parameters(
            NumTables=num_tables, config="", num_shards=num_shards, shard_id=shard_id)
        if num_tables != len(self.config.table_descriptor):
            raise Finding("wrong_error", "RetrieveAll accepted NumTables %d" % num_tables)
        if self.snapshot is not None:
            for i in range(NUM_GROUPS):
                for t in range(num_tables):
                    full = self.snapshot[i][t]
                    got = np.asarray(groups[i][t])
                    want = full[self._rows(t, num_shards, shard_id)] if full.size else full
                    if got.size != want.size or got.tobytes() != want.tobytes():
                        raise Finding("corruption", "RetrieveAll table %d group %d differs from "
                                      "the engine's state" % (t, i))

    # ------------------------------------------------------- lifecycle
    def expect_shutdown_under_recv(self):
        return "ok"

    def op_shutdown_under_recv(self):
        """Shutdown while a Recv waits for the other replicas' gradients: the
        Recv must return (with an error) instead of waiting forever."""
        c = self.config
        if c is None or self.replicas() < 2 or c.pipeline_execution_with_tensor_core or \
                c.mode == c.INFERENCE or self.sent or self.queues[0] or self.in_flight[0]:
            self.op_shutdown()
            return
        rng = np.random.default_rng(0)
        try:  # the configured config may be a fuzzed one that cannot train
            name, kw = fuzz_inputs.valid_enqueue(rng, c, replica=0, mode="train")
            self.op_enqueue(name, kw)
            self.op_recv(0)
            grads, rates, _ = fuzz_inputs.send_gradients(rng, c)
            self.op_send(0, grads, rates)
            self.op_enqueue(name, kw)
        except (tf.errors.OpError, IndexError, ValueError):
            self.op_shutdown()
            return
        result = {}

        def waiter():
            try:
                self.op_recv(0)
                result["ok"] = True
            except Exception as e:  # noqa: BLE001
                result["error"] = e
        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        time.sleep(0.05)  # let the Recv reach its wait
        self.op_shutdown()
        thread.join(20)
        if thread.is_alive():
            self.abandoned_threads.append(thread)
            raise Finding("hang", "a Recv waiting for the other replicas did not return "
                          "within 20 s of ShutdownTPUEmbedding")
        error = result.get("error")
        if error is not None and not isinstance(error, ALLOWED_ERRORS):
            raise Finding("wrong_error", "the Recv interrupted by shutdown raised %s: %s"
                          % (type(error).__name__, error))

    # ----------------------------------------------------- embedding bag
    def op_embedding_bag(self, params, splits, ids, weights, combiner, grad, grad_expect):
        checkable = (params.ndim == 2 and splits.ndim == 1 and ids.ndim == 1 and splits.size >= 1
                     # float32 range: no overflow / underflow in 1 / sum w, sum w^2
                     and np.all((weights == 0) | ((np.abs(weights) > 1e-15)
                                                  & (np.abs(weights) < 1e15)))
                     and weights.size in (0, ids.size)
                     and splits[0] == 0 and splits[-1] == ids.size
                     and np.all(np.diff(splits) >= 0) and combiner in ("sum", "mean", "sqrtn"))
        in_range = ids.size == 0 or (params.ndim == 2 and ids.min() >= 0
                                     and ids.max() < params.shape[0])
        ref, scales = (reference_bags(params, splits, ids, weights, combiner)
                       if checkable and in_range else (None, None))
        try:
            out = tte_ops.embedding_bag(params, splits, ids, weights, combiner=combiner).numpy()
        except tf.errors.OpError:
            out = None
            fwd_error = True
        else:
            fwd_error = False
        if ref is not None and out is not None:
            if out.shape != ref.shape or not np.allclose(out, ref, rtol=1e-5, atol=1e-5):
                raise Finding("corruption", "EmbeddingBag differs from the numpy reference")
        # the gradient op, with its own expectation
        sub = {"op": "embedding_bag_grad", "expect": grad_expect,
               "args": dict(grad=grad, splits=splits, ids=ids, weights=weights,
                            combiner=combiner, scales=scales)}
        self.run_step(sub)
        if fwd_error:
            tte_ops.embedding_bag(params, splits, ids, weights, combiner=combiner)  # re-raise

    def op_embedding_bag_grad(self, grad, splits, ids, weights, combiner, scales):
        out = tte_ops.embedding_bag_grad(grad, splits, ids, weights, combiner=combiner).numpy()
        if scales is not None and grad.ndim == 2 and grad.shape[0] == len(scales):
            want = np.zeros([ids.size, grad.shape[1]])
            for b in range(len(scales)):
                for k in range(int(splits[b]), int(splits[b + 1])):
                    w = float(weights[k]) if weights.size else 1.0
                    want[k] = w * scales[b] * grad[b]
            if out.shape != want.shape or not np.allclose(out, want, rtol=1e-5, atol=1e-5):
                raise Finding("corruption", "EmbeddingBagGrad differs from the numpy reference")

    # -------------------------------------------------------- sparsecore
    def op_sparsecore(self, name, inputs, attrs, functions):
        """One SparseCore kernel (sparsecore_family.py): no engine involved."""
        import sparsecore_family  # pylint: disable=import-outside-toplevel

        sparsecore_family.run(name, inputs, attrs, functions)

    # ----------------------------------------------------------- cluster
    def op_cluster(self, spec):
        """A random model on real embedding hosts against one engine
        (``cluster_case.py``); the worker starts afresh after it."""
        import cluster_case  # pylint: disable=import-outside-toplevel

        self.restart_worker = True
        cluster_case.run(spec, Finding)

    # ---------------------------------------------------------- selftest
    def op_selftest(self, kind):
        if kind == "abort":
            os.abort()
        elif kind == "segv":
            ctypes.string_at(16)  # a real invalid read: SIGSEGV
        elif kind == "hang":
            time.sleep(3600)
        elif kind == "raise":
            raise ValueError("selftest: not a TensorFlow error")
        elif kind == "corrupt":
            self.op_load_random(seed=2, record=False)  # changes the tables, then "rejects"
            raise tf.errors.InvalidArgumentError(None, None, "selftest: rejected after a change")
