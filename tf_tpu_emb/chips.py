"""Facts of the TPU chips the CPU stand-ins present (imports nothing).

Both stand-ins read them: TF's (:mod:`tf_tpu_emb.tpu.system`, ``--embedding
v2``) and JAX's (:mod:`tf_tpu_emb.jax.standin`, ``--jax``).
"""

# SparseCores per chip of the stand-in SparseCore TPU: 4, as on TPU v5p
# (jax-tpu-embedding 0.2.0's ``utils.NUM_SC_PER_DEVICE_MAP``: 'TPU v5' 4,
# 'TPU v6 lite' 2).  TF's TPUEmbeddingV2 reads it from
# ``tpu_hardware_feature.num_embedding_devices_per_chip`` and falls back to
# the same 4 when a topology reports 0; its gradient stacking,
# ``_stack_gradients``, handles at most 4.
SPARSECORES_PER_CHIP = 4
