"""The cross-host data path of one model whose tables are sharded over hosts.

:class:`ShardedEngine` drives the S host engines of an
:class:`~tf_tpu_emb.cluster.hosts.EmbeddingHosts` cluster (host k = task k of
its job, engine replica r = the task's CPU device r) the way
``tf_tpu_emb.TPUEmbedding`` drives one local engine:

* ``configure``: ``ConfigureTPUEmbeddingHostShard(config, host_id=k)`` on every host
  (the config's ``num_hosts`` = S): host k allocates only shard k of every
  table and slot;
* ``load`` / ``retrieve``: a whole table (TF's TPU-embedding layout, the same
  whatever S) cut into the S shards of the config's sharding strategy and
  loaded with ``num_shards=S, shard_id=k``, and reassembled after retrieval
  (``tf_tpu_emb.cluster.checkpoint``);
* ``enqueue``: one replica's batch routed (:mod:`tf_tpu_emb.cluster.routing`)
  and enqueued on every host's replica device;
* ``recv``: every host's partial activations of the replica, summed (a row
  lives on one host, so the sum is the single-host lookup);
* ``send``: the replica's full activation gradient sent to every host; each
  host validates the whole tensor, so a gradient one host refuses every host
  refuses (no half-applied step), and each host applies the update of its
  rows once every replica of every worker has sent (the engine's step
  protocol): one synchronous global update.

Enqueue, Recv and Send of all hosts are built in the caller's function, so
one ``tf.function`` step carries every host's part, and every host op is
marked :func:`~tf_tpu_emb.cluster.ordering.per_host`: TF keeps program order
among one host's ops and runs the hosts' parts in parallel.
"""
import tensorflow as tf

from tf_tpu_emb import backend
from tf_tpu_emb import ops
from tf_tpu_emb import send as send_lib
from tf_tpu_emb.cluster import checkpoint
from tf_tpu_emb.cluster import ordering
from tf_tpu_emb.cluster import routing


class ShardedEngine(backend.Backend):
    """The engines of ``hosts`` holding one model's tables, sharded: the
    :class:`tf_tpu_emb.backend.Backend` of ``TPUEmbedding(cluster=...)``.

    ``config``: the serialized ``TPUEmbeddingConfiguration`` (its
    ``num_hosts`` = ``hosts.num_hosts``); ``features``: one
    :class:`~tf_tpu_emb.cluster.routing.FeatureRoute` per feature descriptor;
    ``replica_offset``: the engine replica of this worker's replica 0
    (``worker index * replicas per worker``).
    """

    def __init__(self, hosts, config, features, *, replica_offset=0):
        from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as pb
        proto = pb.TPUEmbeddingConfiguration.FromString(config)
        if proto.num_hosts != hosts.num_hosts:
            raise ValueError("the config's num_hosts is {} but the cluster has {} hosts"
                             .format(proto.num_hosts, hosts.num_hosts))
        self.hosts = hosts
        self.config = config
        self.num_hosts = hosts.num_hosts
        self.mod = proto.sharding_strategy == pb.TPUEmbeddingConfiguration.MOD
        self.router = routing.Router(features, self.num_hosts, self.mod)
        self.replica_offset = int(replica_offset)
        self.configured = False

    def replica(self, local_replica):
        """The engine replica (a Python int: it picks the host's device) of
        this worker's replica ``local_replica``."""
        local = tf.get_static_value(local_replica)
        if local is None:
            raise ValueError("with cluster=, the replica must be known when the step is "
                             "traced (strategy.run of a MirroredStrategy)")
        return self.replica_offset + int(local)

    def _device(self, k, replica=0):
        return self.hosts.device(k, replica)

    # ------------------------------------------------------------ lifecycle

    def configure(self, takeover=False):
        """Configures every host's engine (eagerly); RuntimeError naming the
        host when one already has an engine."""
        self.hosts.connect()
        for k in range(self.num_hosts):
            with tf.device(self._device(k)):
                if ops.is_tpu_embedding_initialized().numpy():
                    raise RuntimeError(
                        "{} already has a configured engine: another model uses it; shut "
                        "that one down first".format(self.hosts.describe(k)))
        done = []
        try:
            for k in range(self.num_hosts):
                with tf.device(self._device(k)):
                    ops.configure_tpu_embedding_host_shard(self.config, k)
                done.append(k)
        except Exception as e:  # leave no host configured behind
            for k in done:
                with tf.device(self._device(k)):
                    ops.shutdown_tpu_embedding()
            raise self.hosts.translate(e, len(done)) from None
        self.configured = True

    def attach(self):
        """Uses the engines another worker configured (and loaded: callers
        order a worker's build after worker 0's); FailedPrecondition naming
        the first host that has no engine."""
        self.hosts.connect()
        for k in range(self.num_hosts):
            with tf.device(self._device(k)):
                ready = bool(ops.is_tpu_embedding_initialized().numpy())
            if not ready:
                raise tf.errors.FailedPreconditionError(
                    None, None, "{} has no configured engine: worker 0 builds the model's "
                    "TPUEmbedding before the other workers".format(self.hosts.describe(k)))

    def shutdown(self):
        """Shuts every host's engine down (tables are lost: retrieve first)."""
        if not self.configured:
            return
        self.configured = False
        for k in range(self.num_hosts):
            with tf.device(self._device(k)):
                ops.shutdown_tpu_embedding()

    # ---------------------------------------------------------- tables

    def step_count(self):
        """Host 0's step count (every host applies every step) and whether a
        table stores bfloat16 there."""
        with tf.device(self._device(0)):
            return ops.retrieve_tpu_embedding_step_count(engine=self.engine)

    def load_step_count(self, count):
        """Every host's step count (bfloat16 rounding seeds, checkpoints)."""
        for k in range(self.num_hosts):
            with tf.device(self._device(k)):
                ops.load_tpu_embedding_step_count(count, engine=self.engine)

    def load(self, handles, table_name, values):
        """Loads a whole table's state tensors (``handles.tensors`` order,
        each ``[vocabulary_size, dim]``) into every host's shard."""
        values = [tf.convert_to_tensor(v) for v in values]
        for k in range(self.num_hosts):
            shards = [checkpoint.shard_rows(v, self.num_hosts, k, self.mod) for v in values]
            with tf.device(self._device(k)):
                ordering.per_host(handles.load(*shards, num_shards=self.num_hosts,
                                               shard_id=k, table_name=table_name), k)

    def retrieve(self, handles, table_name):
        """The whole table's state tensors, reassembled from every host."""
        per_host = []
        for k in range(self.num_hosts):
            with tf.device(self._device(k)):
                values = ordering.per_host(
                    handles.retrieve(num_shards=self.num_hosts, shard_id=k,
                                     table_name=table_name), k)
            per_host.append([values] if isinstance(values, tf.Tensor) else list(values))
        return [checkpoint.assemble([h[i] for h in per_host], self.mod)
                for i in range(len(per_host[0]))]

    # ---------------------------------------------------------- the step

    def enqueue(self, indices, values, weights, mode, replica, name=None):
        """Routes one replica's ArbitraryTensorBatch inputs and enqueues each
        host's part on that host's replica device."""
        routed = self.router.route(indices, values, weights)
        enqueues = []
        for k, (splits, ids, folded) in enumerate(routed):
            with tf.device(self._device(k, replica)):
                enqueues.append(ordering.per_host(ops.enqueue_tpu_embedding_arbitrary_tensor_batch(
                    splits, ids, folded, device_ordinal=replica,
                    combiners=self.router.host_combiners, mode_override=mode,
                    name=None if name is None else "{}_host{}".format(name, k)), k))
        return None if tf.executing_eagerly() else tf.group(enqueues)

    def recv(self, num_outputs, replica, name=None):
        """The replica's activations: the sum of every host's partial ones."""
        partials = []
        for k in range(self.num_hosts):
            with tf.device(self._device(k, replica)):
                partials.append(ordering.per_host(ops.recv_tpu_embedding_activations(
                    num_outputs=num_outputs, config=self.config, name=name), k))
        if self.num_hosts == 1:
            return list(partials[0])
        return [tf.add_n([p[o] for p in partials]) for o in range(num_outputs)]

    def send(self, layout, gradients, learning_rates, replica, control_inputs=None,
             name=None):
        """Sends the replica's activation gradients to every host."""
        sends = [ordering.per_host(
                     send_lib.build_send(layout, gradients, learning_rates, config=self.config,
                                         control_inputs=control_inputs,
                                         device=self._device(k, replica), name=name), k)
                 for k in range(self.num_hosts)]
        return None if tf.executing_eagerly() else tf.group(sends)
