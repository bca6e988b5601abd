"""What the tests of the optimizer config classes share
(tests/api/test_optimizer_{classes,state,descriptors}.py): the list of
generated classes, a constructor that fills in FrequencyEstimator's required
arguments, and the OptimizationParameters an optimizer writes compared with
hand-written protos."""
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2

import engine_util as eu
import tf_tpu_emb


E = tf.tpu.experimental.embedding
Params = optimization_parameters_pb2.OptimizationParameters
TableDescriptor = eu.Config.TableDescriptor


GENERATED = ["Momentum", "RMSProp", "CenteredRMSProp", "ProximalAdagrad", "Adadelta",
             "ProximalYogi", "OnlineYogi", "Lion", "FrequencyEstimator", "BoundedAdagrad",
             "FrequencyAwareAdagrad", "Assign"]
FE_ARGS = dict(tau=0.25, max_delta=8.0, outlier_threshold=2.0, weight_exponent=0.5)


def make(name, **kwargs):
    """An instance of generated class `name` (FrequencyEstimator gets its
    required arguments)."""
    cls = getattr(tf_tpu_emb, name)
    if name == "FrequencyEstimator":
        kwargs = dict(dict(learning_rate=1.0, **FE_ARGS), **kwargs)
    return cls(**kwargs)


def written(opt, **kwargs):
    p = Params()
    opt._set_optimization_parameters(p, **kwargs)
    return p


def parse(text):
    return text_format.Parse(text, Params())


def assert_proto(got, want_text):
    want = parse(want_text)
    assert got == want, "got:\n%s\nwant:\n%s" % (got, want)
