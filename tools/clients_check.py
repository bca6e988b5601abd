"""`make clients-venv`'s check: the client venv's TensorFlow is the main venv's
(the Makefile's TF_VERSION, shared through a .pth file, never replaced by a client's
requirements), and `pip check` reports nothing but what the lane does on
purpose: tf-models-official installed with --no-deps (its other requirements
are not needed by official.recommendation.ranking), and requirements on the
distribution "tensorflow", which the shared "tensorflow-cpu" provides.
usage: python tools/clients_check.py TF_VERSION MAIN_SITE"""
import re
import subprocess
import sys

want_version, main_site = sys.argv[1], sys.argv[2]
import tensorflow as tf  # noqa: E402

assert tf.__version__ == want_version, (tf.__version__, want_version)
assert tf.__file__.startswith(main_site), ("TensorFlow is not the main venv's", tf.__file__)
out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                     text=True).stdout
expected = [re.compile(r"tf-models-official \S+ requires .*, which is not installed\."),
            re.compile(r"\S+ \S+ requires tensorflow, which is not installed\.")]
unexpected = [line for line in out.splitlines()
              if line.strip() and not line.startswith("No broken requirements")
              and not any(p.fullmatch(line.strip()) for p in expected)]
if unexpected:
    sys.exit("pip check: unexpected problems:\n" + "\n".join(unexpected))
print("clients venv: TensorFlow %s from %s; pip check: only the deliberate --no-deps "
      "and tensorflow-cpu-for-tensorflow lines" % (tf.__version__, tf.__file__))
