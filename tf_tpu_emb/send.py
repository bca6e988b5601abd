"""The one builder of ``SendTPUEmbeddingGradients``.

Every training front end ends here: the raw-op helper
:func:`send_gradients_op` (TF1 graphs, hand-written TF2 loops), the step
collector of :func:`tf_tpu_emb.gradients.hook_step` (the Keras
``TPUEmbeddingLayer``'s gradient trap around its dequeue) and
:meth:`tf_tpu_emb.TPUEmbedding.apply_gradients`.  :func:`build_send` turns
per-feature gradients (in :class:`tf_tpu_emb.layout.Layout` order) into the
Send's Recv-shaped inputs, checks the dynamic learning rates, and orders the
Send after what it answers; :func:`mid_level_gradients` applies TF's
mid-level rules to ``apply_gradients``' input; :func:`warn_missing_gradient`
is the one warning for a lookup that got no gradient.

Ordering: nothing orders a Send after its Recv when the gradients do not
depend on the activations (a loss linear in them).  A TF1 graph has no
automatic control dependencies at all; ``tf.function``'s chain resource-less
stateful ops in program order, but not TF's core-named enqueue ops (listed as
order-insensitive).  So the Send always carries a control dependency on
``control_inputs`` (the Recv outputs it answers); the enqueue -> Recv
dependency is the caller's.
"""
import contextlib
import warnings

import tensorflow as tf
from tensorflow.python.framework import ops as _tf_ops

from tf_tpu_emb import layout as _layout
from tf_tpu_emb import ops as _ops

__all__ = ["MissingGradientWarning", "warn_missing_gradient", "build_send",
           "send_gradients_op"]


class MissingGradientWarning(UserWarning):
    """A lookup of a training step got no gradient; zeros are sent for it."""


MISSING_GRADIENT_MESSAGE = ("No gradient passed for feature %s, sending zero gradient. This "
                            "may not be correct behavior for certain optimizers like Adam.")


def warn_missing_gradient(feature, logger=None, stacklevel=2):
    """Reports that `feature` got no gradient (zeros are sent for it): a
    :class:`MissingGradientWarning`, or a log record on `logger` where the
    API being mirrored logs (TF's mid-level ``apply_gradients``)."""
    if logger is not None:
        logger.warning(MISSING_GRADIENT_MESSAGE, feature)
    else:
        warnings.warn(MISSING_GRADIENT_MESSAGE % feature, MissingGradientWarning,
                      stacklevel=stacklevel + 1)


def _control_ops(items):
    """Graph ops to order a Send after (none in eager mode, nor from other graphs)."""
    if tf.executing_eagerly():
        return []
    graph = _tf_ops.get_default_graph()
    found = []
    for item in items or ():
        op = item if isinstance(item, _tf_ops.Operation) else getattr(item, "op", None)
        if op is not None and op.graph is graph and op not in found:
            found.append(op)
    return found


def as_gradient(feature, gradient):
    """A dense float32 gradient of the feature's activation shape."""
    gradient = tf.convert_to_tensor(gradient)  # IndexedSlices -> dense
    if gradient.dtype != tf.float32:
        gradient = tf.cast(gradient, tf.float32)
    if not gradient.shape.is_compatible_with(feature.shape):
        raise ValueError("Found gradient of shape %s for feature '%s'. Expected shape %s."
                         % (gradient.shape, feature.name, list(feature.shape)))
    return gradient


def mid_level_gradients(layout, path_gradients, logger=None):
    """TF's mid-level ``apply_gradients`` rules for ``(path, gradient)``
    pairs in ``layout.features`` order: a ``tf.Tensor`` of the feature's
    activation shape each, or ``None`` (zeros, with the missing-gradient
    warning on ``logger``); anything else is TF's ``ValueError``."""
    out = []
    for (path, gradient), feature in zip(path_gradients, layout.features):
        full_shape = list(feature.shape)
        if gradient is not None and not isinstance(gradient, tf.Tensor):
            raise ValueError(f"found non-tensor type: {type(gradient)} at path {path}.")
        if gradient is None:
            warn_missing_gradient(path, logger=logger)
            gradient = tf.zeros(full_shape, tf.float32)
        elif gradient.shape != full_shape:
            raise ValueError("Found gradient of shape {} at path {}. Expected shape {}."
                             .format(gradient.shape, path, full_shape))
        out.append(gradient)
    return out


def learning_rates_for(layout, learning_rates):
    """``learning_rates`` as float32 tensors, one per dynamic-input tag."""
    rates = [tf.cast(r, tf.float32) for r in (learning_rates or [])]
    if len(rates) != layout.num_dynamic_inputs:
        raise ValueError("the config has %d dynamic learning rate tag(s) but %d learning rates "
                         "were given (learning_rates[tag])"
                         % (layout.num_dynamic_inputs, len(rates)))
    return rates


def device_of(tensor):
    """The device `tensor` was computed on ('' when a graph left it unplaced):
    a step's Send goes to its Recv's device, which picks the replica."""
    if isinstance(tensor, _tf_ops.EagerTensor):
        return tensor.device
    op = getattr(tensor, "op", None)
    return op.device if op is not None else ""


def build_send(layout, gradients, learning_rates=None, *, config=None, control_inputs=None,
               device=None, name=None):
    """Builds (eager: runs) the step's ONE Send.

    ``gradients``: one dense gradient per ``layout.features`` entry, in that
    order; ``learning_rates[tag]``: the dynamic inputs; ``config`` defaults
    to ``layout.config``; ``control_inputs`` are made control dependencies;
    ``device`` (e.g. the Recv's, which picks the replica) places the Send;
    it reaches ``layout.engine``, the engine whose Recv produced the outputs.
    Returns the Send op (``None`` in eager mode).
    """
    rates = learning_rates_for(layout, learning_rates)
    placement = tf.device(device) if device is not None else contextlib.nullcontext()
    with placement, tf.control_dependencies(_control_ops(control_inputs)):
        return _ops.send_tpu_embedding_gradients(
            _layout.send_inputs(layout, gradients),
            layout.config if config is None else config, learning_rates=rates,
            engine=layout.engine, name=name)


def send_gradients_op(layout, feature_to_gradient, learning_rates=None, config=None,
                      control_inputs=None, name=None):
    """Builds (eager: runs) ONE ``SendTPUEmbeddingGradients`` for a step.

    ``feature_to_gradient`` maps feature names to dL/d(activation) (shape of
    the feature's activation).  A feature that is missing or ``None`` gets
    zeros and a :class:`MissingGradientWarning`.  Table mode concatenates each
    table's features (plain ``[B, D]`` -> ``[B, 1, D]``, sequence ``[B, L,
    D]``) on axis 1 in row order and reshapes to ``[-1, D]``; feature mode
    sends one gradient per feature.  ``learning_rates[tag]`` are the dynamic
    learning rates (``layout.num_dynamic_inputs`` of them).  ``config``
    defaults to ``layout.config``.  ``control_inputs`` (ops or tensors, e.g.
    the Recv outputs) are made control dependencies of the Send, which TF
    does not order after the Recv by itself.  Returns the Send op (``None``
    in eager mode).
    """
    unknown = sorted(set(feature_to_gradient) - set(layout.feature_names))
    if unknown:
        raise ValueError("gradients for unknown feature(s) %s; the layout has %s"
                         % (unknown, list(layout.feature_names)))
    learning_rates_for(layout, learning_rates)  # fail before warning about gradients
    gradients = []
    for f in layout.features:
        g = feature_to_gradient.get(f.name)
        if g is None:
            warn_missing_gradient(f.name, stacklevel=2)
            g = tf.zeros(f.shape, tf.float32)
        gradients.append(as_gradient(f, g))
    return build_send(layout, gradients, learning_rates, config=config,
                      control_inputs=control_inputs, name=name)
