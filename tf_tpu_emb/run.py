"""``python -m tf_tpu_emb.run [--replicas N] [--embedding v1|v2] SCRIPT [ARGS...]`` or
``python -m tf_tpu_emb.run [--replicas N] [--embedding v1|v2] -m MODULE [ARGS...]``:
runs a TPU program unchanged on the CPU stand-in for the TPU system
(:mod:`tf_tpu_emb.tpu`).

The program runs as ``python SCRIPT ARGS`` / ``python -m MODULE ARGS`` would
run it -- ``sys.argv``, ``__main__``, ``sys.path[0]``, exit status and
uncaught exceptions are the program's -- after ``tf_tpu_emb.tpu.install(N,
embedding=E)`` (N defaults to 1, or ``$TF_TPU_EMB_REPLICAS``; E to ``v1``, or
``$TF_TPU_EMB_EMBEDDING``: ``v2`` is a SparseCore TPU for TF's
``TPUEmbeddingV2``).  ``-m pytest ...`` runs a library's own TPU tests under
the stand-in.
"""
import os
import runpy
import sys

USAGE = ("usage: python -m tf_tpu_emb.run [--replicas N] [--embedding v1|v2] SCRIPT [ARGS...]\n"
         "       python -m tf_tpu_emb.run [--replicas N] [--embedding v1|v2] -m MODULE [ARGS...]")


def _parse(argv):
    """(replicas, embedding, module or None, script or None, program args);
    exits 2 on bad usage."""
    replicas = os.environ.get("TF_TPU_EMB_REPLICAS", "1")
    embedding = None  # install() reads $TF_TPU_EMB_EMBEDDING
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            print(USAGE)
            sys.exit(0)
        if arg == "--replicas" and i + 1 < len(argv):
            replicas, i = argv[i + 1], i + 2
        elif arg.startswith("--replicas="):
            replicas, i = arg.split("=", 1)[1], i + 1
        elif arg == "--embedding" and i + 1 < len(argv):
            embedding, i = argv[i + 1], i + 2
        elif arg.startswith("--embedding="):
            embedding, i = arg.split("=", 1)[1], i + 1
        elif arg == "-m" and i + 1 < len(argv):
            return replicas, embedding, argv[i + 1], None, argv[i + 2:]
        elif arg.startswith("-m") and len(arg) > 2:
            return replicas, embedding, arg[2:], None, argv[i + 1:]
        elif arg.startswith("-"):
            break
        else:
            return replicas, embedding, None, arg, argv[i + 1:]
    print(USAGE, file=sys.stderr)
    sys.exit(2)


def main(argv=None):
    replicas, embedding, module, script, args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        replicas = int(replicas)
        if replicas < 1:
            raise ValueError
    except ValueError:
        print("tf_tpu_emb.run: --replicas must be a positive integer, got %r" % replicas,
              file=sys.stderr)
        sys.exit(2)
    if embedding is None:
        embedding = os.environ.get("TF_TPU_EMB_EMBEDDING", "") or "v1"
    if embedding not in ("v1", "v2"):
        print("tf_tpu_emb.run: --embedding must be v1 or v2, got %r" % embedding,
              file=sys.stderr)
        sys.exit(2)
    from tf_tpu_emb import tpu  # pylint: disable=import-outside-toplevel
    tpu.install(replicas, embedding=embedding)
    if module is not None:
        sys.argv = [module] + list(args)  # runpy puts the module's path in argv[0]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [script] + list(args)
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
