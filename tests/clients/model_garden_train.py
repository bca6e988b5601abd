"""Runs Model Garden's own ``official/recommendation/ranking/train.py`` as
``python -m official.recommendation.ranking.train ARGS`` would (run by
tests/clients/test_model_garden.py under ``python -m tf_tpu_emb.run``), then
reports how many TPU embeddings the stand-in's TPU system configured."""
import runpy
import sys

import tf_tpu_emb.tpu

sys.argv = ["train.py"] + sys.argv[1:]
try:
    runpy.run_module("official.recommendation.ranking.train", run_name="__main__",
                     alter_sys=True)
except SystemExit as e:
    if e.code not in (0, None):
        raise
print("EMBEDDINGS_BUILT %d" % tf_tpu_emb.tpu.installed().embeddings_built)
print("OK")
