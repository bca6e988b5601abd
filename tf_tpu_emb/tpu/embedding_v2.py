"""TF's own ``TPUEmbeddingV2`` on the stand-in SparseCore TPU (``install(embedding="v2")``).

``tf.tpu.experimental.embedding.TPUEmbeddingV2`` is TF's class
(``tensorflow/python/tpu/tpu_embedding_v3.py``): its preprocessing, table
stacking, variable creation and initialisation, lookup, gradient stacking,
optimizer dispatch and checkpoint layout all run unchanged, on the op
library's CPU kernels of TF's SparseCore ops (docs/sparsecore_semantics.md).
What a TPU gives that class and the stand-in gives otherwise -- the seams,
every one of them here or named here, each active only while a V2 stand-in
is installed (``tf_tpu_emb.tpu.uninstall`` restores TF's public names):

1. The strategy (tf_tpu_emb/tpu/strategy.py, "SparseCore systems"):
   ``strategy.extended._tpu_devices``, the devices array TF reads for
   variable placement, table initialisation, ``embedding_table_shards`` and
   the host of the enqueue (replica k is ``/device:CPU:k``); variable
   creation honours TF's ``skip_mirrored_creator`` (each table shard is a
   plain variable on its chip's device, as under ``TPUExtended``); and an
   eager ``strategy.run`` runs as a ``tf.function``, as TF's
   ``TPUStrategy.run`` does (one step, one function call, whose step the
   chips' kernels meet in).
2. ``tpu_hardware_feature`` of the strategy and resolver
   (tf_tpu_emb/tpu/system.py): embedding feature V2,
   ``SPARSECORES_PER_CHIP`` per chip.
3. The SparseCore count and chip count of the kernels: a TPU's kernels read
   the TPU topology (``num_sparsecores_per_device`` is left at -1 by TF);
   ours read the system the stand-in publishes through
   ``TfTpuEmbSetSparseCoreSystem`` (system.py, core/sparsecore.h).  Across
   chips the replicas' lookup and gradient kernels meet
   (kernels/sparsecore/rendezvous.h), as a TPU's SparseCores exchange ids
   and rows.
4. The replica-local table shard (:class:`TPUEmbeddingShardedVariable`
   below).  Inside a TPU's replicated program, reading or assigning TF's
   ``TPUEmbeddingShardedVariable`` reaches the replica's own shard (its
   ``TPUReplicateContext`` and packed variable); outside one, TF reads shard
   0 (``_dense_var_to_tensor``), refuses ``read_value`` and assigns through
   a packed variable.  The stand-in computes as a ``MirroredStrategy``, with
   no TPU context and no packed variables, so its variables are TF's class
   re-classed (after TF's own creator made them, no state added) to a
   subclass whose read and assign, in a replica context of its strategy,
   reach that replica's component; ``read_from_device`` /
   ``assign_on_device`` address the component on the device.  Everything
   else -- the shards (``{name}/{replica}``), the saveables of the sharded
   stacked layout, ``shape`` -- is TF's.
5. :class:`TPUEmbeddingV2` is TF's class with two overrides,
   ``_variable_creator`` (seam 4) and ``enqueue`` (seam 9); it is bound at
   ``tf.tpu.experimental.embedding.TPUEmbeddingV2`` (install.py), so
   ``isinstance`` against TF's class, its errors and its checkpoints are
   TF's.
6. ``tpu_replication.outside_compilation``, which TF's enqueue, dequeue and
   apply_gradients call, needs none: outside a TPU context TF's own
   function runs the computation as it is (logging a warning in a
   ``tf.function``).  Outside a ``TPUReplicateContext`` TF's enqueue
   preprocesses on the host of ``_tpu_devices[0][0]`` (/device:CPU:0), with
   the system's ``num_replicas_in_sync``, as a TPU host does.
7. **In place** (:func:`_in_place_update`).  TF's ``apply_gradients`` reads
   the table and its slots, runs ``XlaSparseDenseMatmulGradWith<Opt>And...``
   (a function: the updated table and slots are new tensors) and assigns the
   results back.  A TPU's compiler aliases those buffers, so the step costs
   the touched rows; run as written on CPU it copies every table and slot
   every step (benchmarks/bench_sparsecore.py: 17x the V1 step at 1M rows).
   In a ``tf.function`` the stand-in's assign therefore replaces that
   read -> op -> assign by our ``...InPlace`` op on the same inputs with the
   variables themselves (ops/sparsecore_optimizer_ops.cc), which updates
   the touched rows where they are -- after copying a buffer an earlier
   read still holds (TF's copy-on-write rule), so nothing read before the
   update sees it -- and the functional op, left without consumers, is
   pruned.  The result is the functional op's, bit for bit
   (tests/sparsecore/test_sparsecore_v2_standin.py).  Eagerly (no graph to
   rewrite), or with ``TF_TPU_EMB_V2_IN_PLACE=0``, TF's path runs as written.
8. **Pipelining** (``pipeline_execution_with_tensor_core=True``).  On a TPU
   the lookup of step N+1 overlaps the TensorCore's step N, so it does not
   see step N's update.  TF marks the ops it makes with the flag (the node
   attr ``_embedding_pipelining``: "forward" / "backward"; "..._sequential"
   where TF turns it off); our kernels read the mark, the in-place op of
   seam 7 carries its gradient op's, and a pipelined update keeps the rows
   it changed as they were for the table's next lookup
   (kernels/sparsecore/pipeline.h; docs/sparsecore_semantics.md
   "Pipelining").  The tables stay up to date, so checkpoints and
   ``embedding_tables`` need nothing; both paths of seam 7 honour it.
9. **The enqueue device.**  ``enqueue(features, device=d)`` preprocesses on
   the host of ``d``, which TF requires to be a TPU device; a TPU program
   passes one of its strategy's ``worker_devices``.  The stand-in's replica
   devices are ``/device:CPU:k``, whose host is ``/device:CPU:0``, TF's host
   of the device-less enqueue: such a ``d`` takes that path.  Any other
   device keeps TF's error ("Non-TPU device ... passed to enqueue").
"""
import os
import weakref
from tensorflow.python.distribute import device_util
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.distribute import values_util
from tensorflow.python.framework import ops
from tensorflow.python.tpu import tpu_embedding_v3

from tf_tpu_emb import ops as tte_ops

__all__ = ["TPUEmbeddingV2", "TPUEmbeddingShardedVariable"]

# TF's gradient+optimizer op -> our in-place form of it (seam 7).
_IN_PLACE = {name[:-len("InPlace")]: name for name in tte_ops.SPARSECORE_IN_PLACE_OP_NAMES}
_TABLES_AT = 6  # input index of embedding_table; the slots follow (TF's op defs)
# The node attr TF's EmbeddingPipeliningContext puts on the lookup and
# gradient ops of pipeline_execution_with_tensor_core (seam 8).
_PIPELINE_ATTR = "_embedding_pipelining"
# graph -> {gradient op name: its in-place op, or None where it cannot be one}
_rewritten = weakref.WeakKeyDictionary()


def _in_place_enabled():
    return os.environ.get("TF_TPU_EMB_V2_IN_PLACE", "1") != "0"


def _captured_as(graph, tensor):
    """The tensor outside ``graph`` that ``graph`` captured as ``tensor``
    (``tensor`` itself when it is not a capture)."""
    for external, internal in getattr(graph, "captures", ()):
        if internal is tensor:
            return external
    return tensor


def _variable_read(tensor):
    """The ReadVariableOp behind ``tensor`` (through the Identity ops of
    ``ResourceVariable.read_value``), or None."""
    while tensor.op.type == "Identity":
        tensor = tensor.op.inputs[0]
    return tensor.op if tensor.op.type == "ReadVariableOp" else None


def _in_place_update(component, value):
    """Seam 7: when ``value`` is output k of one of TF's SparseCore gradient
    ops whose input k is a read of ``component``, the in-place op that
    updates that op's table and slots (made once per gradient op), else None
    (the caller assigns ``value`` as it is)."""
    if not _in_place_enabled() or not hasattr(value, "op") or not hasattr(value, "graph"):
        return None  # eager: the values exist already
    op = value.op
    bare = op.type[len(tte_ops.PREFIX):] if op.type.startswith(tte_ops.PREFIX) else op.type
    if bare not in _IN_PLACE:
        return None
    graph = op.graph
    done = _rewritten.setdefault(graph, {})
    reads = [_variable_read(t) for t in op.inputs[_TABLES_AT:_TABLES_AT + len(op.outputs)]]
    mine = reads[value.value_index]
    if mine is None or _captured_as(graph, mine.inputs[0]) is not component.handle:
        return None
    if op.name not in done:
        done[op.name] = None
        if all(r is not None for r in reads):
            inputs = list(op.inputs)
            inputs[_TABLES_AT:_TABLES_AT + len(reads)] = [r.inputs[0] for r in reads]
            kwargs = {arg.name: t for arg, t in zip(op.op_def.input_arg, inputs)}
            kwargs.update({a.name: op.get_attr(a.name) for a in op.op_def.attr})
            with ops.device(op.device):
                update = tte_ops.raw_op(_IN_PLACE[bare])(
                    name=op.name.rsplit("/", 1)[-1] + "InPlace", **kwargs)
            # TF's pipelining mark (pipeline_execution_with_tensor_core), which
            # the kernel reads (kernels/sparsecore/pipeline.h).
            if _PIPELINE_ATTR in op.node_def.attr:
                mark = op.node_def.attr[_PIPELINE_ATTR]
                update._set_attr(_PIPELINE_ATTR, mark)  # pylint: disable=protected-access
            done[op.name] = update
    return done[op.name]


class TPUEmbeddingShardedVariable(tpu_embedding_v3.TPUEmbeddingShardedVariable):
    """TF's sharded table variable, whose reads and assigns in a replica
    context reach the replica's own shard (module doc, seam 4)."""

    def _replica_id(self):
        """The replica of the enclosing ``strategy.run`` of this variable's
        strategy, or None (cross-replica or another strategy)."""
        context = distribute_lib.get_replica_context()
        if context is None or context.strategy is not self._distribute_strategy:
            return None
        return values_util.get_current_replica_id_as_int()

    def _component_on(self, device):
        want = device_util.canonicalize(device)
        for value in self._values:
            if device_util.canonicalize(value.device) == want:
                return value
        raise ValueError("TPUEmbeddingShardedVariable %s has no shard on %s (its shards: %s)"
                         % (self._common_name, device, [v.device for v in self._values]))

    def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
        replica = self._replica_id()
        if replica is None:
            return super()._dense_var_to_tensor(dtype=dtype, name=name, as_ref=as_ref)
        return self._values[replica].read_value()

    def read_value(self):
        replica = self._replica_id()
        if replica is None:
            return super().read_value()  # TF's NotImplementedError in cross-replica mode
        return self._values[replica].read_value()

    def assign(self, value, use_locking=False, name=None, read_value=True):
        replica = self._replica_id()
        if replica is None:
            # TF's host path: the value goes to every device's shard.
            for device in self.distribute_strategy.extended.worker_devices:
                self.assign_on_device(device, value)
            return self if read_value else None
        component = self._values[replica]
        update = _in_place_update(component, value)
        if update is None:
            return component.assign(value, use_locking=use_locking, name=name,
                                    read_value=read_value)
        if not read_value:
            return update
        with ops.control_dependencies([update]):
            return component.read_value()

    def assign_on_device(self, device, value):
        with ops.device(device):
            self._component_on(device).assign(value)

    def read_from_device(self, device):
        with ops.device(device):
            return self._component_on(device).read_value()


class TPUEmbeddingV2(tpu_embedding_v3.TPUEmbeddingV2):
    """``tf.tpu.experimental.embedding.TPUEmbeddingV2`` on the stand-in
    SparseCore TPU: TF's class; its table variables are
    :class:`TPUEmbeddingShardedVariable` (module doc, seams 4 and 5)."""

    def enqueue(self, features, weights=None, device=None):
        """TF's ``enqueue``; ``device`` may be a replica's device of the
        stand-in (``strategy.extended.worker_devices[k]``, ``/device:CPU:k``),
        which stands for that chip's TPU device (module doc, seam 9)."""
        if device is not None and self._is_replica_device(device):
            device = None  # TF's host path: the same host, /device:CPU:0
        return super().enqueue(features, weights, device)

    def _is_replica_device(self, device):
        want = device_util.canonicalize(device)
        return any(device_util.canonicalize(d) == want
                   for d in self._strategy.extended.worker_devices)

    def _variable_creator(self, next_creator, **kwargs):
        variable = super()._variable_creator(next_creator, **kwargs)
        sharded = tpu_embedding_v3.TPUEmbeddingShardedVariable
        if type(variable) is sharded:  # pylint: disable=unidiomatic-typecheck
            variable.__class__ = TPUEmbeddingShardedVariable
        return variable

