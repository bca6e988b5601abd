"""The host variables of a :class:`tf_tpu_emb.TPUEmbedding`: its tables (and
optimizer slots) on the host, named as TF's ``TPUEmbedding`` names them
(``<table>`` for the parameters, ``<table>/<slot>`` for slots), so that
``tf.train.Checkpoint(embedding=...)`` writes TF's TPU-embedding layout and
checkpoints move between this class, TF's ``TPUEmbedding`` and
``TPUEmbeddingForServing``.  With bfloat16 storage one more variable,
``STEP_VARIABLE``, carries the step count that seeds stochastic rounding.

Each is created through the owner's ``_add_variable_with_custom_getter``, so
a checkpoint restored before ``build`` initialises it directly (as in TF),
and calls its ``on_restore`` when a checkpoint restores it later (eagerly):
checkpoints written by TF's own classes (or by plain variables) do not carry
the owner's checkpoint callback, whose restore hook never runs for them.
"""
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

__all__ = ["STEP_VARIABLE", "HostVariable", "create_table_variables", "create_step_variable"]

# bfloat16 storage only: the checkpointed step count seeding its stochastic
# rounding (float32 checkpoints keep TF's TPU-embedding layout exactly).
STEP_VARIABLE = "stochastic_rounding_step"


class HostVariable(resource_variable_ops.ResourceVariable):
    """A host variable that calls ``on_restore`` when a checkpoint restores
    it eagerly (the owner then reloads it into the engine)."""

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
        return HostVariable(initial_value=initial_value, name=name, trainable=trainable,
                            distribute_strategy=strategy)


def _create(owner, name, shape, dtype, initializer):
    def getter(name, shape, dtype, initializer, trainable, _shape=shape):
        del shape
        return _plain_variable(lambda: initializer(_shape, dtype=dtype), name, trainable)

    with tf.init_scope():
        return owner._add_variable_with_custom_getter(  # pylint: disable=protected-access
            name=name, initializer=initializer, shape=shape, dtype=dtype, getter=getter,
            trainable=False)


def create_table_variables(owner, tables, optimizer_of, restored):
    """``{table name: {"parameters": var, slot name: var, ...}}`` for
    ``tables`` (TableConfigs), children of the trackable ``owner``;
    ``optimizer_of(table)`` creates the slots, ``restored(table)`` runs when a
    checkpoint restores one of the table's variables (it must not hold the
    owner strongly)."""
    variables = {}
    for table in tables:
        shape = (table.vocabulary_size, table.dim)

        def creator(name, initializer, _shape=shape):
            return _create(owner, name, _shape, tf.float32, initializer)

        parameters = creator(table.name, table.initializer)
        # Slots a user's slot_variable_creation_fn makes with tf.Variable
        # become host variables too (as TF's creator scope makes them TPU
        # variables on a TPU), not variables of the active strategy.
        with tf.variable_creator_scope(lambda _, **kw: _plain_variable(
                kw["initial_value"], kw.get("name"), kw.get("trainable", False))):
            slots = optimizer_of(table)._create_slots(  # pylint: disable=protected-access
                parameters, lambda name, init, t=table: creator(t.name + "/" + name, init))
        slots["parameters"] = parameters
        variables[table.name] = slots
        for var in slots.values():
            if isinstance(var, HostVariable):
                var.on_restore = lambda t=table: restored(t)
    return variables


def create_step_variable(owner, restored):
    """The int64 ``STEP_VARIABLE`` child of ``owner``; ``restored()`` runs when
    a checkpoint restores it."""
    var = _create(owner, STEP_VARIABLE, (), tf.int64, tf.zeros_initializer())
    var.on_restore = restored
    return var
