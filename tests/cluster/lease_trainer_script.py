"""A trainer process for tests/cluster/test_lifecycle.py.

``python lease_trainer_script.py CLUSTER_JSON LEASE_S``: connects to the
embedding hosts, builds the model of ``lifecycle_model`` (its lease on every
host: LEASE_S seconds), prints ``BUILT <engine name>`` and then obeys one
command per stdin line: ``step N`` runs training step N and prints ``OK`` or
``ERROR <class> <message>``; end of input exits.  The test SIGKILLs it to
play a crashed trainer.
"""
import json
import sys

import tensorflow as tf

import lifecycle_model as model
from tf_tpu_emb.cluster import EmbeddingHosts


def main():
    spec, lease_s = json.loads(sys.argv[1]), float(sys.argv[2])
    hosts = EmbeddingHosts(spec, lease_s=lease_s)
    hosts.connect()
    emb = model.make(hosts)
    emb.build(model.B)
    print("BUILT", emb.layout.engine, flush=True)
    for line in sys.stdin:
        command = line.split()
        if command[:1] == ["step"]:
            try:
                model.step(emb, int(command[1]))
                print("OK", flush=True)
            except tf.errors.OpError as e:
                print("ERROR", type(e).__name__, e.message.replace("\n", " "), flush=True)


if __name__ == "__main__":
    main()
