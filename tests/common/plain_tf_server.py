"""A plain tf.distribute.Server (no tf_tpu_emb kernels) for cluster tests: a task
that was not started with ``python -m tf_tpu_emb.server``.

usage: plain_tf_server.py CLUSTER_JSON TASK REPLICAS LIFETIME_S
Prints the same readiness line as the real server; exits after LIFETIME_S or
when its parent goes away.
"""
import json
import os
import sys
import time

import tensorflow as tf

cluster, task, replicas, lifetime = (json.loads(sys.argv[1]), int(sys.argv[2]),
                                     int(sys.argv[3]), float(sys.argv[4]))
server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="embedding",
                              task_index=task, protocol="grpc", start=True,
                              config=tf.compat.v1.ConfigProto(device_count={"CPU": replicas}))
print("tf_tpu_emb.server ready job=embedding task=%d address=%s devices=%d"
      % (task, cluster["embedding"][task], replicas), flush=True)
parent, end = os.getppid(), time.monotonic() + lifetime
while time.monotonic() < end and os.getppid() == parent:
    time.sleep(0.5)
os._exit(0)
