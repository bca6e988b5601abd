"""The training path's Python side: getting dL/d(activations) to ONE Send.

The engine updates its tables when it receives ``SendTPUEmbeddingGradients``:
one gradient per ``RecvTPUEmbeddingActivations`` output, same order and
shapes, plus the dynamic learning rates (``learning_rates[tag]``).  A model,
however, sees per-*lookup* activations (a feature's slice of a table output),
and TensorFlow's autodiff hands back per-lookup gradients.  This module
joins the two ends, in the three ways TensorFlow programs are written.

**Layout and Send** (:mod:`tf_tpu_emb.layout`, :mod:`tf_tpu_emb.send`; the
  names stay importable from here).  :class:`Layout` describes which Recv
  output each lookup comes from; :func:`slice_activations` is TF1's
  ``TPUEmbedding.get_activations`` and :func:`send_gradients_op` is the exact
  inverse of it, TF1's ``generate_send_gradients_op``
  (docs/tpu_embedding_semantics.md §3.3).

**TF1 graphs: the collection protocol** (docs/tpu_embedding_semantics.md §3.1, §3.2).
  The registered gradient of ``TPUEmbeddingActivations`` stores
  ``identity(dL/d(activation))`` at index ``lookup_id`` of the graph
  collection ``tpu_embedding_gradients_table_<table_id>`` and returns zeros
  for both inputs.  TF registers such a gradient for its core op; this module
  registers the same protocol (same collections, same three ``RuntimeError``
  texts) for our prefixed op ``TfTpuEmb>TPUEmbeddingActivations``, and
  rewrites TF1's helper module ``tpu_embedding_gradient`` (not shipped in TF
  2.21): :func:`create_dummy_table_variables`,
  :func:`hook_dummy_table_variables_to_activations` (either op) and
  :func:`get_gradients_through_dummy_table_variables`.  Taking
  ``tf.gradients`` with respect to the dummy variables fills the collections;
  :func:`send_gradients_op` then builds the Send.

**TF2 (eager, tf.function, Keras optimizer loops): :func:`hook_step`.**
  There are no graph collections in eager mode, and a tape calls gradient
  functions one op at a time, so something must notice when *all* lookups of
  a step have their gradient and then emit exactly one Send.  ``hook_step``
  builds, per step:

      dummy variables ──F──> handle_0 ─┐
                              handle_1 ─┼─> TPUEmbeddingActivations(handle_k, act_k)
                              ...      ─┘            (our prefixed op)

  ``F`` is a ``tf.custom_gradient`` fan-out (one identity of the table's dummy
  variable per lookup).  Each handle tensor carries a reference to the step's
  collector (a Python attribute on the tensor object; the tape and
  ``tf.gradients`` hand the registered gradient function the very same tensor
  objects as ``op.inputs``, whereas the op's attributes are fixed by its
  OpDef and an eager op has no name to key a registry on).  The registered
  gradient finds the collector, stores the lookup's gradient there (a second
  gradient for the same ``(table_id, lookup_id)`` raises) and returns zeros.
  Autodiff only runs an op's gradient after the gradients of all consumers of
  its outputs, so ``F``'s gradient runs once, after every lookup gradient of
  the step: it builds the single Send (zeros plus a
  :class:`MissingGradientWarning` for lookups the loss does not reach) and
  returns zeros for the dummy variables under a control dependency on the
  Send.  This holds for ``GradientTape`` in eager mode and inside
  ``tf.function`` and for ``tf.gradients`` in a TF1 graph (checked by
  ``tests/api/test_gradients_tf1.py`` and ``test_gradients_tf2.py``).  In
  eager mode the Send runs when it is built; in ``tf.function`` it is a
  stateful op and always runs; in a TF1 graph it runs when the dummy
  variables' gradient (or anything depending on it, e.g. an optimizer's
  apply op) runs.

  Consequences worth knowing: the tape does not prune by sources, so
  ``tape.gradient(loss, model_vars)`` without the dummy variables still
  sends (but the dummy variables must be watched: a tape with
  ``watch_accessed_variables=False`` that does not watch them records
  neither ``F`` nor the hooked ops, and nothing is sent); a step whose loss
  reaches no activation sends nothing (the engine then simply drops the
  batch at the next Recv); the Send is placed on the Recv's device, i.e. on
  the replica that received the batch, whatever device scope the backward
  pass runs under.  ``tf.custom_gradient`` works as is in all three modes,
  so the alternative (an ``IdentityN`` with ``gradient_override_map``) was
  not needed: in graph mode ``custom_gradient`` is exactly that, plus the
  explicit tape record that ``tf.function`` needs.

Ordering: the Send always carries a control dependency on the Recv outputs
it answers (``hook_step``) or on ``control_inputs`` (``send_gradients_op``);
see :mod:`tf_tpu_emb.send`.
"""
import collections
import inspect
import warnings
import weakref

import tensorflow as tf
from tensorflow.python.framework import ops as _tf_ops
from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops

from tf_tpu_emb import ops as _ops
from tf_tpu_emb import send as _send
# The registered gradient and TF1's collection names (registered when the
# library loads); the names stay importable from here.
from tf_tpu_emb.activation_gradient import (  # noqa: F401
    COLLECTOR_ATTR as _COLLECTOR_ATTR, DUMMY_TABLE_VARIABLES_COLLECTION, gradient_collection_name,
    zeros_for as _zeros_for)
# The layout and the Send builder live in their own modules; their names stay
# importable from here.
from tf_tpu_emb.layout import Layout, LayoutFeature, slice_activations  # noqa: F401
from tf_tpu_emb.send import MissingGradientWarning, send_gradients_op  # noqa: F401

_SINKS_ATTR = "_tf_tpu_emb_gradient_sinks"

__all__ = [
    "LayoutFeature", "Layout", "MissingGradientWarning", "slice_activations",
    "send_gradients_op", "create_dummy_table_variables",
    "hook_dummy_table_variables_to_activations",
    "get_gradients_through_dummy_table_variables", "create_dummy_variables",
    "hook_step", "gradient_barrier", "DUMMY_TABLE_VARIABLES_COLLECTION",
    "gradient_collection_name",
]

def _table_list(layout_or_tables):
    """[(table name, number of lookups)] from a Layout, a mapping or pairs."""
    if isinstance(layout_or_tables, Layout):
        return [(n, len(layout_or_tables.table_features(t)))
                for t, n in enumerate(layout_or_tables.table_names)]
    if isinstance(layout_or_tables, collections.abc.Mapping):
        return [(n, int(k)) for n, k in layout_or_tables.items()]
    return [(n, int(k)) for n, k in layout_or_tables]


def create_dummy_table_variables(table_to_num_lookups):
    """TF1: the dummy variables whose gradient captures dL/d(activations).

    ``table_to_num_lookups`` is a :class:`Layout`, or an ordered mapping (or
    pairs) table name -> number of lookups, in table-id order.  For each table
    creates (``tf.compat.v1.get_variable``, so the current variable scope
    applies) a trainable float32 ``[1]`` resource variable
    ``tpu_embedding_dummy_table_variable_<table>`` initialized to zero, placed
    in the collection ``tpu_embedding_dummy_table_variables`` instead of
    GLOBAL_VARIABLES (a Saver ignores it; being trainable it is also in
    TRAINABLE_VARIABLES, so ``Optimizer.minimize`` differentiates with respect
    to it), and fills ``tpu_embedding_gradients_table_<table_id>`` with one
    ``None`` per lookup (``RuntimeError`` if that collection is not empty).

    Returns ``(OrderedDict table name -> variable, initializer op)``.
    """
    tables = _table_list(table_to_num_lookups)
    graph = _tf_ops.get_default_graph()
    for table_id, _ in enumerate(tables):
        if graph.get_collection(gradient_collection_name(table_id)):
            raise RuntimeError("{} is not empty.".format(gradient_collection_name(table_id)))
    variables = collections.OrderedDict()
    for table_id, (table, num_lookups) in enumerate(tables):
        variables[table] = tf.compat.v1.get_variable(
            "tpu_embedding_dummy_table_variable_{}".format(table), shape=[1],
            dtype=tf.float32, initializer=tf.compat.v1.zeros_initializer(),
            trainable=True, use_resource=True,
            collections=[DUMMY_TABLE_VARIABLES_COLLECTION])
        graph.get_collection_ref(gradient_collection_name(table_id)).extend(
            [None] * num_lookups)
    init = tf.compat.v1.variables_initializer(
        list(variables.values()), name="tpu_embedding_dummy_table_variables_init")
    return variables, init


def _by_table(layout, variables):
    values = list(variables.values()) if isinstance(variables, collections.abc.Mapping) \
        else list(variables)
    if len(values) != len(layout.table_names):
        raise ValueError("got %d dummy variables but the layout has %d tables"
                         % (len(values), len(layout.table_names)))
    return values


def hook_dummy_table_variables_to_activations(layout, activations, dummy_table_variables,
                                              use_core_op=False):
    """TF1: routes each activation through ``TPUEmbeddingActivations``.

    ``activations``: mapping feature name -> activation (e.g. from
    :func:`slice_activations`); ``dummy_table_variables``: from
    :func:`create_dummy_table_variables` (or a list by table id).  Uses our
    prefixed op, or TF's core op with ``use_core_op`` (whose gradient is TF's
    own, with the same protocol).  Returns an ``OrderedDict`` of the hooked
    activations, to use in place of ``activations``.
    """
    variables = _by_table(layout, dummy_table_variables)
    hooked = collections.OrderedDict()
    for name, activation in activations.items():
        f = layout.feature(name)
        if use_core_op:
            hooked[name] = tf.raw_ops.TPUEmbeddingActivations(
                embedding_variable=variables[f.table_id], sliced_activations=activation,
                table_id=f.table_id, lookup_id=f.lookup_id)
        else:
            hooked[name] = _ops.tpu_embedding_activations(
                variables[f.table_id], activation, table_id=f.table_id, lookup_id=f.lookup_id)
    return hooked


def get_gradients_through_dummy_table_variables(layout):
    """TF1: the gradients the collection protocol captured, per feature.

    Call after ``tf.gradients`` (or ``Optimizer.compute_gradients``) with
    respect to the dummy variables.  Returns an ``OrderedDict`` feature name ->
    gradient in ``layout.features`` order; a lookup without gradient gets
    zeros of its activation shape, with a :class:`MissingGradientWarning`
    per table (and one more when no table has any gradient).
    """
    graph = _tf_ops.get_default_graph()
    gradients = {}
    any_defined = False
    for table_id, table in enumerate(layout.table_names):
        lookups = layout.table_features(table_id)
        stored = graph.get_collection(gradient_collection_name(table_id))
        if len(stored) != len(lookups):
            raise ValueError("collection {} has {} entries but table '{}' has {} lookups; were "
                             "the dummy variables created for this layout?".format(
                                 gradient_collection_name(table_id), len(stored), table,
                                 len(lookups)))
        missing = [f.name for f, g in zip(lookups, stored) if g is None]
        any_defined = any_defined or len(missing) < len(lookups)
        if missing:
            warnings.warn(
                "Table {} with id {} has undefined gradients for feature(s) {}: the model "
                "probably asked for activations it does not use. Gradients of zeros are "
                "sent back to TPUEmbedding instead.".format(table, table_id, missing),
                MissingGradientWarning, stacklevel=2)
        for f, g in zip(lookups, stored):
            gradients[f.name] = tf.zeros(f.shape, tf.float32) if g is None else g
    if not any_defined and layout.features:
        warnings.warn("All tables have undefined gradients: the loss does not depend on any "
                      "TPUEmbedding activation. Gradients of zeros are sent back to "
                      "TPUEmbedding.", MissingGradientWarning, stacklevel=2)
    return collections.OrderedDict((f.name, gradients[f.name]) for f in layout.features)


# ========================================================================= TF2

def create_dummy_variables(layout, name_prefix="tpu_embedding_dummy_table_variable_"):
    """TF2: one trainable float32 ``[1]`` ``tf.Variable`` (zero) per table, by
    table id, for :func:`hook_step`.  Create them once, outside the step."""
    return [tf.Variable(tf.zeros([1], tf.float32), trainable=True, name=name_prefix + n)
            for n in layout.table_names]


class _StepCollector:
    """Gradients of one step's lookups, turned into one Send by F's gradient."""

    def __init__(self, layout, activations, learning_rate_fn, recv_outputs, send_fn=None):
        self.layout = layout
        self.send_fn = send_fn
        self.activations = activations
        # Graph-mode custom gradients stay in TF's global gradient registry
        # for the life of the process, and with them this collector: it must
        # not keep user objects alive.  A bound method is held weakly; any
        # other callable until the Send is built (then everything is dropped).
        if inspect.ismethod(learning_rate_fn):
            learning_rate_fn = _WeakCallable(learning_rate_fn)
        self.learning_rate_fn = learning_rate_fn
        self.recv_outputs = recv_outputs
        self.device = _send.device_of(recv_outputs[0]) if recv_outputs else ""
        self.gradients = {}
        self.sent = False

    def add(self, op, grad):
        key = (op.get_attr("table_id"), op.get_attr("lookup_id"))
        feature = next(f.name for f in self.layout.features
                       if (f.table_id, f.lookup_id) == key)
        if key in self.gradients:
            raise RuntimeError(
                "Duplicate gradients (w.r.t. TPUEmbedding activations) generated for table_id "
                "{} and lookup_id {} (feature '{}') in one training step: this step's "
                "activations were differentiated twice (a second tape.gradient on a "
                "persistent tape, or a second tf.gradients). Each step's gradients must reach "
                "exactly one SendTPUEmbeddingGradients; use tf.stop_gradient where no "
                "embedding update is wanted.".format(key[0], key[1], feature))
        if self.sent:
            raise RuntimeError(
                "Gradients (w.r.t. TPUEmbedding activations) generated for table_id {} and "
                "lookup_id {} (feature '{}') after this step's SendTPUEmbeddingGradients was "
                "built: all embedding gradients of a step must come from one gradient "
                "computation.".format(key[0], key[1], feature))
        self.gradients[key] = grad
        skip = set(getattr(op, "skip_input_indices", None) or ())
        return [None if i in skip else _zeros_for(t) for i, t in enumerate(op.inputs)]

    def send(self):
        if self.sent:
            raise RuntimeError("SendTPUEmbeddingGradients was already built for this step")
        self.sent = True
        try:
            rates = _send.learning_rates_for(
                self.layout, self.learning_rate_fn() if self.learning_rate_fn is not None else [])
            gradients = []
            for f, activation in zip(self.layout.features, self.activations):
                g = self.gradients.get((f.table_id, f.lookup_id))
                if g is None:
                    _send.warn_missing_gradient(f.name, stacklevel=3)
                    g = tf.zeros_like(activation, dtype=tf.float32)
                gradients.append(_send.as_gradient(f, g))
            if self.send_fn is not None:
                return self.send_fn(gradients, rates, control_inputs=self.recv_outputs)
            # The Send must run on the Recv's device (that picks the replica),
            # whatever device scope the gradient is computed under.
            return _send.build_send(self.layout, gradients, rates, device=self.device,
                                    control_inputs=self.recv_outputs)
        finally:
            # The step is over for this collector: drop what the user handed in.
            self.learning_rate_fn = self.send_fn = None
            self.activations = self.recv_outputs = ()
            self.gradients = dict.fromkeys(self.gradients)  # keys still catch duplicates


class _WeakCallable:
    """A bound method held without keeping its object alive."""

    def __init__(self, method):
        self._method = weakref.WeakMethod(method)

    def __call__(self):
        method = self._method()
        if method is None:
            raise RuntimeError("hook_step's learning_rate_fn is a method of an object that "
                               "has been garbage collected")
        return method()


def _sinks_for(variables):
    """Per dummy variable, the ``[1]`` scratch variable its gradient passes
    through in this replica (see :func:`gradient_barrier`), created on first
    use and kept on the variable itself; None for a dummy that is a tensor."""
    replica = 0
    ctx = tf.distribute.get_replica_context()
    if ctx is not None and tf.distribute.has_strategy():
        replica = tf.get_static_value(ctx.replica_id_in_sync_group) or 0
    sinks = []
    for var in variables:
        if isinstance(var, tf.Tensor) or not hasattr(var, "assign"):
            sinks.append(None)
            continue
        per_replica = getattr(var, _SINKS_ATTR, None)
        if per_replica is None:
            per_replica = {}
            setattr(var, _SINKS_ATTR, per_replica)
        if int(replica) not in per_replica:
            with tf.init_scope(), tf.device("/CPU:0"):
                per_replica[int(replica)] = _resource_variable_ops.ResourceVariable(
                    tf.zeros([1], tf.float32), trainable=False,
                    name="tpu_embedding_gradient_sink")
        sinks.append(per_replica[int(replica)])
    return sinks


def hook_step(dummy_vars, layout, recv_outputs, learning_rate_fn=None, send_fn=None):
    """TF2: this step's activations, wired so that their gradients reach ONE Send.

    ``dummy_vars``: one trainable variable per table (:func:`create_dummy_variables`,
    a list by table id or a mapping in table order); ``recv_outputs``: this
    step's Recv outputs; ``learning_rate_fn``: a callable returning the
    dynamic learning rates ``[rate for tag 0, tag 1, ...]`` (called when the
    gradient is built: once per step in eager mode, once per trace in
    ``tf.function``, so make it read a variable there).  The Send is placed on
    the device of ``recv_outputs`` (the replica that received the batch),
    whatever device scope the gradient is computed under; ``send_fn(gradients,
    rates, control_inputs=...)``, if given, builds the step's Send(s) instead
    (a model sharded over several hosts sends to each of them).

    Returns an ``OrderedDict`` feature name -> activation (as
    :func:`slice_activations`) to feed the model.  Differentiating a loss that
    depends on them (``tape.gradient(loss, model_vars + dummy_vars)``, or
    ``tf.gradients`` in a graph) sends the step's gradients to the engine once;
    features the loss does not use get zeros and a
    :class:`MissingGradientWarning`.  The dummy variables' gradient is zero
    (harmless to hand to an optimizer) and, outside eager mode, carries the
    Send as a control dependency.  If the loss depends on no activation at all,
    nothing is sent.

    In NESTED ``tf.function``s (Keras ``fit`` inlines its step into the
    iterator loop) grappler would fold that zero gradient into a constant and
    then drop the Send as an implied control dependency (the tables silently
    stop training).  So each dummy *variable*'s gradient passes through
    :func:`gradient_barrier` with a per-replica scratch variable (created on
    first use, kept on the dummy variable), which grappler cannot fold.  A
    dummy passed as a tensor gets no barrier: pass the variables.

    After the step's Send is built, the step's bookkeeping drops
    ``learning_rate_fn`` and the step's tensors (TF keeps graph-mode custom
    gradients for the life of the process); a bound method is held weakly
    from the start, so ``hook_step`` keeps no user object alive.
    """
    variables = _by_table(layout, dummy_vars)
    if learning_rate_fn is None and layout.num_dynamic_inputs:
        raise ValueError("the config has %d dynamic learning rate tag(s): pass "
                         "learning_rate_fn" % layout.num_dynamic_inputs)
    if not layout.features:
        raise ValueError("the layout has no features")
    recv_outputs = list(recv_outputs)
    activations = slice_activations(layout, recv_outputs)
    collector = _StepCollector(layout, list(activations.values()), learning_rate_fn,
                               recv_outputs, send_fn)
    # Read the variables outside F: a custom_gradient function that reads
    # variables itself must return variable gradients separately.
    values = [tf.convert_to_tensor(v) if sink is None
              else gradient_barrier(tf.convert_to_tensor(v), sink)
              for v, sink in zip(variables, _sinks_for(variables))]
    table_of = [f.table_id for f in layout.features]

    @tf.custom_gradient
    def fan_out(*tables):
        handles = [tf.identity(tables[t]) for t in table_of]

        def grad(*unused_upstream):
            send = collector.send()
            deps = [] if send is None else [send]
            with tf.control_dependencies(deps):
                return [tf.zeros_like(t) for t in tables]

        return handles, grad

    handles = fan_out(*values)
    hooked = collections.OrderedDict()
    for f, handle, (name, activation) in zip(layout.features, handles, activations.items()):
        setattr(handle, _COLLECTOR_ATTR, collector)
        hooked[name] = _ops.tpu_embedding_activations(
            handle, activation, table_id=f.table_id, lookup_id=f.lookup_id)
    return hooked


def gradient_barrier(value, sink):
    """Identity whose gradient is routed through `sink`, a ``[1]`` float32
    resource variable (assign, then read): grappler cannot fold such a
    gradient into a constant, so a Send hanging off it (see the hazard in
    :func:`hook_step`) stays an ancestor of whatever consumes the gradient."""

    @tf.custom_gradient
    def barrier(x):
        def grad(upstream):
            assign = sink.assign(tf.reshape(tf.cast(upstream, tf.float32), [1]),
                                 read_value=False)
            with tf.control_dependencies([assign] if assign is not None else []):
                return tf.identity(sink.read_value())
        return tf.identity(x), grad

    return barrier(value)
