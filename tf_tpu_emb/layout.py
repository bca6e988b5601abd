"""Where every lookup sits in the engine's outputs: the one home, on the
Python side, of "config -> output shapes" (C++: core/config.h).

* :func:`output_shape` -- TF's mid-level rule from an input's shape to its
  feature's activation shape (used by :class:`tf_tpu_emb.TPUEmbedding` and
  the Keras ``TPUEmbeddingLayer``); :func:`v0_output_shape` -- the
  plain-variable ``TPUEmbeddingV0`` rule (dense ids keep their shape);
  :func:`incoming_output_shapes` and :func:`merge_output_shapes` -- the
  mid-level API's output shapes from build / enqueue shapes, with TF's checks.
* :class:`Layout` -- which ``RecvTPUEmbeddingActivations`` output each
  lookup comes from: :meth:`Layout.from_config` for a configuration proto
  (the TF1 raw-op flows), :meth:`Layout.for_features` for a caller that
  already knows its features (no proto round trip).
* :func:`slice_activations` (TF1's ``get_activations``) and its exact inverse
  :func:`send_inputs`, the Send's inputs from per-feature gradients
  (docs/tpu_embedding_semantics.md, section 3.3).

Feature-descriptor configs have one output per feature (``input_shape +
[dim]``); table configs have one output per table (``[batch * num_features,
dim]``, row ``b * num_features + f``) shared by the table's features in the
order the caller gives (a sequence feature of length L takes L consecutive
rows-per-sample).
"""
import collections
import collections.abc
import dataclasses
from typing import Tuple

import tensorflow as tf
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as _config_pb2

__all__ = ["LayoutFeature", "Layout", "slice_activations", "send_inputs", "output_shape",
           "v0_output_shape", "incoming_output_shapes", "merge_output_shapes"]


# ============================================================ output shapes

def output_shape(feature, input_shape):
    """The activation shape (without the table dimension) of `feature` for an
    input of `input_shape` (a list; sparse and ragged inputs as their dense
    shape), by TF's mid-level rule: a rank-2 input whose last dimension is not
    1 of a sequence feature (``max_sequence_length > 0`` and no
    ``output_shape``) becomes ``[batch, max_sequence_length]``; otherwise the
    last dimension is reduced (rank 1 stays as is).  A
    ``FeatureConfig.output_shape`` that is set wins over this rule at the
    callers (they keep their batch handling).
    """
    dims = list(input_shape)
    if (len(dims) == 2 and dims[-1] != 1 and not feature.output_shape
            and feature.max_sequence_length > 0):
        dims.insert(1, feature.max_sequence_length)
    return dims if len(dims) <= 1 else dims[:-1]


def v0_output_shape(feature, input_shape, kind):
    """The activation shape (with the table dimension) of `feature` under
    ``TPUEmbeddingV0`` (TF's plain-variable class) for an input of
    `input_shape`; `kind` is "dense", "sparse" or "ragged".  Dense ids are
    looked up one by one (shape + [dim]); sparse ids reduce their last
    dimension (a rank-2 sequence feature gives ``[batch, L, dim]``); ragged
    ids give ``[batch, dim]``, ``[batch, L, dim]`` or the feature's
    ``output_shape + [dim]``."""
    shape = tuple(input_shape)
    dim = feature.table.dim
    sequence = not feature.output_shape and feature.max_sequence_length > 0
    if kind == "ragged":
        if sequence:
            return (shape[0], feature.max_sequence_length, dim)
        if feature.output_shape:
            return tuple(feature.output_shape.as_list()) + (dim,)
        return (shape[0], dim)
    if kind == "sparse":
        if sequence and len(shape) == 2:
            return (shape[0], feature.max_sequence_length, dim)
        return shape[:-1] + (dim,)
    return shape + (dim,)


def incoming_output_shapes(features, input_shapes=None, batch_size=None):
    """What ``TPUEmbedding.build`` / ``enqueue`` make of per-replica
    ``input_shapes`` (``TensorShape`` s, one per feature) or a
    ``batch_size``: one output shape per feature
    (:class:`tf_tpu_emb.features.Feature` s; their TF ``FeatureConfig``
    decides), with TF's error for an input of rank 0."""
    if input_shapes is None:
        return [tf.TensorShape([batch_size, f.config.max_sequence_length])
                if not f.config.output_shape and f.config.max_sequence_length > 0
                else tf.TensorShape([batch_size]) for f in features]
    out = []
    for shape, f in zip(input_shapes, features):
        if shape.rank is None or shape.rank < 1:
            raise ValueError("Received input tensor of shape {}. Rank must be 1 and above"
                             .format(shape))
        out.append(tf.TensorShape(output_shape(f.config, shape.as_list())))
    return out


def merge_output_shapes(features, incoming):
    """TF's check of ``incoming`` output shapes against those the features
    already have (a contradiction is TF's ``ValueError``); returns the
    features with the incoming shapes where theirs are not set."""
    for f, new in zip(features, incoming):
        old = tf.TensorShape(f.output_shape)
        if not old.rank or not new.rank:
            continue
        if new.rank in (1, 2) and old.rank > new.rank:
            continue  # ragged / sequence shapes are checked by the engine
        if old.rank != new.rank or any(a and b and a != b
                                       for a, b in zip(old.as_list(), new.as_list())):
            raise ValueError(
                f"Inconsistent shape founded for input feature {f.path}, Output shape is "
                f"set to be {old}, But got incoming output shape {new}")
    # Shapes already set (FeatureConfig.output_shape, build) win.
    return [f if tf.TensorShape(f.output_shape).rank else f.with_output_shape(new)
            for f, new in zip(features, incoming)]


# =================================================================== layout

@dataclasses.dataclass(frozen=True)
class LayoutFeature:
    """One lookup (a feature's activation) and where it sits in Recv's outputs.

    ``table_id``/``lookup_id`` are the attributes of its
    ``TPUEmbeddingActivations`` op; ``output`` is the index of the Recv output
    holding it.  Table mode: the output, reshaped to ``[batch, num_features,
    dim]``, holds this feature at ``[:, offset:offset + width, :]``; ``width``
    is 1 for a plain feature (activation ``[batch, dim]``) and the sequence
    length for a sequence feature (activation ``[batch, L, dim]``).  Feature
    mode: the whole output is the activation (``offset = width = 0``).
    ``shape`` is the activation's static shape.
    """
    name: str
    table_id: int
    lookup_id: int
    output: int
    shape: Tuple[int, ...]
    offset: int = 0
    width: int = 0
    sequence_length: int = 0


def _parse_config(config):
    if isinstance(config, (bytes, bytearray)):
        c = _config_pb2.TPUEmbeddingConfiguration()
        c.ParseFromString(bytes(config))
        return c
    if isinstance(config, _config_pb2.TPUEmbeddingConfiguration):
        return config
    raise TypeError("config must be a TPUEmbeddingConfiguration or its serialization, got %r"
                    % type(config).__name__)


# The message of a dynamic input (a value fed by tag at every step): TF 2.16-2.18
# name it DynamicLearningRate (the learning rate was the only one), TF >= 2.19
# OptimizerDynamicInput.
_DYNAMIC_INPUT_TYPES = ("tensorflow.tpu.OptimizerDynamicInput",
                        "tensorflow.tpu.DynamicLearningRate")


def _dynamic_tags(message, tags):
    """Collects the tags of every OptimizerDynamicInput inside `message` (the
    dynamic learning rate, FrequencyAwareAdagrad's step counter, ...)."""
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        values = [value] if hasattr(value, "ListFields") else value  # repeated
        for v in values:
            if field.message_type.full_name in _DYNAMIC_INPUT_TYPES:
                tags.add(v.tag)
            else:
                _dynamic_tags(v, tags)


def _feature_entry(entry):
    if isinstance(entry, str):
        return entry, 0
    name, length = entry
    if not isinstance(name, str) or int(length) < 0:
        raise ValueError("a table-mode feature is a name or (name, max_sequence_length >= 0), "
                         "got %r" % (entry,))
    return name, int(length)


@dataclasses.dataclass(frozen=True)
class Layout:
    """What Recv returns and how lookups map onto it (build with :meth:`from_config`).

    ``output_tables[o]`` / ``output_shapes[o]``: table and shape of Recv
    output ``o`` (engine order).  ``features``: every lookup, in engine order
    (table mode: tables in config order, each table's features in the order
    given; feature mode: feature descriptors in config order).
    ``num_dynamic_inputs``: how many ``learning_rates`` a Send takes.
    ``engine``: the engine's name (set by the object that configured it).
    """
    config: bytes
    feature_mode: bool
    table_names: Tuple[str, ...]
    table_dims: Tuple[int, ...]
    batch_size: int
    output_tables: Tuple[int, ...]
    output_shapes: Tuple[Tuple[int, ...], ...]
    features: Tuple[LayoutFeature, ...]
    num_dynamic_inputs: int
    # The engine whose Recv produced these outputs and which the Send of
    # their gradients must reach ("" = the process's default engine).
    engine: str = ""

    @classmethod
    def from_config(cls, config, table_features=None):
        """Layout of a ``TPUEmbeddingConfiguration`` (proto or serialized bytes).

        Feature mode (the config has feature descriptors): one lookup per
        descriptor, named after it (``feature_<i>`` when unnamed), with
        ``lookup_id`` = its index among the descriptors of its table.  Leave
        ``table_features`` unset.

        Table mode: ``table_features`` gives each table's features in the order
        of their rows, as a list indexed by table id or a mapping from table
        name; a feature is a name or ``(name, max_sequence_length)`` (0 = not
        a sequence).  ``lookup_id`` = index in that list, and the widths must
        add up to the table's ``num_features``.
        """
        c = _parse_config(config)
        names = tuple(t.name for t in c.table_descriptor)
        dims = tuple(int(t.dimension) for t in c.table_descriptor)
        tags = set()
        for t in c.table_descriptor:
            _dynamic_tags(t.optimization_parameters, tags)
        features = []
        if len(c.feature_descriptor):
            if table_features is not None:
                raise ValueError("table_features is only for configs without feature "
                                 "descriptors")
            per_table = collections.Counter()
            for i, fd in enumerate(c.feature_descriptor):
                t = fd.table_id
                if not 0 <= t < len(names):
                    raise ValueError("feature descriptor %d has table_id %d outside [0, %d)"
                                     % (i, t, len(names)))
                features.append(LayoutFeature(
                    name=fd.name or "feature_%d" % i, table_id=t, lookup_id=per_table[t],
                    output=i, shape=tuple(fd.input_shape) + (dims[t],)))
                per_table[t] += 1
            output_tables = tuple(f.table_id for f in features)
            output_shapes = tuple(f.shape for f in features)
            batch = 0
        else:
            if table_features is None:
                raise ValueError("a config without feature descriptors needs table_features: "
                                 "the features of each table in row order")
            if isinstance(table_features, collections.abc.Mapping):
                unknown = set(table_features) - set(names)
                if unknown:
                    raise ValueError("table_features names unknown table(s) %s; the config "
                                     "has %s" % (sorted(unknown), list(names)))
                table_features = [table_features.get(n, ()) for n in names]
            table_features = list(table_features)
            if len(table_features) != len(names):
                raise ValueError("table_features has %d entries but the config has %d tables"
                                 % (len(table_features), len(names)))
            batch = int(c.batch_size_per_tensor_core)
            for t, entries in enumerate(table_features):
                offset = 0
                for k, entry in enumerate(entries):
                    name, length = _feature_entry(entry)
                    width = length or 1
                    shape = (batch, length, dims[t]) if length else (batch, dims[t])
                    features.append(LayoutFeature(
                        name=name, table_id=t, lookup_id=k, output=t, shape=shape,
                        offset=offset, width=width, sequence_length=length))
                    offset += width
                if offset != c.table_descriptor[t].num_features:
                    raise ValueError(
                        "table '%s' has num_features %d but its features %s take %d rows "
                        "per sample" % (names[t], c.table_descriptor[t].num_features,
                                        [_feature_entry(e)[0] for e in entries], offset))
            output_tables = tuple(range(len(names)))
            output_shapes = tuple((batch * c.table_descriptor[t].num_features, dims[t])
                                  for t in output_tables)
        seen = collections.Counter(f.name for f in features)
        duplicated = sorted(n for n, k in seen.items() if k > 1)
        if duplicated:
            raise ValueError("feature names must be unique, repeated: %s" % duplicated)
        return cls(config=c.SerializeToString(), feature_mode=bool(len(c.feature_descriptor)),
                   table_names=names, table_dims=dims, batch_size=batch,
                   output_tables=output_tables, output_shapes=output_shapes,
                   features=tuple(features), num_dynamic_inputs=len(tags))

    @classmethod
    def for_features(cls, config, table_names, table_dims, features, num_dynamic_inputs):
        """Feature-mode layout built from what the caller already knows (the
        mid-level API at build time), without parsing the config back.

        ``config``: the serialized configuration the Send will carry;
        ``features``: per Recv output (engine order) ``(name, table_id,
        output_shape)``, ``output_shape`` without the table dimension;
        ``num_dynamic_inputs``: how many ``learning_rates`` a Send takes.
        """
        table_dims = tuple(int(d) for d in table_dims)
        per_table = collections.Counter()
        entries = []
        for i, (name, table_id, shape) in enumerate(features):
            entries.append(LayoutFeature(
                name=name, table_id=table_id, lookup_id=per_table[table_id], output=i,
                shape=tuple(int(d) for d in shape) + (table_dims[table_id],)))
            per_table[table_id] += 1
        return cls(config=config, feature_mode=True, table_names=tuple(table_names),
                   table_dims=table_dims, batch_size=0,
                   output_tables=tuple(f.table_id for f in entries),
                   output_shapes=tuple(f.shape for f in entries), features=tuple(entries),
                   num_dynamic_inputs=int(num_dynamic_inputs))

    @property
    def feature_names(self):
        return tuple(f.name for f in self.features)

    def feature(self, name):
        """The :class:`LayoutFeature` called `name`."""
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError("no feature %r in the layout (features: %s)"
                       % (name, list(self.feature_names)))

    def table_features(self, table_id):
        """The lookups of table `table_id`, by lookup_id."""
        return tuple(sorted((f for f in self.features if f.table_id == table_id),
                            key=lambda f: f.lookup_id))


def slice_activations(layout, recv_outputs):
    """Per-feature activations from Recv's outputs (TF1's ``get_activations``).

    Returns an ``OrderedDict`` feature name -> tensor in ``layout.features``
    order.  Table mode: each table output is reshaped to ``[batch,
    num_features, dim]``; a plain feature is ``[:, offset, :]`` (``[batch,
    dim]``), a sequence feature ``[:, offset:offset + L, :]`` (``[batch, L,
    dim]``).  Feature mode: the outputs themselves.
    """
    recv_outputs = list(recv_outputs)
    if len(recv_outputs) != len(layout.output_shapes):
        raise ValueError("got %d Recv outputs but the layout has %d"
                         % (len(recv_outputs), len(layout.output_shapes)))
    result = collections.OrderedDict()
    if layout.feature_mode:
        for f in layout.features:
            result[f.name] = recv_outputs[f.output]
        return result
    per_sample = {}
    for f in layout.features:
        if f.output not in per_sample:
            rows, dim = layout.output_shapes[f.output]
            nf = rows // layout.batch_size if layout.batch_size else 0
            per_sample[f.output] = tf.reshape(recv_outputs[f.output],
                                              [layout.batch_size, nf, dim])
        table = per_sample[f.output]
        if f.sequence_length:
            result[f.name] = table[:, f.offset:f.offset + f.width, :]
        else:
            result[f.name] = table[:, f.offset, :]
    return result


def send_inputs(layout, gradients):
    """Recv-shaped Send inputs from per-feature gradients (layout order);
    table mode is the exact inverse of :func:`slice_activations`."""
    if layout.feature_mode:
        return [gradients[i] for i in range(len(layout.features))]
    per_output = collections.defaultdict(list)
    for f, g in zip(layout.features, gradients):
        per_output[f.output].append((f.offset, g if f.sequence_length else
                                     tf.expand_dims(g, 1)))
    inputs = []
    for o, (rows, dim) in enumerate(layout.output_shapes):
        blocks = [g for _, g in sorted(per_output[o], key=lambda x: x[0])]
        if not blocks:  # a table without features: its output is [0, dim]
            inputs.append(tf.zeros([rows, dim], tf.float32))
            continue
        joined = blocks[0] if len(blocks) == 1 else tf.concat(blocks, axis=1)
        inputs.append(tf.reshape(joined, [-1, dim]))
    return inputs
