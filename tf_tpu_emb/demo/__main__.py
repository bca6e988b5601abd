"""`python -m tf_tpu_emb.demo`: the DLRM-style job (see `dlrm`)."""
import sys

from tf_tpu_emb.demo import dlrm

if __name__ == "__main__":
    sys.exit(dlrm.main())
