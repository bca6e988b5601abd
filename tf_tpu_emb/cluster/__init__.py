"""Several embedding hosts: tables sharded over tasks of TensorFlow's
distributed runtime (see README "Running on several machines").

`hosts` is the process/infrastructure layer (the cluster object, connection,
health checks, error translation); `routing` splits a replica's batch per host
and `sharded` is the cross-host data path of one model.  The shard
arithmetic (whole tables <-> S host shards) is `tf_tpu_emb.sharding`, outside
this package: single-process users need it too and must not load this one."""
from tf_tpu_emb.cluster.hosts import EmbeddingHosts  # noqa: F401
from tf_tpu_emb.cluster.routing import Router  # noqa: F401
