"""`python -m tf_tpu_emb.demo [--data {synthetic,movielens-100k}] ...`

``--data synthetic`` (the default): the DLRM-style CTR job on a generated
click log (``dlrm``).  ``--data movielens-100k``: the rating job on
MovieLens-100k with 5-fold cross-validation (``movielens``).  Every other flag
belongs to the chosen job (``--data movielens-100k --help`` lists its flags).
The arguments are parsed (``cli``) before TensorFlow is imported, so
``--help`` and argument errors answer at once.
"""
import sys

from tf_tpu_emb.demo import cli


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if cli.data_choice(argv) == "movielens-100k":
        args = cli.movielens_args(argv)
        from tf_tpu_emb.demo import movielens  # pylint: disable=import-outside-toplevel
        return movielens.run(args)
    args = cli.dlrm_args(argv)
    from tf_tpu_emb.demo import dlrm  # pylint: disable=import-outside-toplevel
    return dlrm.run(args)


if __name__ == "__main__":
    sys.exit(main())
