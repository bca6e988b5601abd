"""`tf_tpu_emb.TPUEmbeddingV0`: TF's ``tf.tpu.experimental.embedding.TPUEmbeddingV0``
(plain-variable embeddings trained by ordinary optimizers) for any strategy.

The surface is TF's (``tensorflow/python/tpu/tpu_embedding_v1.py``): it
subclasses ``TPUEmbeddingBase``, so table collection, naming, the optimizer
defaulting and the variable layout (``<table>`` for the parameters,
``<table>/<slot>`` for the slots created by the embedding optimizer, or by
its ``slot_variable_creation_fn``) are TF's; ``build()``,
``embedding_tables`` (``{TableConfig: variable}``), ``embedding_lookup``,
``__call__`` and the validation errors (same texts) behave as TF's.  The
differences:

* **Any strategy.**  TF's class refuses anything but ``TPUStrategy``; this one
  records the strategy it is created under (default, ``OneDeviceStrategy``,
  ``MirroredStrategy`` ...) and creates its variables in that strategy's
  scope (mirrored under ``MirroredStrategy``), also when it is first built
  lazily inside ``strategy.run`` (one ``merge_call``).  Lookups run per
  replica inside ``strategy.run``.
* **Fused lookups.**  Sparse, ragged and dense non-sequence features use the
  fused multi-threaded :func:`tf_tpu_emb.embedding_bag.embedding_bag` op (one
  op per feature, no densified ``[B, L]`` id tensor): ``sum``, ``mean``
  (``/ sum w``) and ``sqrtn`` (``/ sqrt(sum w^2)``), 0 where the denominator
  is 0 -- exactly TF's ``div_no_nan`` arithmetic.  Sequence features and the
  ragged ``output_shape = k * batch`` case use ``tf.gather``.
* **Gradients are** ``tf.IndexedSlices`` **with unique row ids**, one per
  table per lookup call (like ``tf.nn.embedding_lookup_sparse``, which looks
  up unique ids).  Keras 3 optimizers do not merge duplicate indices (Adagrad
  and Adam square every slice separately), so unique rows are what makes
  ``optimizer.apply_gradients`` on these gradients equal to the dense
  gradient's update.
* **Padding of gathered sequences is zero.**  TF's V0 pads a ragged sequence
  feature (and the ragged ``output_shape = k * batch`` case) with id 0 at
  weight 1, i.e. with ``table[0]`` (and sends gradient to row 0); here, as in
  TF's own sparse sequence path, the TPU engine and
  ``tf.tpu.experimental.embedding.serving_embedding_lookup``, padded
  positions are zeros.
* Sparse features of rank > 2 with ``max_sequence_length`` ignore it (with a
  warning, as TF's serving lookup does) instead of failing.

Training with a Keras optimizer, as in TF's docstring:

    optimizer = keras.optimizers.Adagrad(0.1)
    embedding = tf_tpu_emb.TPUEmbeddingV0(
        feature_config,
        tf.tpu.experimental.embedding.Adagrad(
            0.1, slot_variable_creation_fn=keras_slot_variable_creation_fn(optimizer)))
    with tf.GradientTape() as tape:
        tape.watch(embedding.embedding_tables.values())
        activations = embedding(features)
        loss = ...
    tables = list(embedding.embedding_tables.values())
    optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))

:func:`keras_slot_variable_creation_fn` is the Keras 3 counterpart of the
docstring's ``optimizer.add_slot`` hook (Keras 3 has no ``add_slot``): the
embedding optimizer's slots become the Keras optimizer's own slot variables
(``accumulator``, ``momentum``, ``velocity`` ...) -- the very ones its
updates use.

For serving with stock ops only, ``tf.tpu.experimental.embedding.
serving_embedding_lookup(features, weights, embedding.embedding_tables,
feature_config)`` computes the same activations (it drops ids < 0 and, for
mean/sqrtn, entries of weight <= 0, where V0 would use them; see
:mod:`tf_tpu_emb.keras.v0_layers` for the Keras export).
"""
import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Union

import tensorflow as tf
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.tpu import tpu_embedding_base
from tensorflow.python.tpu import tpu_embedding_v2_utils
from tensorflow.python.util import nest

from tf_tpu_emb import optimizers as optimizers_lib
from tf_tpu_emb.embedding_bag import embedding_bag

_logger = logging.getLogger(__name__)

__all__ = ["TPUEmbeddingV0", "keras_slot_variable_creation_fn", "KERAS_SLOT_NAMES"]

if TYPE_CHECKING:  # annotations only: this module does not import Keras
    import keras

_COMBINERS = ("mean", "sqrtn", "sum")


# ------------------------------------------------------------------ gradients

def _unique_rows(grad):
    """An IndexedSlices gradient with each row id once (values summed)."""
    if not isinstance(grad, tf.IndexedSlices):
        return grad
    ids, position = tf.unique(grad.indices)
    values = tf.math.unsorted_segment_sum(grad.values, position, tf.shape(ids)[0])
    return tf.IndexedSlices(values, ids, grad.dense_shape)


@tf.custom_gradient
def _with_unique_row_gradient(table):
    """Identity on the table's value whose gradient has unique row ids."""
    return tf.identity(table), _unique_rows


# ------------------------------------------------------------------ the class

class TPUEmbeddingV0(tpu_embedding_base.TPUEmbeddingBase):
    """TF's ``TPUEmbeddingV0`` on plain (or mirrored) variables, any strategy.

    Args:
      feature_config: a nested structure of
        ``tf.tpu.experimental.embedding.FeatureConfig``.
      optimizer: a ``tf.tpu.experimental.embedding`` optimizer (or one of
        :mod:`tf_tpu_emb.optimizers`) or None.  As in TF, it only decides
        which slot variables are created (through its
        ``slot_variable_creation_fn`` when set); the tables are trained by
        whatever optimizer the caller applies to the gradients.
      variable_creator: optional ``fn(name, shape, initializer, trainable) ->
        variable`` that creates the tables (``trainable=True``) and slots
        (``name`` ``<table>/<slot>``, ``trainable=False``) instead of
        ``tf.Variable`` (:class:`tf_tpu_emb.keras.TPUEmbeddingV0Layer` makes them Keras weights).
    """

    def __init__(self,
                 feature_config: Union[tpu_embedding_v2_utils.FeatureConfig, Iterable],
                 optimizer: "Optional[optimizers_lib.Optimizer]" = None, *,
                 variable_creator: Optional[Callable[..., tf.Variable]] = None) -> None:
        super().__init__(feature_config, optimizer)
        self._strategy = tf.distribute.get_strategy()
        self._variable_creator = variable_creator
        self._built = False

    @property
    def feature_config(self):
        """The nested ``FeatureConfig`` structure this object was made with."""
        return self._feature_config

    # -------------------------------------------------------------- variables

    @property
    def embedding_tables(self):
        """Returns a dict of embedding tables, keyed by ``TableConfig``."""
        self.ensure_built()
        return {table: self._variables[table.name]["parameters"]
                for table in self._table_config}

    def _create_variables_and_slots(self):
        variables = {}
        for table in self._table_config:
            if self._variable_creator is None:
                variables[table.name] = self._create_variables(table, trainable=True)
            else:
                variables[table.name] = self._create_variables_with_creator(table)
        return variables

    def _create_variables_with_creator(self, table):
        shape = (table.vocabulary_size, table.dim)
        parameters = self._variable_creator(table.name, shape, table.initializer, True)

        def slot_creator(name, initializer):
            return self._variable_creator(table.name + "/" + name, shape, initializer, False)

        slots = {}
        if table.optimizer is not None:
            create = table.optimizer._create_slots  # pylint: disable=protected-access
            slots = create(parameters, slot_creator)
        slots["parameters"] = parameters
        return slots

    def build(self) -> None:
        """Creates the tables and slot variables (once), in the scope of the
        strategy this object was created under."""
        if self._built:
            return
        default = distribute_lib._get_default_strategy()  # pylint: disable=protected-access
        if tf.distribute.has_strategy() or self._strategy is default:
            super().build()
        else:
            with self._strategy.scope():
                super().build()

    def ensure_built(self) -> None:
        """Builds once, from any context: inside ``strategy.run`` for all
        replicas (``merge_call``), inside a ``tf.function`` trace outside it
        (``init_scope``), as TF's V0 does on first use."""
        if self._built:
            return
        if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
            # First use inside strategy.run: build once, for all replicas.
            tf.distribute.get_replica_context().merge_call(lambda _: self._build_eagerly())
        else:
            self._build_eagerly()

    def _build_eagerly(self):
        if self._built:
            return
        # May be reached while tracing a tf.function: create the variables
        # outside of it (as TF's V0 does).
        with tf.init_scope():
            self.build()

    # ----------------------------------------------------------------- lookup

    def embedding_lookup(
            self, features: Union[tf.Tensor, tf.SparseTensor, tf.RaggedTensor, Iterable],
            weights: Optional[Union[tf.SparseTensor, tf.RaggedTensor, Iterable]] = None
    ) -> Union[tf.Tensor, Iterable]:
        """Looks up every feature (see the module doc for the semantics).

        Args:
          features: a nested structure (that of ``feature_config``) of dense
            Tensors, SparseTensors or RaggedTensors of ids.
          weights: None, or the same structure of None / SparseTensor /
            RaggedTensor weights (not allowed for dense or sequence features).

        Returns:
          The activations, in the structure of ``feature_config``.
        """
        self.ensure_built()
        nest.assert_same_structure(features, self._feature_config)  # TF's exact errors

        flat_inputs = nest.flatten(features)
        flat_weights = [None] * len(flat_inputs)
        if weights is not None:
            nest.assert_same_structure(features, weights)
            flat_weights = nest.flatten(weights)
        flat_features = nest.flatten_with_joined_string_paths(self._feature_config)

        tables = self.embedding_tables
        table_values = {}  # one read (and one unique-row gradient) per table

        def value_of(table_config):
            if table_config.name not in table_values:
                table_values[table_config.name] = _with_unique_row_gradient(
                    tf.convert_to_tensor(tables[table_config]))
            return table_values[table_config.name]

        outputs = []
        for inp, weight, (path, feature) in zip(flat_inputs, flat_weights, flat_features):
            if weight is not None:
                if isinstance(inp, tf.Tensor):
                    raise ValueError("Weight specified for {}, but input is dense.".format(path))
                elif type(weight) is not type(inp):
                    raise ValueError(
                        "Weight for {} is of type {} but it does not match type of the "
                        "input which is {}.".format(path, type(weight), type(inp)))
                elif feature.max_sequence_length > 0:
                    raise ValueError("Weight specified for {}, but this is a sequence "
                                     "feature.".format(path))

            if isinstance(inp, tf.Tensor):
                if feature.max_sequence_length > 0:
                    raise ValueError("Feature {} is a sequence feature but a dense tensor "
                                     "was passed.".format(path))
                outputs.append(self._lookup_dense(inp, value_of(feature.table), feature))
            elif isinstance(inp, tf.SparseTensor):
                outputs.append(self._lookup_sparse(inp, weight, value_of, feature))
            elif isinstance(inp, tf.RaggedTensor):
                outputs.append(self._lookup_ragged(inp, weight, value_of, feature))
            else:
                raise ValueError("Input {} is type {}. Tensor, SparseTensor or "
                                 "RaggedTensor expected.".format(path, type(inp)))
        # In the structure of ``features`` (the same as feature_config's, but
        # without the trackable wrappers TF puts around a stored dict).
        return nest.pack_sequence_as(features, outputs)

    # Per input kind.  ``value_of(table_config)`` gives the table's value.

    @staticmethod
    def _combiner(feature):
        combiner = feature.table.combiner
        if combiner is None:
            combiner = "mean"
        if combiner not in _COMBINERS:
            raise ValueError(
                f"combiner must be one of 'mean', 'sqrtn' or 'sum', got {combiner}")
        return combiner

    @staticmethod
    def _lookup_dense(ids, table, feature):
        # embedding_lookup(table, ids): every id its own bag.
        rows = embedding_bag(table, ids, combiner="sum")
        out = tf.reshape(rows, tf.concat([tf.shape(ids), [feature.table.dim]], 0))
        out.set_shape(ids.shape.concatenate([feature.table.dim]))
        return out

    def _lookup_sparse(self, sp, weight, value_of, feature):
        rank = sp.shape.rank
        dim = feature.table.dim
        if not feature.output_shape and feature.max_sequence_length > 0:
            if rank is None or rank == 2:
                return self._sparse_sequence(sp, value_of(feature.table), feature)
            _logger.warning("max_sequence_length setting will be ignored because the rank of "
                            "the input tensor is %d which is not 2.", rank)
        combiner = self._combiner(feature)
        table = value_of(feature.table)
        if rank == 2:
            out = embedding_bag(table, sp, weight, combiner=combiner)
            out.set_shape([sp.shape[0], dim])
            return out
        # Rank != 2: the bags are the rows of all leading dimensions.
        dense_shape = sp.dense_shape
        outer = dense_shape[:-1]
        flat_shape = tf.stack([tf.reduce_prod(outer), dense_shape[-1]])
        flat = tf.sparse.reshape(sp, flat_shape)
        flat_w = tf.sparse.reshape(weight, flat_shape) if weight is not None else None
        out = embedding_bag(table, flat, flat_w, combiner=combiner)
        out = tf.reshape(out, tf.concat([tf.cast(outer, tf.int32), [dim]], 0))
        if rank is not None:
            out.set_shape(sp.shape[:-1].concatenate([dim]))
        return out

    @staticmethod
    def _sparse_sequence(sp, table, feature):
        """[B, L, D]: position p of row b holds table[id] (p < L), else 0."""
        length = feature.max_sequence_length
        batch = sp.dense_shape[0]
        kept = tf.sparse.slice(sp, [0, 0], tf.stack([batch, tf.constant(length, tf.int64)]))
        rows = tf.gather(table, kept.values)
        out = tf.scatter_nd(kept.indices, rows,
                            tf.stack([batch, length, feature.table.dim]))
        out.set_shape([sp.shape[0], length, feature.table.dim])
        return out

    def _lookup_ragged(self, inp, weight, value_of, feature):
        if inp.shape.rank != 2:
            raise ValueError("Only rank 2 ragged tensor is supported, but got rank {}".format(
                inp.shape.rank))
        batch_size = inp.shape[0]
        dim = feature.table.dim
        table = value_of(feature.table)
        if not feature.output_shape and feature.max_sequence_length > 0:
            return self._ragged_sequence(inp, table, batch_size, feature.max_sequence_length, dim)
        if feature.output_shape:
            output_batch_size = feature.output_shape.num_elements()
            if batch_size is None or output_batch_size == batch_size:
                out = embedding_bag(table, inp, weight, combiner=self._combiner(feature))
            elif output_batch_size > batch_size and output_batch_size % batch_size == 0:
                # Sequence-like: (B, k) positions, weights and combiner ignored.
                out = self._ragged_sequence(inp, table, batch_size,
                                            output_batch_size // batch_size, dim)
            else:
                raise ValueError(
                    "Output shape set in the FeatureConfig should be the factor of "
                    "the input data batch size. But instead got output shape {}, "
                    "input data batch size {}".format(feature.output_shape, batch_size))
            return tf.reshape(out, feature.output_shape.as_list() + [dim])
        out = embedding_bag(table, inp, weight, combiner=self._combiner(feature))
        out.set_shape([batch_size, dim])
        return out

    @staticmethod
    def _ragged_sequence(inp, table, batch_size, length, dim):
        """[B, length, D] of the rows' first ``length`` ids, zero padded."""
        rows = tf.gather(table, inp.values)
        seq = tf.RaggedTensor.from_row_splits(rows, inp.row_splits, validate=False)
        return seq.to_tensor(shape=[batch_size, length, dim])


# ------------------------------------------------------- Keras slot variables

KERAS_SLOT_NAMES = {
    "accumulators": "accumulator",  # Adagrad, FTRL
    "momenta": "momentum",          # Adam, SGD(momentum), Lion
    "velocities": "velocity",       # Adam
    "linears": "linear",            # FTRL
}
"""TPU embedding slot name -> the Keras 3 optimizer's name for that slot."""


def keras_slot_variable_creation_fn(
        keras_optimizer: "keras.optimizers.Optimizer",
        slot_names: Optional[Mapping[str, str]] = None
) -> Callable[[tf.Variable, Sequence[str], Sequence[Any]], Dict[str, tf.Variable]]:
    """A ``slot_variable_creation_fn`` that makes the embedding optimizer's
    slots the Keras optimizer's own slot variables.

    TF's V0 docstring passes ``keras_optimizer.add_slot`` (Keras 2); Keras 3
    creates a slot in ``build()`` with ``add_variable_from_reference(var,
    name, initializer)``.  The returned hook creates each slot that way (named
    by ``slot_names``, default :data:`KERAS_SLOT_NAMES`; the initial value is
    the embedding optimizer's) and remembers it, and the optimizer's
    ``add_variable_from_reference`` is wrapped so that its ``build()`` returns
    the remembered variable for the same (table, name) instead of a second
    one: the slots in ``embedding._variables`` are then the variables that
    ``keras_optimizer.apply_gradients`` updates.  Call the hook (build the
    embedding) before the Keras optimizer is built.

    Args:
      keras_optimizer: the Keras 3 optimizer that will train the tables.
      slot_names: TPU embedding slot name -> Keras slot name, over
        :data:`KERAS_SLOT_NAMES` (which it extends or overrides).

    Returns:
      The ``slot_variable_creation_fn(table, slot_names, slot_initializers)``
      to pass to the embedding optimizer.
    """
    names = dict(KERAS_SLOT_NAMES, **(slot_names or {}))
    created = getattr(keras_optimizer, "_tf_tpu_emb_slots", None)
    if created is None:
        created = {}
        original = keras_optimizer.add_variable_from_reference

        def add_variable_from_reference(reference_variable, name=None, initializer="zeros"):
            key = (keras_optimizer._var_key(reference_variable),  # pylint: disable=protected-access
                   name)
            if key in created:
                return created[key]
            return original(reference_variable, name=name, initializer=initializer)

        object.__setattr__(keras_optimizer, "_tf_tpu_emb_slots", created)
        object.__setattr__(keras_optimizer, "_tf_tpu_emb_original_add", original)
        object.__setattr__(keras_optimizer, "add_variable_from_reference",
                           add_variable_from_reference)
    original = keras_optimizer._tf_tpu_emb_original_add  # pylint: disable=protected-access

    def slot_variable_creation_fn(table, slot_names_, slot_initializers):
        if getattr(keras_optimizer, "built", False):
            raise ValueError(
                "keras_slot_variable_creation_fn: the Keras optimizer is already built; build "
                "the embedding (create its slots) before the first apply_gradients.")
        slots = {}
        for slot, initializer in zip(slot_names_, slot_initializers):
            keras_name = names.get(slot, slot)
            variable = original(table, name=keras_name, initializer=initializer)
            key = keras_optimizer._var_key(table)  # pylint: disable=protected-access
            created[(key, keras_name)] = variable
            slots[slot] = variable
        return slots

    return slot_variable_creation_fn
