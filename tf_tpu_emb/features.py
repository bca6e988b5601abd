"""One flat feature of a model, as every layer behind ``TPUEmbedding`` sees it.

:class:`Feature` is the one per-feature record: ``TPUEmbedding`` keeps one
per flattened entry of its feature config (in the config's feature-descriptor
order), ``backend_factory`` hands them to the backend, and the hosts' router
(``cluster/routing.py``) reads their combiners.  It imports nothing, so any
module can use it without an upward import.
"""
import dataclasses


def _shape_tuple(shape):
    """``shape`` (a list, a tuple, a ``tf.TensorShape``, or None) as a tuple
    of ints and Nones (unknown dimensions), or None for an unknown rank."""
    if shape is None or getattr(shape, "rank", 0) is None:
        return None
    return tuple(None if d is None else int(d) for d in shape)


@dataclasses.dataclass(frozen=True)
class Feature:
    """One flat feature: its key path (``"user/friends"``: the name the
    engine's errors use), its activation's per-replica output shape (a tuple
    of ints, None for a dimension not known yet; None for an unknown rank),
    its table's vocabulary size and combiner, and (where the mid-level API
    made it) TF's ``FeatureConfig`` it came from."""

    path: str
    output_shape: tuple
    vocabulary_size: int
    combiner: str
    config: object = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "output_shape", _shape_tuple(self.output_shape))
        object.__setattr__(self, "vocabulary_size", int(self.vocabulary_size))

    @classmethod
    def of(cls, path, config):
        """The record of TF's ``FeatureConfig`` ``config`` at key path ``path``."""
        return cls(path, config.output_shape, config.table.vocabulary_size,
                   config.table.combiner, config)

    @property
    def fully_defined(self):
        """The output shape is known in every dimension."""
        return self.output_shape is not None and None not in self.output_shape

    def with_output_shape(self, output_shape):
        """This feature with another output shape."""
        return dataclasses.replace(self, output_shape=output_shape)
