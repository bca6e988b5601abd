"""The demo's command lines, parsed without TensorFlow.

``python -m tf_tpu_emb.demo --help`` (and every argument error) answers at
once: this module imports argparse only, and the jobs (``dlrm``,
``movielens``), which import TensorFlow, are imported after the arguments are
parsed.  Each job's defaults, with and without ``--quick``, live here too.
A ``--quick`` run writes to its own folder (``out/demo-quick``,
``out/movielens-quick``), so a smoke run never overwrites a full run's output.
"""
import argparse
import os

DATA = ("synthetic", "movielens-100k")
#: Where the MovieLens job keeps the RecBole wheel (``movielens_data``).
CACHE_ENV = "TF_TPU_EMB_CACHE"

DLRM_DEFAULTS = dict(steps=2000, batch_size=2048, dim=16, max_vocab=100_000, eval_every=200,
                     eval_examples=32768)
DLRM_QUICK = dict(steps=80, batch_size=256, dim=8, max_vocab=2_000, eval_every=20,
                  eval_examples=2048)
MOVIELENS_DEFAULTS = dict(folds=5, run_folds=None, epochs=20, batch_size=512, dim=32,
                          max_ratings=None)
MOVIELENS_QUICK = dict(folds=5, run_folds=1, epochs=1, batch_size=128, dim=8, max_ratings=4000)


def data_choice(argv):
    """The job ``--data`` picks (``synthetic`` unless given)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--data", choices=DATA, default="synthetic")
    known, _ = pre.parse_known_args(argv)
    return known.data


def _job_parser(prog, description, defaults, quick):
    """An argument parser whose epilog lists a job's defaults with and without --quick."""
    def listing(values):
        return ", ".join("%s %s" % (k, v) for k, v in values.items())
    return argparse.ArgumentParser(
        prog=prog, description=description,
        epilog="Defaults without --quick: %s; with --quick: %s." % (listing(defaults),
                                                                    listing(quick)))


def _parse_job_args(parser, argv, defaults, quick, out, quick_help):
    """Adds --out and --quick, parses, and fills every flag left unset (None)
    from `quick` or `defaults`; --out defaults to `out`, or `out`-quick with
    --quick."""
    parser.add_argument("--out", help="output folder (default %s; %s-quick with --quick)"
                        % (out, out))
    parser.add_argument("--quick", action="store_true", help=quick_help)
    args = parser.parse_args(argv)
    for k, v in (quick if args.quick else defaults).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.out is None:
        args.out = out + "-quick" if args.quick else out
    return args


def dlrm_args(argv=None):
    """The DLRM job's arguments (``python -m tf_tpu_emb.demo``)."""
    p = _job_parser("python -m tf_tpu_emb.demo",
                    "`make demo` / `python -m tf_tpu_emb.demo`: train a DLRM-style CTR model "
                    "on CPU (26 engine tables through TF's TPU-embedding API, Keras MLPs) and "
                    "serve it from a stock-op SavedModel.", DLRM_DEFAULTS, DLRM_QUICK)
    p.add_argument("--data", choices=DATA, default="synthetic",
                   help="synthetic: this job, on a generated click log (default); "
                   "movielens-100k: the rating job on real data (`--data movielens-100k "
                   "--help` for its flags)")
    p.add_argument("--steps", type=int, help="training steps")
    p.add_argument("--batch-size", type=int, help="examples per step")
    p.add_argument("--dim", type=int, help="embedding dimension of every table")
    p.add_argument("--max-vocab", type=int,
                   help="cap on the rows of a table (Criteo's sizes are up to 40M)")
    p.add_argument("--eval-every", type=int, help="steps between held-out evaluations")
    p.add_argument("--eval-examples", type=int,
                   help="held-out examples (rounded up to whole batches)")
    p.add_argument("--interaction", choices=("dot", "cat"), default="dot",
                   help="DLRM's pairwise dot products, or concatenation (default dot)")
    p.add_argument("--embedding-lr", type=float, default=0.05,
                   help="Adagrad learning rate of the tables, applied by the engine "
                   "(default 0.05)")
    p.add_argument("--dense-lr", type=float, default=2e-3,
                   help="Adam learning rate of the MLPs (default 0.002)")
    p.add_argument("--seed", type=int, default=0, help="data and model seed (default 0)")
    p.add_argument("--hosts", type=int, default=0, metavar="S",
                   help="shard the tables over S embedding hosts: S `tf_tpu_emb.server` "
                   "processes started on 127.0.0.1 for the run (default 0: one engine "
                   "in this process)")
    p.add_argument("--write-parquet", metavar="PATH",
                   help="write the generated training log as Parquet and exit")
    p.add_argument("--parquet", metavar="PATH",
                   help="train from this Parquet click log (read with tensorflow-io) "
                   "instead of the generator; written by --write-parquet with the same "
                   "--max-vocab")
    args = _parse_job_args(p, argv, DLRM_DEFAULTS, DLRM_QUICK, os.path.join("out", "demo"),
                           "tiny run (small tables, few steps) for smoke tests")
    if args.hosts < 0:
        p.error("--hosts must be >= 0")
    if args.hosts and (args.parquet or args.write_parquet):
        p.error("--hosts does not combine with --parquet / --write-parquet")
    if min(args.steps, args.batch_size, args.dim, args.max_vocab, args.eval_every,
           args.eval_examples) < 1:
        p.error("--steps, --batch-size, --dim, --max-vocab, --eval-every and "
                "--eval-examples must be >= 1")
    # Whole batches: the engine's output shapes are fixed at build time.
    args.eval_batches = max(1, -(-args.eval_examples // args.batch_size))
    return args


def movielens_args(argv=None):
    """The MovieLens job's arguments (``--data movielens-100k``)."""
    p = _job_parser("python -m tf_tpu_emb.demo --data movielens-100k",
                    "ratings on real data: MovieLens-100k, 5-fold cross-validated, every "
                    "embedding in the engine.", MOVIELENS_DEFAULTS, MOVIELENS_QUICK)
    p.add_argument("--data", choices=("movielens-100k",), default="movielens-100k",
                   help="movielens-100k: this job")
    p.add_argument("--data-path", help="the RecBole 1.2.1 wheel, a folder holding it, or a "
                   "folder with ml-100k.inter/.user/.item (default: the cache, filled by pip "
                   "download on first use)")
    p.add_argument("--cache-dir", help="where the wheel is kept (default $%s, else "
                   "$XDG_CACHE_HOME/tf_tpu_emb, else ~/.cache/tf_tpu_emb)" % CACHE_ENV)
    p.add_argument("--no-download", action="store_true",
                   help="fail instead of downloading when the wheel is not cached")
    p.add_argument("--folds", type=int, help="cross-validation folds")
    p.add_argument("--run-folds", type=int, help="train only the first N folds")
    p.add_argument("--epochs", type=int, help="passes over each fold's training ratings")
    p.add_argument("--batch-size", type=int, help="ratings per step")
    p.add_argument("--dim", type=int, help="embedding dimension (every table has one bias "
                   "column more)")
    p.add_argument("--max-ratings", type=int, help="use only the first N ratings of the file")
    p.add_argument("--hidden", default="64",
                   help="hidden units of the MLP, comma-separated; empty: no MLP (default 64)")
    p.add_argument("--embedding-lr", type=float, default=0.015,
                   help="engine Adagrad learning rate of the tables (default 0.015)")
    p.add_argument("--no-history", action="store_true",
                   help="leave out the rated-movies bag (the user's training ratings' movies)")
    p.add_argument("--dense-lr", type=float, default=1e-4,
                   help="Keras Adam learning rate of the MLP and the global mean (default 1e-4)")
    p.add_argument("--l2", type=float, default=0.05,
                   help="L2 penalty per looked-up vector and rating (default 0.05)")
    p.add_argument("--init-std", type=float, default=0.05,
                   help="std of the tables' truncated-normal initializer (default 0.05)")
    p.add_argument("--seed", type=int, default=0, help="fold split, shuffling and model seed")
    p.add_argument("--validate", action="store_true",
                   help="for tuning: evaluate on 10%% of each fold's training ratings (held "
                   "out from training) instead of the test fold")
    p.add_argument("--verbose", action="store_true", help="print a line per epoch")
    args = _parse_job_args(p, argv, MOVIELENS_DEFAULTS, MOVIELENS_QUICK,
                           os.path.join("out", "movielens"),
                           "one fold, one epoch, a 4,000-rating slice (smoke test)")
    if args.run_folds is None:
        args.run_folds = args.folds
    try:
        args.hidden = [int(h) for h in args.hidden.split(",") if h.strip()]
    except ValueError:
        p.error("--hidden must be comma-separated integers, got %r" % args.hidden)
    if args.folds < 2 or not 1 <= args.run_folds <= args.folds:
        p.error("need --folds >= 2 and 1 <= --run-folds <= --folds")
    if min([args.epochs, args.batch_size, args.dim] + args.hidden) < 1:
        p.error("--epochs, --batch-size, --dim and --hidden must be >= 1")
    if args.max_ratings is not None and args.max_ratings < args.folds * args.batch_size:
        p.error("--max-ratings must leave at least one batch per fold (folds x batch size)")
    return args
