"""`tf_tpu_emb.TPUEmbedding`: TF's mid-level TPU embedding API, running on CPU.

The surface is that of ``tf.tpu.experimental.embedding.TPUEmbedding`` (v2):
``build``, ``enqueue``, ``dequeue``, ``apply_gradients``,
``embedding_tables``, with the same output-shape rules and validation
errors, and it takes TF's own ``TableConfig`` / ``FeatureConfig`` /
``QuantizationConfig`` and optimizer objects (plus ours, in
``tf_tpu_emb.optimizers``, for the algorithms TF's Python lacks).  Instead of
a TPU it drives this library's CPU engine:

* ``build`` writes the ``TPUEmbeddingConfiguration`` (one feature descriptor
  per feature, as TF's v2 does), configures the engine, creates host
  variables (parameters + slots, named as TF names them) and loads them.
* ``enqueue`` -> ``EnqueueTPUEmbeddingArbitraryTensorBatch``; ``dequeue`` ->
  ``RecvTPUEmbeddingActivations``; ``apply_gradients`` ->
  ``SendTPUEmbeddingGradients`` (the engine applies each table's optimizer).
* **Strategies**: the default strategy, ``OneDeviceStrategy`` and
  ``MirroredStrategy`` over N logical CPU devices: replica k runs on CPU
  device k and is the engine's replica k (``num_tensor_cores`` = number of
  replicas).  Inside ``strategy.run`` each replica enqueues with its own
  replica id; outside it, per-replica inputs (distributed values) are
  enqueued one op per replica.  All replicas' gradients make one update of
  the global batch.  Under a real ``TPUStrategy`` the constructor returns
  TF's own ``TPUEmbedding`` instead.
* **Checkpoints**: the host variables are ordinary trackable children with
  TF's names (``<table>`` for the parameters, ``<table>/<slot>`` for slots),
  so ``tf.train.Checkpoint(embedding=...)`` writes TF's TPU embedding layout;
  a registered checkpoint callback retrieves the engine's tables into them
  before a save and loads them into the engine after a restore.  Checkpoints
  therefore move between this class, TF's ``TPUEmbedding`` and
  ``TPUEmbeddingForServing``.
* **Several hosts** (``cluster=``, a ``tf_tpu_emb.cluster.EmbeddingHosts``):
  every table is sharded over the cluster's embedding hosts
  (``sharding_strategy`` DIV_DEFAULT or MOD); ``tf_tpu_emb.cluster.sharded``
  configures, loads, routes, sums and sends across them.  ``workers=(index,
  count)``: this process is worker ``index`` of ``count`` client processes
  training the model; its replica r is the engine's replica
  ``index * replicas + r``, worker 0 configures and loads (the others build
  after it).  The dense part is the caller's: each worker computes it for its
  replicas (keep it in sync with a multi-worker strategy, as for any
  data-parallel model).  Checkpoints stay whole tables.

This module is one concept, TF's ``TPUEmbedding`` surface, and at about 680
lines it is over the ~600-line mark on purpose: the parts that are not the
class's own contract already live elsewhere (shape rules in ``layout``, the
Send in ``send``, engine ownership in ``engine_registry``, table descriptors in
``optimizers``).
"""
import collections.abc
import copy
import dataclasses
import logging
import weakref

import tensorflow as tf
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as config_pb2
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.saved_model import registration
from tensorflow.python.distribute import tpu_strategy
from tensorflow.python.tpu import tpu_embedding_v2
from tensorflow.python.tpu import tpu_embedding_v2_utils
from tensorflow.python.trackable import autotrackable
from tensorflow.python.util import nest

from tf_tpu_emb import engine_registry
from tf_tpu_emb import layout as layout_lib
from tf_tpu_emb import ops
from tf_tpu_emb import optimizers as optimizers_lib
from tf_tpu_emb import send as send_lib
from tf_tpu_emb import structure
from tf_tpu_emb import table_views

_logger = logging.getLogger(__name__)


# TF's own class, held privately: the public name
# tf.tpu.experimental.embedding.TPUEmbedding is this class under the CPU
# stand-in for the TPU system (tf_tpu_emb.tpu), and __new__ must not recurse.
_TF_TPU_EMBEDDING = tpu_embedding_v2.TPUEmbedding


def _tpu_system(strategy):
    """The CPU stand-in's TPU system (``tf_tpu_emb.tpu``) `strategy` runs on, or None."""
    return getattr(strategy.extended, "tf_tpu_emb_system", None)


def _under_tpu_strategy():
    """A real TPU strategy (TF's classes, not the CPU stand-in)."""
    strategy = tf.distribute.get_strategy()
    return (isinstance(strategy, (tpu_strategy.TPUStrategyV2, tpu_strategy.TPUStrategy))
            and _tpu_system(strategy) is None)


# The graphs (tf.function traces, TF1 graphs) holding an enqueue, per engine:
# a dequeue built in one of them, or in a graph nested in one, follows its
# step's enqueue; any other dequeue first asserts that a batch is there.
_ENQUEUED_IN = weakref.WeakKeyDictionary()  # graph -> {engine name}


def _note_enqueue(engine):
    if not tf.executing_eagerly():
        _ENQUEUED_IN.setdefault(tf.compat.v1.get_default_graph(), set()).add(engine)


def _enqueued_in_this_step(engine):
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    while graph is not None:
        if engine in _ENQUEUED_IN.get(graph, ()):
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


class _HostVariable(resource_variable_ops.ResourceVariable):
    """A table's host variable.  When a checkpoint restores it (eagerly) it
    calls ``on_restore`` so that the owner reloads the table into the
    engine: checkpoints written by TF's own classes (or by plain variables)
    do not carry this module's checkpoint callback, whose restore hook
    therefore never runs for them."""

    on_restore = None

    @property
    def variables(self):
        """The shards of the table state as TF's TPU variables list them (TF's
        tests read ``.variables[0]``): one, the whole table."""
        return [self]

    def _restore_from_tensors(self, restored_tensors):
        result = super()._restore_from_tensors(restored_tensors)
        if self.on_restore is not None and tf.executing_eagerly():
            self.on_restore()  # pylint: disable=not-callable
        return result


def _plain_variable(initial_value, name, trainable):
    """A host variable that never becomes a distributed one, whatever
    strategy scope is active (ResourceVariable bypasses the creator stack).
    It records that strategy as the one it was created under, so that a Keras
    optimizer creating slots for it (TFRS's translated optimizers) accepts it."""
    strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    with tf.init_scope(), tf.device("/CPU:0"):
        return _HostVariable(initial_value=initial_value, name=name, trainable=trainable,
                             distribute_strategy=strategy)


def _flatten_shapes(shapes):
    """``build``'s per-replica input shapes, flattened (TF compares flattened
    structures), each shape -- a ``TensorShape`` or a list/tuple of ints and
    None -- one leaf."""
    def to_shapes(x):
        if isinstance(x, tf.TensorShape) or (
                isinstance(x, (list, tuple)) and all(d is None or isinstance(d, int) for d in x)):
            return tf.TensorShape(x)
        if isinstance(x, collections.abc.Mapping):
            return {k: to_shapes(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [to_shapes(v) for v in x]
        return x
    return nest.flatten(to_shapes(shapes))


class TPUEmbedding(autotrackable.AutoTrackable):
    """TF's ``tf.tpu.experimental.embedding.TPUEmbedding`` on CPU (see module doc).

    ```python
    table = tf.tpu.experimental.embedding.TableConfig(1000, 16, name="video")
    feature_config = {"watched": tf.tpu.experimental.embedding.FeatureConfig(table)}
    embedding = tf_tpu_emb.TPUEmbedding(
        feature_config, tf.tpu.experimental.embedding.Adagrad(0.1))
    embedding.build(per_replica_batch_size=64)

    embedding.enqueue({"watched": sparse_ids}, training=True)
    with tf.GradientTape() as tape:
        activations = embedding.dequeue()
        tape.watch(activations)
        loss = model(activations)
    embedding.apply_gradients(tape.gradient(loss, activations))
    ```
    """

    def __new__(cls, feature_config=None, optimizer=None,
                pipeline_execution_with_tensor_core=False, **cluster_options):
        if _under_tpu_strategy():
            # A real TPU: TF's own implementation drives the hardware.
            return _TF_TPU_EMBEDDING(feature_config, optimizer,
                                     pipeline_execution_with_tensor_core)
        return super().__new__(cls)

    def __init__(self, feature_config, optimizer,
                 pipeline_execution_with_tensor_core=False, *, cluster=None,
                 sharding_strategy="DIV_DEFAULT", workers=(0, 1)):
        self._cluster = cluster
        self._sharding = config_pb2.TPUEmbeddingConfiguration.ShardingStrategy.Value(
            sharding_strategy)
        self._worker, self._num_workers = (int(w) for w in workers)
        if not 0 <= self._worker < self._num_workers or (
                cluster is None and (self._worker, self._num_workers) != (0, 1)):
            raise ValueError("workers={!r}: must be (index, count) with 0 <= index < count, "
                             "and only with cluster=".format(workers))
        self._sharded = None
        self._feature_config = feature_config
        self._pipeline = bool(pipeline_execution_with_tensor_core)
        self._flat_features = nest.flatten(feature_config)
        self._paths = [p for p, _ in nest.flatten_with_joined_string_paths(feature_config)]
        for path, feature in zip(self._paths, self._flat_features):
            if not isinstance(feature, tpu_embedding_v2_utils.FeatureConfig):
                raise ValueError("Feature {} is a {}, not a "
                                 "tf.tpu.experimental.embedding.FeatureConfig."
                                 .format(path, type(feature).__name__))
        # Tables in order of first use, named and given the global optimizer
        # exactly as TF's TPUEmbedding does (TF mutates the TableConfigs too).
        self._table_config = []
        for feature in self._flat_features:
            if feature.table not in self._table_config:
                self._table_config.append(feature.table)
        names = []
        for i, table in enumerate(self._table_config):
            if table.optimizer is None:
                table.optimizer = optimizer
            if table.optimizer is not None and not isinstance(table.optimizer, tpu_embedding_v2_utils._Optimizer):  # pylint: disable=protected-access
                raise ValueError("{} is an unsupported optimizer class. Please pass an "
                                 "instance of one of the optimizer classes under "
                                 "tf.tpu.experimental.embedding or tf_tpu_emb."
                                 .format(type(table.optimizer)))
            if table.name is None:
                table.name = "table_{}".format(i)
            if table.name in names:
                raise ValueError("Tables must have a unique name. "
                                 f"Multiple tables with name {table.name} found.")
            names.append(table.name)
        # Dynamic inputs (callable learning rates, ...) get tags in order of
        # first appearance, deduplicated by identity, as in TF.
        self._dynamic_inputs = []
        for table in self._table_config:
            for fn in optimizers_lib.dynamic_input_fns(self._optimizer_of(table)):
                if not any(fn is known for known in self._dynamic_inputs):
                    self._dynamic_inputs.append(fn)
        self._output_shapes = [tf.TensorShape(f.output_shape) for f in self._flat_features]
        self._combiners = [t.combiner for t in self._table_config]
        self._strategy = tf.distribute.get_strategy()
        self._num_replicas = self._strategy.num_replicas_in_sync
        self._engine_replicas = self._num_replicas * self._num_workers
        self._built = False
        self._config = None
        self._engine = None  # the name of the engine build configured
        # A front end that keeps one engine name across the objects it
        # creates (the Keras layer, after a release) sets this before build.
        self._engine_name = None
        self._layout = None
        self._variables = {}

    # ------------------------------------------------------------- properties

    @property
    def feature_config(self):
        """The nested feature config this object was created with."""
        return self._feature_config

    @property
    def config_proto(self):
        """The serialized ``TPUEmbeddingConfiguration`` (after ``build``)."""
        self._require_built("config_proto")
        return self._config

    @property
    def embedding_tables(self):
        """``{TableConfig: parameters variable}``, retrieved from the engine
        (also indexed by table name: a per-shard view, see ``table_views``).

        As TF's class off TPU, this works before ``build`` too: it creates the
        host variables (initialised, or restored from a checkpoint restored
        before) without configuring the engine; a later ``build`` loads them.
        (TF's own class refuses this under ``TPUStrategy``.)"""
        if self._built:
            self._retrieve_variables()
        else:
            self._ensure_variables()
        return table_views.EmbeddingTables(
            {t: self._variables[t.name]["parameters"] for t in self._table_config},
            num_shards=self._num_replicas)

    # ------------------------------------------------------------------ build

    def build(self, per_replica_input_shapes=None, per_replica_batch_size=None):
        """Fixes the output shapes, configures the engine and creates and loads
        the tables (see ``tf.tpu.experimental.embedding.TPUEmbedding.build``).

        The argument forms are TF's:

        * ``build(per_replica_input_shapes=...)``: input shapes (``TensorShape``
          or lists) in the feature config's structure, or any structure with
          the same *flattened* length (a flat list for a nested config);
        * ``build(64)`` / ``build(per_replica_batch_size=64)``: an ``int``,
          passed either way, is the per-replica batch size (TensorFlow
          Recommenders' embedding layer calls ``build(batch_size)``);
        * ``build()``: shapes from ``FeatureConfig.output_shape`` only
          (``enqueue`` builds from its inputs when nothing was given).

        Shapes already set (``FeatureConfig.output_shape``) win; incoming ones
        that contradict them raise TF's ``ValueError`` ("Inconsistent shape
        founded for input feature ...").  Unlike TF, which ignores
        ``per_replica_batch_size`` when both are given, passing both is a
        ``ValueError``.  On TPU this call also initialises the TPU system for
        embeddings; here it configures this process's CPU engine, and if
        anything fails after that the engine is released again, so a fresh
        object can be built.
        """
        if self._built:
            return
        if per_replica_input_shapes is not None and per_replica_batch_size is not None:
            raise ValueError("Only one of per_replica_input_shapes and "
                             "per_replica_batch_size can be specified.")
        if isinstance(per_replica_input_shapes, int) and not isinstance(
                per_replica_input_shapes, bool):
            _logger.warning("Passing batch size to per_replica_input_shapes argument will be "
                            "deprecated, please specify all the input shapes using "
                            "per_replica_input_shapes argument.")
            per_replica_input_shapes, per_replica_batch_size = None, per_replica_input_shapes
        incoming = None
        if per_replica_input_shapes is not None:
            flat_shapes = _flatten_shapes(per_replica_input_shapes)
            nest.assert_same_structure(flat_shapes, self._flat_features)
            incoming = self._output_shapes_from_input_shapes(flat_shapes)
        elif per_replica_batch_size is not None:
            incoming = self._output_shapes_from_batch_size(per_replica_batch_size)
        if incoming is not None:
            self._check_output_shapes(incoming)
            self._update_output_shapes(incoming)
        for path, shape in zip(self._paths, self._output_shapes):
            if shape.rank is None or not shape.is_fully_defined():
                raise ValueError(
                    f"Input Feature {path} has output shape set as {shape} which is not "
                    "fully defined. Please specify the fully defined shape in either "
                    "FeatureConfig or for the build method.")
        with tf.init_scope():
            system = _tpu_system(self._strategy)
            if system is not None:  # one TPU embedding per (stand-in) TPU system
                self._engine_name = system.embedding_engine()
            # Variables a learning-rate callable creates on first use (Keras'
            # optimizer.iterations behind a schedule) are created now, not
            # inside the first traced step.
            for fn in self._dynamic_inputs:
                fn()
            self._config = self._create_config_proto().SerializeToString()
            self._configure()
            try:
                self._layout = dataclasses.replace(layout_lib.Layout.for_features(
                    self._config, [t.name for t in self._table_config],
                    [t.dim for t in self._table_config],
                    [(path, self._table_config.index(f.table), shape.as_list())
                     for path, f, shape in zip(self._paths, self._flat_features,
                                               self._output_shapes)],
                    len(self._dynamic_inputs)), engine=self._engine)
                self._ensure_variables()
                self._built = True
                self._load_variables()
            except BaseException:
                # Leave nothing configured behind: a fresh object (or this one,
                # retried) must be able to build.
                self._built = False
                self._release()
                raise

    def _configure(self):
        """Configures an engine of this object's own (README "Several engines
        per process": other TPUEmbedding objects and the default engine are
        untouched), or (``cluster=``) every host's default engine."""
        if self._cluster is None:
            self._engine = (self._engine_name if self._engine_name is not None
                            else engine_registry.new_name())
            ops.configure_tpu_embedding(self._config, engine=self._engine)
            engine_registry.claim(self, self._engine)
            return
        self._engine = ""  # each host process's default engine
        from tf_tpu_emb.cluster import sharded  # pylint: disable=import-outside-toplevel
        self._sharded = sharded.ShardedEngine(self._cluster, self._config, [
            sharded.routing.FeatureRoute(path, shape.as_list(), f.table.vocabulary_size,
                                         f.table.combiner)
            for path, f, shape in zip(self._paths, self._flat_features, self._output_shapes)])
        if self._worker == 0:
            self._sharded.configure()
        else:
            self._sharded.attach()

    def _release(self):
        if self._sharded is not None:
            if self._worker == 0:
                self._sharded.shutdown()
        else:
            engine_registry.release(self)

    def _output_shapes_from_input_shapes(self, input_shapes):
        out = []
        for shape, feature in zip(input_shapes, self._flat_features):
            if shape.rank is None or shape.rank < 1:
                raise ValueError("Received input tensor of shape {}. Rank must be 1 and above"
                                 .format(shape))
            out.append(tf.TensorShape(layout_lib.output_shape(feature, shape.as_list())))
        return out

    def _output_shapes_from_batch_size(self, batch_size):
        return [tf.TensorShape([batch_size, f.max_sequence_length])
                if not f.output_shape and f.max_sequence_length > 0
                else tf.TensorShape([batch_size]) for f in self._flat_features]

    def _check_output_shapes(self, incoming):
        """TF's check of incoming output shapes against those already set."""
        for path, old, new in zip(self._paths, self._output_shapes, incoming):
            if not old.rank or not new.rank:
                continue
            if new.rank in (1, 2) and old.rank > new.rank:
                continue  # ragged / sequence shapes are checked by the engine
            if old.rank != new.rank or any(a and b and a != b
                                           for a, b in zip(old.as_list(), new.as_list())):
                raise ValueError(
                    f"Inconsistent shape founded for input feature {path}, Output shape is "
                    f"set to be {old}, But got incoming output shape {new}")

    def _update_output_shapes(self, incoming):
        # Shapes already set (FeatureConfig.output_shape, build) win.
        self._output_shapes = [old if old.rank else new
                               for old, new in zip(self._output_shapes, incoming)]

    def _create_config_proto(self):
        config = config_pb2.TPUEmbeddingConfiguration()
        for table in self._table_config:
            optimizers_lib.table_descriptor_for(
                table, optimizer=self._optimizer_of(table),
                learning_rate_index=self._dynamic_inputs,
                table_descriptor=config.table_descriptor.add())
        for path, feature, shape in zip(self._paths, self._flat_features, self._output_shapes):
            # The engine names a feature in its errors by the descriptor's
            # name: the user's key path ("user/friends").
            config.feature_descriptor.add(
                table_id=self._table_config.index(feature.table),
                input_shape=shape.as_list(), name=path)
        config.mode = config_pb2.TPUEmbeddingConfiguration.TRAINING
        config.num_hosts = 1 if self._cluster is None else self._cluster.num_hosts
        config.num_tensor_cores = self._engine_replicas
        config.sharding_strategy = self._sharding
        config.pipeline_execution_with_tensor_core = self._pipeline
        return config

    # -------------------------------------------------------------- variables

    def _ensure_variables(self):
        """Creates the host variables once (``embedding_tables`` may have
        created them before ``build``)."""
        if not self._variables:
            with tf.init_scope():
                self._variables = self._create_variables_and_slots()

    def _create_variables_and_slots(self):
        """Host variables named as TF names them, created through
        ``_add_variable_with_custom_getter`` so that a checkpoint restored
        before ``build`` initialises them directly (as in TF)."""
        variables = {}
        for table in self._table_config:
            shape = (table.vocabulary_size, table.dim)

            def getter(name, shape, dtype, initializer, trainable, _shape=shape):
                del shape
                return _plain_variable(lambda: initializer(_shape, dtype=dtype), name, trainable)

            def creator(name, initializer, trainable, _shape=shape):
                return self._add_variable_with_custom_getter(
                    name=name, initializer=initializer, shape=_shape, dtype=tf.float32,
                    getter=getter, trainable=trainable)

            parameters = creator(table.name, table.initializer, trainable=False)
            # Slots a user's slot_variable_creation_fn makes with tf.Variable
            # become host variables too (as TF's creator scope makes them TPU
            # variables on a TPU), not variables of the active strategy.
            with tf.variable_creator_scope(lambda _, **kw: _plain_variable(
                    kw["initial_value"], kw.get("name"), kw.get("trainable", False))):
                slots = self._optimizer_of(table)._create_slots(  # pylint: disable=protected-access
                    parameters, lambda name, init, t=table: creator(t.name + "/" + name, init,
                                                                    False))
            slots["parameters"] = parameters
            variables[table.name] = slots
            owner = weakref.ref(self)
            for var in slots.values():
                if isinstance(var, _HostVariable):
                    var.on_restore = (lambda t=table: owner() is not None
                                      and owner()._load_table(t))  # pylint: disable=protected-access
        return variables

    @staticmethod
    def _optimizer_of(table):
        """The table's optimizer; for ``optimizer=None`` (TF's serving-only
        form: no slot variables) the engine runs the table with a
        learning-rate-0 SGD, which has no slots, and ``apply_gradients`` is
        refused."""
        if table.optimizer is None:
            return tpu_embedding_v2_utils.SGD(learning_rate=0.0)
        return table.optimizer

    def _table_ops(self, table):
        """The typed Load/Retrieve handles of the table's optimizer."""
        return ops.table_ops(optimizers_lib.info_of(self._optimizer_of(table)).proto_field)

    @property
    def layout(self):
        """Where each feature sits in the engine's outputs
        (:class:`tf_tpu_emb.layout.Layout`, feature names = paths; after ``build``)."""
        self._require_built("layout")
        return self._layout

    def _load_variables(self):
        """Host variables -> engine (also TF's checkpoint callback's entry point)."""
        for table in self._table_config:
            self._load_table(table)

    def _load_table(self, table):
        """One table's host variables -> engine (no-op unless this object is
        built and owns the engine)."""
        if not self._built or not (engine_registry.is_owner(self) or
                                   self._sharded is not None and self._sharded.configured):
            return
        with tf.init_scope():
            self._load_state(table, [self._variables[table.name][n]
                                     for n in self._table_ops(table).tensors])

    def _retrieve_variables(self):
        """Engine -> host variables."""
        with tf.init_scope():
            for table in self._table_config:
                for n, value in zip(self._table_ops(table).tensors, self._retrieve_state(table)):
                    self._variables[table.name][n].assign(value)

    def _load_state(self, table, values):
        """A whole table's state tensors (``_table_ops(table).tensors`` order)
        -> the engine, or (``cluster=``) every host's shard of it."""
        handles = self._table_ops(table)
        if self._sharded is not None:
            return self._sharded.load(handles, table.name, values)
        return handles.load(*values, num_shards=1, shard_id=0, table_name=table.name,
                            engine=self._engine)

    def _retrieve_state(self, table):
        """A whole table's state tensors from the engine (or the hosts)."""
        handles = self._table_ops(table)
        if self._sharded is not None:
            return self._sharded.retrieve(handles, table.name)
        values = handles.retrieve(num_shards=1, shard_id=0, table_name=table.name,
                                  engine=self._engine)
        return [values] if isinstance(values, tf.Tensor) else list(values)

    # ---------------------------------------------------------------- enqueue

    def enqueue(self, features, weights=None, training=True, name=None, device=None):
        """Enqueues one step of ids (``features``, same structure as the
        feature config: dense ``tf.Tensor``, ``tf.SparseTensor`` or
        ``tf.RaggedTensor``; optional ``weights`` of the same kinds) for the
        next ``dequeue``.  Builds the object from the input shapes if needed.

        In ``strategy.run`` the replica's own id picks the engine queue;
        outside it, per-replica (distributed) inputs are enqueued to every
        replica, ``device`` names the one replica plain inputs go to (TF maps
        a TPU device to its core; here a replica's CPU device, or ``/TPU:k``
        for replica k), and plain inputs without ``device`` go to every
        replica, as TF's do.  ``training`` is a Python or tensor bool
        (False: an inference batch, which no ``apply_gradients`` may follow).
        ``name`` names the op; on TPU it tags the enqueue for the TPU
        compiler instead.  TPU-only in TF, and not done here: the check that
        inputs are not on a TPU device, and the outside-compilation rewrite of
        an enqueue inside a TPU replica function.
        """
        structure.assert_same_structure(self._feature_config, features, "enqueue(features)")
        flat_weights = [None] * len(self._flat_features)
        if weights is not None:
            structure.assert_same_structure(self._feature_config, weights, "enqueue(weights)")
            flat_weights = nest.flatten(weights)
        flat_inputs = nest.flatten(features)
        # Inside strategy.run of a (non-default) strategy: a replica context.
        in_replica_fn = tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()
        distributed = any(isinstance(x, tf.distribute.DistributedValues) for x in flat_inputs)
        # Plain inputs outside strategy.run with several replicas go to every
        # replica, as TF's enqueue does (distribute_utils.select_replica).
        every_replica = not in_replica_fn and device is None and self._num_replicas > 1

        def local(x):
            if isinstance(x, tf.distribute.DistributedValues):
                return self._strategy.experimental_local_results(x)
            return [x] * self._num_replicas

        if distributed or every_replica:
            per_replica = [local(x) for x in flat_inputs]
            per_replica_w = [local(w) for w in flat_weights]
            devices = self._strategy.extended.worker_devices
            enqueues = []
            for r in range(self._num_replicas):
                inputs_r = [x[r] for x in per_replica]
                weights_r = [w[r] for w in per_replica_w]
                self._maybe_build(inputs_r)
                with tf.device(devices[r]):
                    enqueues.append(self._enqueue_op(inputs_r, weights_r, training, r, name))
            return tf.group(enqueues) if not tf.executing_eagerly() else None
        self._maybe_build(flat_inputs)
        if in_replica_fn:
            ordinal = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group,
                              tf.int32)
            return self._enqueue_op(flat_inputs, flat_weights, training, ordinal, name,
                                    dynamic=True)
        if device is not None:
            replica = self._replica_of_device(device)
            with tf.device(self._replica_devices()[replica]):
                return self._enqueue_op(flat_inputs, flat_weights, training, replica, name)
        return self._enqueue_op(flat_inputs, flat_weights, training, 0, name)

    def _replica_of_device(self, device):
        """The replica ``enqueue(device=...)`` feeds.  TF maps a TPU device to
        its index (``/device:TPU:k`` -> queue k); here a replica is a CPU
        device, so one of the strategy's worker devices (or ``/CPU:k`` /
        ``/TPU:k`` with k < replicas, for code written for a TPU) picks
        replica k."""
        spec = tf.DeviceSpec.from_string(device)
        if spec.device_type not in ("CPU", "TPU"):
            raise ValueError("Non-TPU device {} passed to enqueue.".format(device))
        for k, worker in enumerate(self._replica_devices()):
            worker = tf.DeviceSpec.from_string(worker)
            if spec.device_type == "CPU" and worker.make_merged_spec(spec) == worker:
                return k
        index = spec.device_index or 0
        if spec.device_type == "CPU" or not 0 <= index < self._num_replicas:
            raise ValueError(
                "enqueue(device={!r}): device index {} is not a replica of this "
                "strategy ({} replica(s): {})".format(
                    device, index, self._num_replicas,
                    list(self._replica_devices())))
        return index

    def _replica_devices(self):
        """The device of each replica (the default strategy has no
        ``worker_devices``: its one replica is the host CPU)."""
        try:
            return tuple(self._strategy.extended.worker_devices)
        except RuntimeError:
            return ("/job:localhost/replica:0/task:0/device:CPU:0",)

    def _maybe_build(self, flat_inputs):
        shapes = []
        for path, x, feature in zip(self._paths, flat_inputs, self._flat_features):
            shapes.append(self._input_shape(path, x, feature))
        incoming = self._output_shapes_from_input_shapes(shapes)
        self._check_output_shapes(incoming)
        if not self._built:
            self._update_output_shapes(incoming)
            self.build()

    @staticmethod
    def _input_shape(path, x, feature):
        shape = None
        if isinstance(x, (tf.SparseTensor, tf.RaggedTensor)) and x.shape.rank is not None:
            shape = x.shape.as_list()
        if isinstance(x, tf.SparseTensor):
            if shape is None or len(shape) < 2:
                raise ValueError("Only rank 2 and above sparse tensor is supported, find "
                                 "rank {} sparse tensor for input {}"
                                 .format(None if shape is None else len(shape), path))
            return tf.TensorShape(shape)
        if isinstance(x, tf.RaggedTensor):
            if shape is None or len(shape) != 2:
                raise ValueError("Only rank 2 ragged tensor is supported, find rank {} "
                                 "ragged tensor for input {}"
                                 .format(None if shape is None else len(shape), path))
            return tf.TensorShape(shape)
        if isinstance(x, tf.Tensor) or hasattr(x, "shape"):
            x = tf.convert_to_tensor(x)
            shape = x.shape.as_list()
            if len(shape) < 1:
                raise ValueError("Only rank 1 and above dense tensor is supported, find "
                                 "rank {} sparse tensor for input {}".format(len(shape), path))
            if len(shape) > 1 and shape[-1] != 1:
                raise ValueError(
                    "Rank 2 or above dense tensor should have last dimension as 1 as the "
                    "last dimension will always be reduced. Instead got dense tensor as "
                    "shape {}".format(shape))
            return tf.TensorShape(shape)
        raise ValueError("Input {} is of unknown type {}. Please only pass Tensor, "
                         "SparseTensor or RaggedTensor as input to enqueue."
                         .format(path, type(x)))

    def _enqueue_op(self, flat_inputs, flat_weights, training, device_ordinal, name,
                    dynamic=False):
        indices, values, weights = [], [], []
        int_zeros = tf.zeros([0], tf.int32)
        float_zeros = tf.zeros([0], tf.float32)
        for path, x, w, feature in zip(self._paths, flat_inputs, flat_weights,
                                       self._flat_features):
            if isinstance(x, tf.SparseTensor):
                sample_indices = tf.cast(x.indices, tf.int32)
                if (x.shape.rank == 2 and not feature.output_shape
                        and feature.max_sequence_length > 0):
                    sample_indices = tf.pad(sample_indices, [[0, 0], [0, 1]])
                indices.append(sample_indices)
                values.append(tf.cast(x.values, tf.int64))
                if w is not None and not isinstance(w, tf.SparseTensor):
                    raise ValueError("Weight for {} is type {} which does not match type "
                                     "input which is SparseTensor.".format(path, type(w)))
                weights.append(float_zeros if w is None else tf.cast(w.values, tf.float32))
            elif isinstance(x, tf.RaggedTensor):
                indices.append(tf.cast(x.row_splits, tf.int32))
                values.append(tf.cast(x.values, tf.int64))
                if w is not None and not isinstance(w, tf.RaggedTensor):
                    raise ValueError("Weight for {} is type {} which does not match type "
                                     "input which is RaggedTensor.".format(path, type(w)))
                weights.append(float_zeros if w is None else tf.cast(w.values, tf.float32))
            else:
                if w is not None:
                    raise ValueError("Weight specified for dense input {}, which is not "
                                     "allowed. Weight will always be 1 in this case."
                                     .format(path))
                indices.append(int_zeros)
                values.append(tf.cast(tf.reshape(x, [-1]), tf.int64))
                weights.append(float_zeros)
        if isinstance(training, bool):
            mode = "train" if training else "inference"
        else:
            mode = tf.where(tf.convert_to_tensor(training), "train", "inference")
        combiners = self._combiners
        if self._sharded is not None:
            return self._sharded.enqueue(indices, values, weights, mode,
                                         self._engine_replica(device_ordinal), name=name)
        _note_enqueue(self._engine)
        if dynamic:
            return ops.dynamic_enqueue_tpu_embedding_arbitrary_tensor_batch(
                indices, values, weights, device_ordinal, combiners=combiners,
                mode_override=mode, engine=self._engine, name=name)
        return ops.enqueue_tpu_embedding_arbitrary_tensor_batch(
            indices, values, weights, device_ordinal=device_ordinal, combiners=combiners,
            mode_override=mode, engine=self._engine, name=name)

    # ------------------------------------------------------ dequeue / gradients

    def _require_built(self, what):
        if not self._built:
            raise RuntimeError("{} called on unbuilt TPUEmbedding object. Please either "
                               "call enqueue first or manually call the build method."
                               .format(what))

    def dequeue(self, name=None):
        """This replica's activations for the oldest enqueued step, in the
        feature config's structure (each ``output_shape + [dim]``)."""
        self._require_built("dequeue")
        if self._sharded is not None:
            outputs = self._sharded.recv(len(self._flat_features),
                                         self._engine_replica(self._replica_id()), name=name)
        else:
            # A dequeue that no enqueue of its step precedes fails at once
            # when nothing is enqueued, instead of waiting (README "Waits").
            checks = [] if _enqueued_in_this_step(self._engine) else [
                ops.assert_tpu_embedding_enqueued("TPUEmbedding.dequeue()", engine=self._engine)]
            with tf.control_dependencies(checks):
                outputs = ops.recv_tpu_embedding_activations(
                    num_outputs=len(self._flat_features), config=self._config,
                    engine=self._engine, name=name)
        return nest.pack_sequence_as(self._feature_config, outputs)

    def apply_gradients(self, gradients, name=None):
        """Sends this replica's dL/d(activations) (structure of the feature
        config; ``None`` = zeros, with a warning) to the engine, which applies
        every table's optimizer once all replicas have sent."""
        self._require_built("apply_gradients")
        no_optimizer = [t.name for t in self._table_config if t.optimizer is None]
        if no_optimizer:
            raise ValueError(
                "apply_gradients called on a TPUEmbedding created with optimizer=None "
                "(tables {} have no optimizer: the serving-only form, without slot "
                "variables). Pass an optimizer to train.".format(no_optimizer))
        structure.assert_same_structure(self._feature_config, gradients,
                                        "apply_gradients(gradients)")
        updated = []
        for (path, gradient), feature in zip(nest.flatten_with_joined_string_paths(gradients),
                                             self._layout.features):
            full_shape = list(feature.shape)
            if gradient is not None and not isinstance(gradient, tf.Tensor):
                raise ValueError(f"found non-tensor type: {type(gradient)} at path {path}.")
            if gradient is None:
                send_lib.warn_missing_gradient(path, logger=_logger)
                gradient = tf.zeros(full_shape, tf.float32)
            elif gradient.shape != full_shape:
                raise ValueError("Found gradient of shape {} at path {}. Expected shape {}."
                                 .format(gradient.shape, path, full_shape))
            updated.append(gradient)
        rates = [fn() for fn in self._dynamic_inputs]
        if self._sharded is not None:
            return self._sharded.send(self._layout, updated, rates,
                                      self._engine_replica(self._replica_id()), name=name)
        return send_lib.build_send(self._layout, updated, rates, name=name)

    def _send_fn(self):
        """For ``gradients.hook_step``: None (one local engine: the Send on the
        Recv's device), or (``cluster=``) a builder of this replica's Sends to
        every host."""
        if self._sharded is None:
            return None
        replica = self._engine_replica(self._replica_id())
        return lambda gradients, rates, control_inputs=None: self._sharded.send(
            self._layout, gradients, rates, replica, control_inputs=control_inputs)

    @staticmethod
    def _replica_id():
        """This replica's id in its strategy (0 outside ``strategy.run``)."""
        if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
            return 0
        return tf.distribute.get_replica_context().replica_id_in_sync_group

    def _engine_replica(self, local_replica):
        """The engine replica (a Python int: it picks the host's device) of this
        worker's replica ``local_replica``."""
        local = tf.get_static_value(local_replica)
        if local is None:
            raise ValueError("with cluster=, the replica must be known when the step is "
                             "traced (strategy.run of a MirroredStrategy)")
        return self._worker * self._num_replicas + int(local)

    def shutdown(self):
        """Releases the engine this object configured (its tables are lost:
        save a checkpoint first) so that another TPUEmbedding can be built.
        Also done when the object is garbage-collected."""
        if self._built:
            self._release()
        self._built = False

    def __del__(self):
        try:
            self.shutdown()
        except Exception:  # pylint: disable=broad-except  (interpreter shutdown)
            pass


def _save_callback(trackables, **unused_kwargs):
    for trackable in trackables.values():
        if isinstance(trackable, TPUEmbedding) and trackable._built:  # pylint: disable=protected-access
            trackable._retrieve_variables()  # pylint: disable=protected-access
    return []


def _restore_callback(trackables, **unused_kwargs):
    for trackable in trackables.values():
        if isinstance(trackable, TPUEmbedding):
            trackable._load_variables()  # pylint: disable=protected-access


registration.register_tf_checkpoint_saver(
    "TfTpuEmbTPUEmbeddingCallback",
    predicate=lambda x: isinstance(x, TPUEmbedding),
    save_fn=_save_callback,
    restore_fn=_restore_callback,
    strict_predicate_restore=False)
