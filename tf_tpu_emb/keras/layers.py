"""`TPUEmbeddingLayer`: the engine-backed mid-level API as a Keras 3 layer (TF backend).

The layer owns a :class:`tf_tpu_emb.TPUEmbedding` and, per call, enqueues the
features and dequeues their activations (one step of the engine):

* **Training** (``training=True``, e.g. inside ``model.fit``): the features are
  enqueued in ``"train"`` mode and the activations are routed through
  :func:`tf_tpu_emb.gradients.hook_step` with the layer's *dummy variables*
  (one trainable ``[1]`` weight per table).  The gradient that Keras'
  ``train_step`` takes with respect to the model's trainable weights
  (``tape.gradient(loss, trainable_weights)``) therefore builds exactly one
  ``SendTPUEmbeddingGradients`` per step, and the engine applies each table's
  TPU-embedding optimizer (the ``optimizer`` of this layer / of the
  ``TableConfig``) -- the Keras optimizer of the model never sees the tables.
  The dummy variables' gradient is zero, so the Keras optimizer leaves them at
  zero (SGD, Adam, weight decay of a zero weight, ... all keep 0); their value
  is never used.  A layer with ``trainable = False`` enqueues in inference
  mode and sends nothing.
* **Inference** (``predict``, ``evaluate``, ``training=False``, or ``None``
  outside a ``GradientTape``): ``"inference"`` mode, no Send, no bookkeeping by
  the user.  ``training=None`` under a recording tape raises: the layer
  cannot tell whether the step trains, and never silently skips training.
* **Batch size.**  The engine's activations have a fixed per-replica batch.
  It comes from ``batch_size`` (the *global* batch; divided by the number of
  replicas of the strategy), else from the static batch dimension of the first
  call that runs or is traced (per replica inside ``strategy.run``; Keras'
  first trace of ``fit``/``predict`` sees the first batch's size), else from a
  static ``keras.Input(batch_size=...)``.  Passing ``batch_size`` is the safe
  choice.  Smaller batches (the remainder batch of ``predict``/``evaluate``/
  ``fit``) are padded with empty rows and the activations cut back, so every
  batch size up to the built one works, in training too (padded rows look
  nothing up); larger ones fail with ``InvalidArgumentError``.  (Exception:
  dense ids of a *sequence* feature are padded only in inference mode.)
* **Distribution**: build and fit the model inside
  ``tf.distribute.MirroredStrategy(...).scope()`` (one replica per CPU device);
  Keras runs the layer in each replica's context, each replica enqueues to its
  own engine queue and all replicas' Sends make one update over the global
  batch (Keras scales each replica's loss by 1 / replicas, so the update
  equals a 1-replica step on the global batch).  Keras 3.15's ``fit`` under a
  strategy cannot take ``SparseTensor``/``RaggedTensor`` inputs by itself (its
  symbolic build averages the first batch across replicas and fails before
  any layer runs): the layer's constructor installs
  :func:`tf_tpu_emb.keras.fix_distributed_fit` for every model that contains
  a tf_tpu_emb layer (``distributed_fit.install_distributed_fit_fix``).
  Outside ``strategy.run`` (a direct ``model(x)`` under a multi-replica
  strategy) there is no engine queue to feed: inference calls there look up
  the layer's (engine-refreshed) weights with stock ops, training calls
  raise.
* **An engine per layer** (README "Several engines per process").  The
  layer's engine is configured lazily, by the first call that runs (not by
  building or loading a model), and released by
  :meth:`TPUEmbeddingLayer.release` (or :func:`release_engine`, for every
  layer), or when the layer is garbage collected.  Several layers, in one
  model or in several (e.g. a model and its ``keras.models.load_model`` copy),
  run side by side.  A released layer keeps its tables in its weights and
  re-acquires its engine (same name) on its next eager call or trace;
  functions Keras already traced for it (``model.predict`` ...) fail with
  FailedPrecondition until then.

**Weights.**  The engine holds the truth during training.  The layer mirrors
every table state (``parameters`` and the optimizer's slots) in a
non-trainable Keras weight named ``<table>_<state>`` on the host; the mirrors
are refreshed from the engine lazily (when ``layer.weights`` /
``model.get_weights()`` / ``model.save()`` / ``save_weights`` /
``tf.train.Checkpoint`` read them after a training step) and written back to
the engine when assigned eagerly (``set_weights``, ``load_weights``,
``load_model``, ``variable.assign``).  Before the engine is configured the
mirrors *are* the tables (the engine starts from them).

**Functional API inputs** (``keras.Input`` per feature, in the feature config's
structure, nested dicts included), all checked in ``tests/keras/test_keras_layer.py``:

* dense ids, one per sample: ``shape=()`` (``[B]``, int32 or int64),
  ``shape=(1,)`` (``[B, 1]``) or ``shape=(k, 1)`` (``[B, k]`` positions);
* dense padded bags: ``shape=(L,)`` with L > 1 (or None): each row is a bag
  (a sequence for ``max_sequence_length > 0``) and negative ids are padding;
  dense float weights of the same shape may be passed as ``weights``;
* ``sparse=True`` with ``shape=(None,)``: bags, or sequences for
  ``max_sequence_length > 0`` (column = position);
* ``ragged=True`` with ``shape=(None,)``: bags or sequences.

Weights for sparse/ragged features go to ``call(features, weights=...)`` (same
structure, ``None`` for unweighted features) in the same kind as the ids.

Serving: :func:`tf_tpu_emb.keras.export_serving` writes a SavedModel of the
whole Keras model in which the layer is a stock-op lookup
(``tf.tpu.experimental.embedding.serving_embedding_lookup``) of its weights.

Module layout: input conversion lives in :mod:`tf_tpu_emb.keras.inputs`, the
table mirrors in :mod:`tf_tpu_emb.keras.mirrors`; this file is the layer's
Keras lifecycle (build, acquire/release of the engine, call, saving).
"""
# The layer is one class and is kept in one file although the file is a
# little over 600 lines.
import contextlib
import re
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Mapping,
                    MutableMapping, Optional, Union)

import keras
import tensorflow as tf
from tensorflow.python.eager import record
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.tpu import tpu_embedding_v2_utils as v2_utils
from tensorflow.python.util import nest

from tf_tpu_emb import engine_registry
from tf_tpu_emb import layout as layout_lib
from tf_tpu_emb import mid_level
from tf_tpu_emb import optimizers as optimizers_lib
from tf_tpu_emb import signatures as signatures_lib
from tf_tpu_emb import structure
from tf_tpu_emb.keras import config as config_lib
from tf_tpu_emb.keras import distributed_fit
from tf_tpu_emb.keras import inputs as inputs_lib
from tf_tpu_emb.keras import mirrors as mirrors_lib

try:  # Keras-internal: Keras' symbolic traces.
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope
except ImportError:  # pragma: no cover
    def in_symbolic_scope():
        return False

__all__ = ["TPUEmbeddingLayer", "release_engine", "engine_owner", "stock_lookup"]

if TYPE_CHECKING:  # annotations only: the cluster package is imported on use
    from tf_tpu_emb.cluster import hosts as hosts_lib

def engine_owner() -> Optional["TPUEmbeddingLayer"]:
    """The :class:`TPUEmbeddingLayer` that most recently configured an engine
    and still holds it, or None (each layer holds an engine of its own)."""
    layers = [h for h in engine_registry.holders() if isinstance(h, TPUEmbeddingLayer)]
    return layers[-1] if layers else None


def release_engine() -> bool:
    """Releases the engines held by every :class:`TPUEmbeddingLayer` (their
    tables are kept in their weights).  Returns True if a layer held one."""
    layers = [h for h in engine_registry.holders() if isinstance(h, TPUEmbeddingLayer)]
    for layer in layers:
        layer.release()
    return bool(layers)


def _safe(name):
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", str(name))


class _State:
    """Per-layer Python state that must stay invisible to Keras' and TF's
    trackers (feature configs, the mid-level object, bookkeeping)."""

    def __init__(self):
        self.feature_config = None
        self.optimizer = None
        self.table_optimizers = {}
        self.flat_features = []
        self.embedding = None        # tf_tpu_emb.TPUEmbedding (after build)
        self.tables = []             # TableConfigs, engine (table id) order
        self.dummies = []            # Keras variables, by table id
        self.mirrors = []            # per table: [(state name, mirrors.TableVariable)]
        self.acquired = False        # the engine is configured by this layer
        self.per_replica_batch = None
        self.num_replicas = 1
        self.batch_hint = None       # static global batch seen at build
        self.counter = None          # tf.Variable: training steps sent
        self.synced_at = None        # counter value when the mirrors were current
        self.syncing = False
        self.stock = 0               # > 0: stock-op lookup (serving export)


@keras.saving.register_keras_serializable(package="tf_tpu_emb")
class TPUEmbeddingLayer(keras.layers.Layer):
    """TPU embedding lookups (tables trained by the engine's optimizer) as a Keras layer.

    Args:
      feature_config: nested structure (dicts, lists, tuples) of
        ``tf.tpu.experimental.embedding.FeatureConfig``; the call's ``features``
        and its output have this structure.  Also accepts the dict form of
        :func:`tf_tpu_emb.keras.config.serialize_feature_config` (``get_config``).
      optimizer: the TPU-embedding optimizer of tables whose ``TableConfig``
        has none (``tf.tpu.experimental.embedding.SGD/Adagrad/Adam/FTRL/...`` or
        ``tf_tpu_emb.Momentum/...``).  A callable learning rate is a dynamic
        learning rate, evaluated at every training step (inside
        ``tf.function``: make it read a variable).  Also accepts its
        serialised dict form (``get_config``).
      pipeline_execution_with_tensor_core: as for
        :class:`tf_tpu_emb.TPUEmbedding`: each step's
        lookup may run before the previous step's update (it never sees it).
      batch_size: the global batch size (per replica: divided by the number of
        replicas).  Optional when the first call has a static batch dimension.
      cluster: as for :class:`tf_tpu_emb.TPUEmbedding`: the tables are sharded over the
        embedding hosts of ``cluster`` (not serialised by ``get_config``: a
        loaded model runs on one engine unless given one).
      sharding_strategy: as for :class:`tf_tpu_emb.TPUEmbedding` (with ``cluster``).
      **kwargs: ``keras.layers.Layer`` arguments (``name``, ``trainable``, ...).

    ``call(features, weights=None, training=None)`` returns the activations
    (``output shape + [dim]`` per feature, float32).  See the module docstring
    for training, inference, weights, distribution and the engine's lifetime.
    """

    _tf_tpu_emb_layer = True  # models containing it get the distributed-fit fix

    def __init__(self,
                 feature_config: Union[v2_utils.FeatureConfig, Iterable, Dict[str, Any]],
                 optimizer: "Optional[Union[optimizers_lib.Optimizer, Dict[str, Any]]]" = None,
                 pipeline_execution_with_tensor_core: bool = False,
                 batch_size: Optional[int] = None, *,
                 cluster: Optional["hosts_lib.EmbeddingHosts"] = None,
                 sharding_strategy: str = "DIV_DEFAULT", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._cluster_options = {} if cluster is None else dict(
            cluster=cluster, sharding_strategy=sharding_strategy)
        distributed_fit.install_distributed_fit_fix()
        feature_config, optimizer = config_lib.layer_arguments(feature_config, optimizer)
        flat = nest.flatten(feature_config)
        if not flat:
            raise ValueError("feature_config has no FeatureConfig.")
        for f in flat:
            if not isinstance(f, v2_utils.FeatureConfig):
                raise ValueError("feature_config leaves must be "
                                 "tf.tpu.experimental.embedding.FeatureConfig, got %r" % (f,))
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError("batch_size must be a positive int, got %r" % (batch_size,))
        state = _State()
        state.feature_config = feature_config
        state.optimizer = optimizer
        state.flat_features = flat
        # TPUEmbedding gives tables without optimizer the global one in place;
        # remember which had none, for get_config.
        for f in flat:
            state.table_optimizers.setdefault(id(f.table), f.table.optimizer)
        self._state = state
        self._pipeline = bool(pipeline_execution_with_tensor_core)
        self._batch_size = batch_size
        self.supports_jit = False  # custom stateful ops: no XLA

    # ------------------------------------------------------------ properties

    @property
    def feature_config(self):
        """The nested ``FeatureConfig`` structure."""
        return self._state.feature_config

    @property
    def embedding(self):
        """The underlying :class:`tf_tpu_emb.TPUEmbedding` (None before ``build``)."""
        return self._state.embedding

    @property
    def engine_acquired(self):
        """Whether this layer's tables currently live in the process's engine."""
        return self._state.acquired

    @property
    def per_replica_batch_size(self):
        """The engine's per-replica batch (None until the engine is configured)."""
        return self._state.per_replica_batch

    @property
    def dummy_variables(self):
        """The trainable ``[1]`` weights (one per table) carrying the Send."""
        return list(self._state.dummies)

    @property
    def weights(self):
        # Keras' get_weights/save paths read this: refresh the mirrors first.
        if getattr(self, "_state", None) is not None:
            self.sync_from_engine()
        return super().weights

    def table_variables(self):
        """``{table name: {state name: Keras weight}}`` (refreshed from the engine)."""
        self.sync_from_engine()
        return {t.name: dict(m) for t, m in zip(self._state.tables, self._state.mirrors)}

    @property
    def embedding_tables(self):
        """``{TableConfig: parameters tf.Variable}`` (refreshed from the engine), the
        interface of ``tf_tpu_emb.export_serving``."""
        self.sync_from_engine()
        return {t: dict(m)["parameters"].value
                for t, m in zip(self._state.tables, self._state.mirrors)}

    # ----------------------------------------------------------------- build

    def _new_embedding(self):
        st = self._state
        return mid_level.TPUEmbedding(st.feature_config, st.optimizer, self._pipeline,
                                      **self._cluster_options)

    def build(self, input_shape: Any = None) -> None:
        st = self._state
        st.embedding = self._new_embedding()
        st.tables = st.embedding.tables
        st.dummies, st.mirrors = [], []
        for tid, table in enumerate(st.tables):
            tname = _safe(table.name)
            st.dummies.append(self.add_weight(
                name="%s_dummy" % tname, shape=(1,), initializer="zeros", dtype="float32",
                trainable=True))
            opt = table.optimizer
            inits = dict(zip(opt._slot_names(),  # pylint: disable=protected-access
                             opt._slot_initializers()))  # pylint: disable=protected-access
            names = st.embedding.table_state_names(table)
            mirrors = []
            for name in names:
                init = table.initializer if name == "parameters" else inits.get(name)
                if init is None:
                    initializer = "zeros"
                else:
                    def initializer(shape, dtype=None, _i=init):
                        return _i(shape, dtype=tf.as_dtype(dtype or "float32"))
                with self._open_name_scope():
                    var = mirrors_lib.TableVariable(
                        initializer=initializer, shape=(table.vocabulary_size, table.dim),
                        dtype="float32", trainable=False, name="%s_%s" % (tname, name),
                        owner=self, table_id=tid, state=name)
                self._track_variable(var)
                mirrors.append((name, var))
            st.mirrors.append(mirrors)
        st.batch_hint = inputs_lib.batch_hint(st.feature_config, input_shape)
        with tf.init_scope(), tf.device("/CPU:0"):
            st.counter = resource_variable_ops.ResourceVariable(
                tf.constant(0, tf.int64), trainable=False, name="tpu_embedding_train_steps")
        self.built = True

    # --------------------------------------------------------------- engine

    def _num_replicas(self):
        """Replicas of the strategy the layer was built under (= engine replicas)."""
        emb = self._state.embedding
        return emb.num_replicas if emb is not None else 1

    def _per_replica_batch(self, flat_inputs):
        replicas = self._num_replicas()
        if self._batch_size is not None:
            if self._batch_size % replicas:
                raise ValueError("batch_size %d is not divisible by the %d replicas."
                                 % (self._batch_size, replicas))
            return self._batch_size // replicas, replicas
        static = next((b for b in map(inputs_lib.static_batch, flat_inputs) if b is not None),
                      None)
        in_replica = tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()
        if static is not None and (in_replica or replicas == 1):
            return static, replicas
        hint = self._state.batch_hint
        if hint is not None and hint % replicas == 0:
            return hint // replicas, replicas
        raise ValueError(
            "TPUEmbeddingLayer '%s' cannot tell its batch size: the engine needs a fixed "
            "per-replica batch. Pass batch_size=<global batch size> to the layer, or feed "
            "batches with a static batch dimension (e.g. dataset.batch(n, "
            "drop_remainder=True), keras.Input(batch_size=n))." % self.name)

    def _acquire(self, flat_inputs):
        """Configures the engine for this layer (once) and loads the mirrors into it."""
        st = self._state
        if st.acquired:
            return st.embedding
        if not self.built:
            raise RuntimeError("TPUEmbeddingLayer '%s' is not built." % self.name)
        batch, replicas = self._per_replica_batch(flat_inputs)
        shapes = []
        for x in flat_inputs:
            shape = x.shape.as_list() if x.shape.rank is not None else None
            if not shape:
                raise ValueError("TPUEmbeddingLayer inputs need a known rank >= 1, got %r"
                                 % (x,))
            shapes.append(tf.TensorShape([batch] + shape[1:]))
        with tf.init_scope():
            # Each layer's TPUEmbedding configures an engine of its own; after
            # a release the same object builds again (same engine name, so
            # functions traced before address it again).
            if st.embedding is None:
                st.embedding = self._new_embedding()
            emb = st.embedding
            try:
                emb.build(per_replica_input_shapes=nest.pack_sequence_as(st.feature_config,
                                                                         shapes))
            except Exception:
                # Do not leave a half-built engine configured behind.
                emb.shutdown()
                st.embedding = None
                raise
            st.acquired = True
            engine_registry.set_holder(emb, self)
            st.per_replica_batch, st.num_replicas = batch, replicas
            self._load_tables()
            st.synced_at = int(st.counter.numpy())
        return emb

    def release(self) -> None:
        """Retrieves the tables into the layer's weights and shuts the engine down,
        so that another layer (or a loaded copy of this model) can run."""
        st = self._state
        if st.acquired:
            with tf.init_scope():
                self.sync_from_engine(force=True)
                st.embedding.shutdown()
        st.acquired = False

    def _load_tables(self, table_ids=None):
        """Mirrors -> engine (no-op while the engine is not configured by this layer)."""
        st = self._state
        if not st.acquired:
            return
        with tf.init_scope():
            for tid in (range(len(st.tables)) if table_ids is None else table_ids):
                table = st.tables[tid]
                st.embedding.load_table(table, [v.value for _, v in st.mirrors[tid]])

    # The mirror protocol: public hooks for the table mirrors
    # (mirrors.TableVariable) and the module's helpers (stock_lookup, export).

    def sync_from_engine(self, force: bool = False) -> None:
        """Engine -> mirrors, if a training step may have changed the tables
        (``force``: in any case).  A no-op where the engine's ops may not run
        now (not eager, inside a replica context), while the layer writes its
        mirrors itself, and without an engine configured by this layer."""
        st = self._state
        if not st.acquired or st.syncing or not mirrors_lib.eager_host_context():
            return
        with tf.init_scope():
            steps = int(st.counter.numpy())
            if not force and steps == st.synced_at:
                return
            st.syncing = True
            try:
                for tid, table in enumerate(st.tables):
                    values = st.embedding.retrieve_table(table)
                    for (_, var), value in zip(st.mirrors[tid], values):
                        var.value.assign(value)
            finally:
                st.syncing = False
            st.synced_at = steps

    def assign_mirror(self, variable: "mirrors_lib.TableVariable",
                      value: "tf.types.experimental.TensorLike",
                      assign: Callable[[Any], Any]) -> Any:
        """An assignment of `value` to `variable`, one of this layer's table
        mirrors; ``assign(value)`` is the plain assignment.  Where the
        engine's ops may run (eager, outside a replica context) and not while
        the layer writes its mirrors itself: bring the table's other states
        up to date, assign, write the table to the engine.  Elsewhere just
        ``assign(value)``."""
        if self._state.syncing or not mirrors_lib.eager_host_context():
            return assign(value)
        self.sync_from_engine()
        result = assign(value)
        self._load_tables([variable.table_id])
        return result

    def mirror_restored(self, variable: "mirrors_lib.TableVariable") -> None:
        """A checkpoint restored `variable`, one of this layer's table mirrors:
        its table goes to the engine (where the engine's ops may run now)."""
        if mirrors_lib.eager_host_context():
            self._load_tables([variable.table_id])

    # ------------------------------------------------------------------ call

    def _learning_rates_fn(self):
        """The dynamic learning rates for hook_step, also counting the step.

        A closure over the step counter and the dynamic inputs only: TF keeps
        graph-mode custom gradients (and so this function) in a global registry,
        which must not keep the layer alive (the engine is released when the
        layer is garbage collected).
        """
        counter = self._state.counter
        fns = self._state.embedding.dynamic_learning_rates

        def learning_rates():
            counter.assign_add(1)  # runs with the Send: the tables are about to change
            return [tf.cast(fn(), tf.float32) for fn in fns]

        return learning_rates

    def __call__(self, features, weights=None, **kwargs):
        # Keras before 3.15 (the last for Python 3.10 is 3.12) reads `.shape`
        # of every leaf of a nested call argument to build the layer, a None
        # leaf (a feature without weights) included.  The build needs no
        # shapes: build first, and Keras skips its own.
        if (not self.built and weights is not None
                and any(w is None for w in nest.flatten(weights))):
            self.build()
        return super().__call__(features, weights=weights, **kwargs)

    def call(self, features: Union[tf.Tensor, tf.SparseTensor, tf.RaggedTensor, Iterable],
             weights: Optional[Union[tf.SparseTensor, tf.RaggedTensor, Iterable]] = None,
             training: Optional[bool] = None) -> Union[tf.Tensor, Iterable]:
        st = self._state
        structure.assert_same_structure(st.feature_config, features, "the layer's features",
                                        check_types=False)
        if weights is not None:
            structure.assert_same_structure(st.feature_config, weights, "the layer's weights",
                                            check_types=False)
        flat_x = nest.flatten_up_to(st.feature_config, features)
        flat_w = (nest.flatten_up_to(st.feature_config, weights) if weights is not None
                  else [None] * len(flat_x))
        if in_symbolic_scope():
            # Keras tracing the model for shapes (backend.compute_output_spec,
            # e.g. the symbolic build of fit under a strategy): no engine.
            return nest.pack_sequence_as(st.feature_config, [
                tf.zeros(tf.stack([inputs_lib.dynamic_batch(x)] + [d or 1 for d in dims[1:]]),
                         self.compute_dtype)
                for x, dims in zip(flat_x, self._output_dims(flat_x))])
        flat_x, flat_w = inputs_lib.dense_bags_to_sparse(flat_x, flat_w)
        pack = lambda xs: nest.pack_sequence_as(st.feature_config, xs)  # noqa: E731
        train = self._training_mode(training)
        replicas = self._num_replicas()
        in_replica = tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()
        cross_replica = (replicas > 1 and not in_replica and
                         not any(isinstance(x, tf.distribute.DistributedValues)
                                 for x in flat_x))
        if cross_replica and train:
            raise ValueError(
                "TPUEmbeddingLayer '%s': a training call with %d replicas must run inside "
                "strategy.run (model.fit does that)." % (self.name, replicas))
        if st.stock or cross_replica:
            # Stock-op lookup of the (engine-refreshed) weights: the serving
            # export, and inference calls outside strategy.run under a
            # multi-replica strategy (no engine queue to feed there).
            if cross_replica:
                self.sync_from_engine()
            return self._stock_call(pack(flat_x), None if all(w is None for w in flat_w)
                                    else pack(flat_w))
        emb = self._acquire(flat_x)
        flat_x, flat_w, actual = self._pad(flat_x, flat_w, st.per_replica_batch, train)
        # Program order (tf.function's automatic control dependencies, per
        # host with cluster=) runs the Recv after the enqueue.
        emb.enqueue(pack(flat_x), None if all(w is None for w in flat_w) else pack(flat_w),
                    training=train)
        outputs = nest.flatten(emb.dequeue())
        if train:
            outputs = emb.hook_step(st.dummies, outputs, self._learning_rates_fn())
        if actual is not None:
            outputs = [a[:actual] for a in outputs]
        if self.compute_dtype != "float32":
            outputs = [tf.cast(a, self.compute_dtype) for a in outputs]
        return pack(outputs)

    def _training_mode(self, training):
        """Whether this call trains.  Keras passes its learning phase down
        (``fit``: True, ``evaluate``/``predict``: False, an outer call's
        ``training``); ``None`` means nobody said.  Then no gradient can reach
        the tables unless a ``GradientTape`` is recording -- and under a tape
        the layer cannot tell a training step from, e.g., an input-gradient
        computation, so it raises rather than silently never training."""
        if training is None and record.could_possibly_record() and self.trainable:
            raise ValueError(
                "TPUEmbeddingLayer '%s' was called with training=None under a recording "
                "GradientTape: pass training=True for a training step (the engine then "
                "applies the tables' optimizer) or training=False for a lookup only."
                % self.name)
        return inputs_lib.as_bool(training) and self.trainable

    def _pad(self, flat_x, flat_w, batch, train):
        """Pads a smaller batch to the engine's with empty rows; returns the inputs
        and the actual batch (None when nothing was padded)."""
        if all(inputs_lib.static_batch(x) == batch for x in flat_x):
            return flat_x, flat_w, None
        actual = inputs_lib.dynamic_batch(flat_x[0])
        check = tf.debugging.assert_less_equal(
            actual, tf.constant(batch, tf.int32),
            message="TPUEmbeddingLayer '%s': a batch of more samples per replica than the "
                    "engine's per-replica batch size %d (set batch_size=)" % (self.name, batch))
        deps = [] if tf.executing_eagerly() or check is None else [check]
        new_x, new_w = [], []
        with tf.control_dependencies(deps):
            for x, w, f in zip(flat_x, flat_w, self._state.flat_features):
                if isinstance(x, tf.SparseTensor):
                    new_x.append(inputs_lib.pad_sparse(x, batch))
                    new_w.append(None if w is None else inputs_lib.pad_sparse(w, batch))
                elif isinstance(x, tf.RaggedTensor):
                    new_x.append(inputs_lib.pad_ragged(x, batch))
                    new_w.append(None if w is None else inputs_lib.pad_ragged(w, batch))
                else:
                    x = tf.convert_to_tensor(x)
                    new_w.append(w)
                    sequence = f.max_sequence_length > 0 and not (
                        f.output_shape is not None and f.output_shape.rank)
                    if sequence:
                        if train:
                            eq = tf.debugging.assert_equal(
                                tf.shape(x)[0], batch,
                                message="TPUEmbeddingLayer: dense ids of a sequence "
                                "feature need the full batch in training")
                            with tf.control_dependencies(
                                    [] if tf.executing_eagerly() or eq is None else [eq]):
                                new_x.append(tf.identity(x))
                        else:
                            pad = [[0, batch - tf.shape(x)[0]]] + [[0, 0]] * (x.shape.rank - 1)
                            new_x.append(tf.pad(x, pad))
                    elif x.shape.rank == 1:
                        n = tf.shape(x, out_type=tf.int64)[0]
                        splits = tf.concat([tf.range(n + 1, dtype=tf.int64),
                                            tf.fill([batch - n], n)], 0)
                        new_x.append(tf.RaggedTensor.from_row_splits(x, splits, validate=False))
                    else:
                        indices = tf.where(tf.ones_like(x, dtype=tf.bool))
                        shape = tf.concat([[batch], tf.shape(x, out_type=tf.int64)[1:]], 0)
                        sp = tf.SparseTensor(indices, tf.reshape(x, [-1]), shape)
                        sp.set_shape([batch] + x.shape.as_list()[1:])
                        new_x.append(sp)
        return new_x, new_w, actual

    # ------------------------------------------------------ stock-op lookup

    def _stock_call(self, features, weights):
        st = self._state
        tables = {t: dict(m)["parameters"].value for t, m in zip(st.tables, st.mirrors)}
        # Dense ids [B, ..., 1]: one id per position, as on the engine (TF's
        # serving lookup would keep the trailing 1).
        features = nest.map_structure(
            lambda x: tf.squeeze(x, -1) if isinstance(x, tf.Tensor) and x.shape.rank
            and x.shape.rank >= 2 and x.shape[-1] == 1 else x, features)
        out = signatures_lib.serving_embedding_lookup(
            features, weights, tables, st.feature_config)
        if self.compute_dtype != "float32":
            out = nest.map_structure(lambda a: tf.cast(a, self.compute_dtype), out)
        return out

    def compute_output_spec(
            self, features: Union["keras.KerasTensor", Iterable],
            weights: Optional[Union["keras.KerasTensor", Iterable]] = None,
            training: Optional[bool] = None) -> Union["keras.KerasTensor", Iterable]:
        st = self._state
        flat = nest.flatten_up_to(st.feature_config, features)
        out = [keras.KerasTensor(tuple(dims), dtype=self.compute_dtype)
               for dims in self._output_dims(flat)]
        return nest.pack_sequence_as(st.feature_config, out)

    def _output_dims(self, flat):
        """Per feature, the activation's dims (batch dim as in the input)."""
        out = []
        for x, f in zip(flat, self._state.flat_features):
            shape = list(x.shape)
            batch = shape[0] if shape else None
            if f.output_shape is not None and f.output_shape.rank:
                dims = [batch] + f.output_shape.as_list()[1:]
            else:  # ragged inputs are [batch, None]: bags, or sequences
                dims = layout_lib.output_shape(f, shape)
            out.append(list(dims) + [f.table.dim])
        return out

    # -------------------------------------------------------------- saving

    def get_config(self):
        config = super().get_config()
        st = self._state
        batch = self._batch_size
        if batch is None and st.per_replica_batch is not None:
            batch = st.per_replica_batch * st.num_replicas
        config.update({
            "feature_config": config_lib.serialize_feature_config(
                st.feature_config, st.optimizer, st.table_optimizers),
            "pipeline_execution_with_tensor_core": self._pipeline,
            "batch_size": batch,
        })
        return config

    def save_own_variables(self, store: MutableMapping[str, Any]) -> None:
        st = self._state
        if not self.built:
            return
        self.sync_from_engine()
        for tid, dummy in enumerate(st.dummies):
            store["dummy_%d" % tid] = dummy.numpy()
        for tid, mirrors in enumerate(st.mirrors):
            for name, var in mirrors:
                store["table_%d_%s" % (tid, name)] = var.numpy()

    def load_own_variables(self, store: Mapping[str, Any]) -> None:
        st = self._state
        expected = (["dummy_%d" % t for t in range(len(st.dummies))] +
                    ["table_%d_%s" % (t, n) for t, m in enumerate(st.mirrors) for n, _ in m])
        missing = [k for k in expected if k not in store.keys()]
        if missing:
            raise ValueError("TPUEmbeddingLayer '%s': the saved weights lack %s (they have "
                             "%s)." % (self.name, missing, sorted(store.keys())))
        st.syncing = True
        try:
            for tid, dummy in enumerate(st.dummies):
                dummy.assign(store["dummy_%d" % tid])
            for tid, mirrors in enumerate(st.mirrors):
                for name, var in mirrors:
                    var.assign(store["table_%d_%s" % (tid, name)])
        finally:
            st.syncing = False
        if st.acquired:
            self._load_tables()
            st.synced_at = int(st.counter.numpy())


@contextlib.contextmanager
def stock_lookup(
        model_or_layers: Union["keras.layers.Layer", Iterable["TPUEmbeddingLayer"]]
) -> Iterator[List["TPUEmbeddingLayer"]]:
    """Within this context the :class:`TPUEmbeddingLayer` s of a model (or the given
    layers) look up their (engine-refreshed) weights with stock TF ops
    (``serving_embedding_lookup``) instead of the engine: what a serving export
    traces.  No engine is needed."""
    if isinstance(model_or_layers, TPUEmbeddingLayer):
        layers = [model_or_layers]
    elif isinstance(model_or_layers, keras.layers.Layer):
        layers = [layer for layer in model_or_layers._flatten_layers()  # pylint: disable=protected-access
                  if isinstance(layer, TPUEmbeddingLayer)]
    else:
        layers = list(model_or_layers)
    for layer in layers:
        layer.sync_from_engine()
        layer._state.stock += 1  # pylint: disable=protected-access
    try:
        yield layers
    finally:
        for layer in layers:
            layer._state.stock -= 1  # pylint: disable=protected-access
