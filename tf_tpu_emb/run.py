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

``python -m tf_tpu_emb.run --jax [--replicas N] [--sparsecores-per-chip S]
SCRIPT|-m MODULE`` runs a JAX program written for a SparseCore TPU
(jax-tpu-embedding, Keras-RS on JAX) on N CPU devices presented as TPU
chips of S SparseCores (:mod:`tf_tpu_emb.jax.standin`; S defaults to
``$TF_TPU_EMB_SPARSECORES`` or 4).  TensorFlow is not imported on that path.
"""
import os
import runpy
import sys

USAGE = ("usage: python -m tf_tpu_emb.run [--replicas N] [--embedding v1|v2] SCRIPT [ARGS...]\n"
         "       python -m tf_tpu_emb.run [--replicas N] [--embedding v1|v2] -m MODULE [ARGS...]\n"
         "       python -m tf_tpu_emb.run --jax [--replicas N] [--sparsecores-per-chip S] "
         "SCRIPT|-m MODULE [ARGS...]")


def _parse(argv, jax_options=None):
    """(replicas, embedding, module or None, script or None, program args);
    exits 2 on bad usage.  ``--jax`` and ``--sparsecores-per-chip S`` go into
    the dict jax_options (keys "jax", "sparsecores")."""
    replicas = os.environ.get("TF_TPU_EMB_REPLICAS", "1")
    embedding = None  # install() reads $TF_TPU_EMB_EMBEDDING
    jax_options = {} if jax_options is None else jax_options
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            print(USAGE)
            sys.exit(0)
        if arg == "--jax":
            jax_options["jax"], i = True, i + 1
            continue
        if arg == "--sparsecores-per-chip" and i + 1 < len(argv):
            jax_options["sparsecores"], i = argv[i + 1], i + 2
            continue
        if arg.startswith("--sparsecores-per-chip="):
            jax_options["sparsecores"], i = arg.split("=", 1)[1], i + 1
            continue
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
    jax_options = {}
    replicas, embedding, module, script, args = _parse(
        sys.argv[1:] if argv is None else argv, jax_options)
    try:
        replicas = int(replicas)
        if replicas < 1:
            raise ValueError
    except ValueError:
        print("tf_tpu_emb.run: --replicas must be a positive integer, got %r" % replicas,
              file=sys.stderr)
        sys.exit(2)
    if jax_options.get("jax"):
        if embedding is not None:
            print("tf_tpu_emb.run: --embedding is TensorFlow's; --jax runs a JAX program",
                  file=sys.stderr)
            sys.exit(2)
        from tf_tpu_emb.jax import standin  # pylint: disable=import-outside-toplevel
        try:
            standin.install(replicas, num_sc_per_device=jax_options.get("sparsecores"))
        except ValueError as e:
            print("tf_tpu_emb.run: %s" % e, file=sys.stderr)
            sys.exit(2)
        _run(module, script, args)
        return
    if "sparsecores" in jax_options:
        print("tf_tpu_emb.run: --sparsecores-per-chip needs --jax", file=sys.stderr)
        sys.exit(2)
    if embedding is None:
        embedding = os.environ.get("TF_TPU_EMB_EMBEDDING", "") or "v1"
    if embedding not in ("v1", "v2"):
        print("tf_tpu_emb.run: --embedding must be v1 or v2, got %r" % embedding,
              file=sys.stderr)
        sys.exit(2)
    from tf_tpu_emb import tpu  # pylint: disable=import-outside-toplevel
    tpu.install(replicas, embedding=embedding)
    _run(module, script, args)


def _run(module, script, args):
    """Runs the program as ``python SCRIPT ARGS`` / ``python -m MODULE ARGS``."""
    if module is not None:
        sys.argv = [module] + list(args)  # runpy puts the module's path in argv[0]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [script] + list(args)
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
