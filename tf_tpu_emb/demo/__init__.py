"""The demo jobs behind ``python -m tf_tpu_emb.demo`` (see ``__main__``)."""
