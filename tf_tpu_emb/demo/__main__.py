"""`python -m tf_tpu_emb.demo [--data {synthetic,movielens-100k}] ...`

``--data synthetic`` (the default): the DLRM-style CTR job on a generated
click log (``dlrm``).  ``--data movielens-100k``: the rating job on
MovieLens-100k with 5-fold cross-validation (``movielens``).  Every other flag
belongs to the chosen job (``--data movielens-100k --help`` lists its flags).
"""
import argparse
import sys

DATA = ("synthetic", "movielens-100k")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--data", choices=DATA, default="synthetic")
    known, _ = pre.parse_known_args(argv)
    if known.data == "movielens-100k":
        from tf_tpu_emb.demo import movielens
        return movielens.main(argv)
    from tf_tpu_emb.demo import dlrm
    return dlrm.main(argv)


if __name__ == "__main__":
    sys.exit(main())
