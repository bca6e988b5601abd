"""The cross-host data path of one model whose tables are sharded over hosts.

:class:`ShardedEngine` drives the S host engines of an
:class:`~tf_tpu_emb.cluster.hosts.EmbeddingHosts` cluster (host k = task k of
its job, engine replica r = the task's CPU device r) the way
``tf_tpu_emb.TPUEmbedding`` drives one local engine:

* ``configure``: ``ConfigureTPUEmbeddingHostShard(config, host_id=k)`` on every host
  (the config's ``num_hosts`` = S): host k allocates only shard k of every
  table and slot (empty for a table of fewer than S rows, TF's layout);
* ``load`` / ``retrieve``: a whole table (TF's TPU-embedding layout, the same
  whatever S) cut into the S shards of the config's sharding strategy and
  loaded with ``num_shards=S, shard_id=k``, and reassembled after retrieval
  (``tf_tpu_emb.cluster.checkpoint``);
* ``enqueue``: the worker's router (:mod:`tf_tpu_emb.cluster.routing`)
  checks the replica's batch and packs, per host, only what its rows need;
  each host enqueues its packed part (``EnqueueTPUEmbeddingRoutedBatch``);
* ``recv``: each host returns only its part (the bags it holds ids of, or
  its distinct rows) in one tensor; the worker combines them into the
  replica's activations;
* ``send``: the worker splits the activation gradients into one tensor per
  host (the rows of its bags, or each of its rows' summed gradient) and each
  host applies the update of its rows once every replica of every worker has
  sent (the engine's step protocol): one synchronous global update.  A batch
  any host would refuse is refused by the worker's route, before any host
  sees it.

So one replica's step moves one tensor per host and phase (batch, partial
activations, gradients).  Enqueue, Recv and Send of all hosts are built in
the caller's function, so one ``tf.function`` step carries every host's
part, and every host op is marked :func:`~tf_tpu_emb.cluster.ordering.per_host`
(the worker's router ops as one more "host"): TF keeps program order among
one host's ops and runs the hosts' parts in parallel.
"""
import tensorflow as tf

from tf_tpu_emb import layout as layout_lib
from tf_tpu_emb import ops
from tf_tpu_emb import send as send_lib
from tf_tpu_emb.cluster import checkpoint
from tf_tpu_emb.cluster import ordering
from tf_tpu_emb.cluster import routing

WORKER = "worker"  # the ordering key of the worker's router ops


class ShardedEngine:
    """The engines of ``hosts`` holding one model's tables, sharded.

    ``config``: the serialized ``TPUEmbeddingConfiguration`` (its
    ``num_hosts`` = ``hosts.num_hosts``); ``features``: one
    :class:`~tf_tpu_emb.cluster.routing.FeatureRoute` per feature descriptor.
    """

    def __init__(self, hosts, config, features):
        from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as pb
        proto = pb.TPUEmbeddingConfiguration.FromString(config)
        if proto.num_hosts != hosts.num_hosts:
            raise ValueError("the config's num_hosts is {} but the cluster has {} hosts"
                             .format(proto.num_hosts, hosts.num_hosts))
        self.hosts = hosts
        self.config = config
        self.num_hosts = hosts.num_hosts
        self.sharding = checkpoint.sharding_of(proto.sharding_strategy)
        self.router = routing.Router(config, features, self.num_hosts)
        # Hosts apply a step's update after their Send returned (the next
        # Recv waits for it): the worker routes the next batch meanwhile.
        self.background_updates = True
        self.configured = False

    def _device(self, k, replica=0):
        return self.hosts.device(k, replica)

    # ------------------------------------------------------------ lifecycle

    def configure(self):
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
        self.wait_for_hosts()
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
        self.router.shutdown()
        if not self.configured:
            return
        self.configured = False
        for k in range(self.num_hosts):
            with tf.device(self._device(k)):
                ops.shutdown_tpu_embedding()

    def wait_for_hosts(self):
        """Eagerly: returns once every op sent to the hosts so far has run.
        TF's remote eager ops return before the host runs them, and a step
        function sent next can run on a host before them (seen on loopback
        hosts: a first step finding no engine, the configure still queued).
        One answered op per host drains its queue."""
        if not tf.executing_eagerly():
            return
        for k in range(self.num_hosts):
            with tf.device(self._device(k)):
                ops.is_tpu_embedding_initialized().numpy()

    # ---------------------------------------------------------- tables

    def load(self, handles, table_name, values):
        """Loads a whole table's state tensors (``handles.tensors`` order,
        each ``[vocabulary_size, dim]``) into every host's shard (eagerly:
        done on every host when it returns)."""
        values = [tf.convert_to_tensor(v) for v in values]
        for k in range(self.num_hosts):
            shards = [checkpoint.shard_rows(v, self.num_hosts, k, self.sharding) for v in values]
            with tf.device(self._device(k)):
                ordering.per_host(handles.load(*shards, num_shards=self.num_hosts,
                                               shard_id=k, table_name=table_name), k)
        self.wait_for_hosts()

    def retrieve(self, handles, table_name):
        """The whole table's state tensors, reassembled from every host."""
        per_host = []
        for k in range(self.num_hosts):
            with tf.device(self._device(k)):
                values = ordering.per_host(
                    handles.retrieve(num_shards=self.num_hosts, shard_id=k,
                                     table_name=table_name), k)
            per_host.append([values] if isinstance(values, tf.Tensor) else list(values))
        return [checkpoint.assemble([h[i] for h in per_host], self.sharding)
                for i in range(len(per_host[0]))]

    # ---------------------------------------------------------- the step

    def enqueue(self, indices, values, weights, mode, replica, name=None):
        """Routes one replica's ArbitraryTensorBatch inputs on this worker and
        enqueues each host's packed part on that host's replica device."""
        batches, _, _ = self.router.route(indices, values, weights, mode, replica, name=name)
        ordering.per_host(batches, WORKER)
        enqueues = []
        for k, batch in enumerate(batches):
            with tf.device(self._device(k, replica)):
                enqueues.append(ordering.per_host(ops.enqueue_tpu_embedding_routed_batch(
                    batch, name=None if name is None else "{}_host{}".format(name, k)), k))
        return None if tf.executing_eagerly() else tf.group(enqueues)

    def recv(self, num_outputs, replica, name=None):
        """The replica's activations, combined from every host's part."""
        if num_outputs != len(self.router.features):
            raise ValueError("recv: the config has {} outputs, not {}"
                             .format(len(self.router.features), num_outputs))
        parts = []
        for k in range(self.num_hosts):
            with tf.device(self._device(k, replica)):
                parts.append(ordering.per_host(
                    ops.recv_tpu_embedding_routed_activations(name=name), k))
        return list(ordering.per_host(self.router.combine(parts, replica, name=name), WORKER))

    def send(self, layout, gradients, learning_rates, replica, control_inputs=None,
             name=None):
        """Splits the replica's activation gradients per host and sends each
        host its part."""
        inputs = layout_lib.send_inputs(layout, gradients)
        rates = send_lib.learning_rates_for(layout, learning_rates)
        with tf.control_dependencies(send_lib._control_ops(control_inputs)):  # pylint: disable=protected-access
            parts = ordering.per_host(self.router.split(inputs, rates, replica, name=name),
                                      WORKER)
        sends = []
        for k, part in enumerate(parts):
            with tf.device(self._device(k, replica)):
                sends.append(ordering.per_host(ops.send_tpu_embedding_routed_gradients(
                    part, background=self.background_updates, name=name), k))
        return None if tf.executing_eagerly() else tf.group(sends)
