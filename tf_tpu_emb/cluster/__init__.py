"""Tables sharded over several embedding hosts on TensorFlow's distributed runtime."""
from tf_tpu_emb.cluster.routing import Router, FeatureRoute  # noqa: F401
