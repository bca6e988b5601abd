"""1 replica vs 4 replicas on the same global batch (run by
tests/engine/test_optimizer_pipeline.py::test_one_vs_four_replicas).

TF's logical CPU devices must be configured before its runtime starts, so
this runs as its own process with 4 logical CPUs.  Per case: the same
initial state and global batches (8 samples) are trained on an engine with
num_tensor_cores = 1 and on one with 4 (2 samples per replica, split
contiguously; one Python thread per replica doing enqueue(device_ordinal r),
Recv and Send under /CPU:r); every Recv is checked against the numpy
reference state of that step (so a Recv that did not wait for the previous
step's update fails), and the retrieved tables and slots of both runs are
compared with each other (tight) and with the numpy reference.  Prints
"ERRORS <label> <max abs> <max ratio>" lines, then "OK"; exit 1 on failure.
"""
import os
import sys
import threading
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "common"))  # the shared test helpers
import child_script  # noqa: E402

R = 4
tf = child_script.tensorflow_with_cpus(R)

import numpy as np  # noqa: E402
import engine_util as eu  # noqa: E402
import optimizer_reference as ref  # noqa: E402
import optimizer_training as T  # noqa: E402
from optimizer_reference import TableParams  # noqa: E402

GLOBAL = 8
PER = GLOBAL // R
STEPS = 3
# one replica vs four must agree to float32 round-off of the summation order
# (which is the same here: outputs, then replicas, then bags = global order)
TIGHT_RTOL, TIGHT_ATOL = 1e-6, 1e-7

ADAM = dict(beta1=0.9, beta2=0.99, epsilon=1e-3)
CASES = {
    "adagrad": ([TableParams("adagrad")] * 2, None),
    "adagrad-accumulation_disabled": ([TableParams("adagrad", accumulate=False)] * 2, None),
    "adam-lazy-dynamic_lr": ([TableParams("adam", ADAM, lr_tag=0),
                              TableParams("adam", ADAM, lr_tag=1)],
                             [[0.1, 0.05], [0.2, 0.1], [0.05, 0.3]]),
    "adam-nonlazy-sum_inside_sqrt": ([TableParams("adam", dict(ADAM, use_non_lazy_adam=True,
                                                               use_sum_inside_sqrt=True))] * 2,
                                     None),
}


def split(batch, r):
    return {k: v[r * PER:(r + 1) * PER] for k, v in batch.items()}


def check_acts(got, want, what):
    for o, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg="%s output %d" % (what, o))


def run_engine(params, init, history, acts, replicas):
    config = T.make_config(params, batch=GLOBAL // replicas, num_tensor_cores=replicas)
    with eu.engine(config):
        for t, st in enumerate(init):
            eu.load_table(config.table_descriptor[t], st)
        if replicas == 1:
            for s, (bags, grads, dyn) in enumerate(history):
                T.enqueue(bags)
                check_acts(eu.recv(config), acts[s], "1 replica step %d" % s)
                T.send(config, grads, dyn)
        else:
            errors = []

            def worker(r):
                try:
                    with tf.device("/CPU:%d" % r):
                        for s, (bags, grads, dyn) in enumerate(history):
                            T.enqueue(split(bags, r), device_ordinal=r)
                            got = eu.recv(config)
                            check_acts(got, [a[r * PER:(r + 1) * PER] for a in acts[s]],
                                       "replica %d step %d" % (r, s))
                            T.send(config, [g[r * PER:(r + 1) * PER] for g in grads], dyn)
                except Exception:  # reported by the main thread
                    errors.append(traceback.format_exc())

            threads = [threading.Thread(target=worker, args=(r,)) for r in range(replicas)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(240)
            assert not any(th.is_alive() for th in threads), "a replica thread hangs"
            assert not errors, "\n".join(errors)
        return T.retrieve_all(config)


def main():
    assert len(tf.config.list_logical_devices("CPU")) == R
    for case, (params, lrs) in CASES.items():
        rng = np.random.default_rng(T.zlib_seed("replicas", case))
        init = [T.initial_state(rng, p.optimizer, vocab, dim)
                for (_, vocab, dim), p in zip(T.TABLES, params)]
        history, acts = [], []
        want = [ref.copy_state(st) for st in init]
        for s in range(STEPS):
            bags, grads = T.make_batch(rng, GLOBAL), T.make_grads(rng, GLOBAL)
            dyn = lrs[s] if lrs else []
            history.append((bags, grads, dyn))
            acts.append(T.expected_activations(bags, want))
            for t, p in enumerate(params):
                ref.step(p, want[t], ref.contributions(T.table_outputs(bags, grads, t)), dyn)
        one = run_engine(params, init, history, acts, 1)
        four = run_engine(params, init, history, acts, R)
        T.compare_tables(four, one, case + " 4 vs 1 replica", TIGHT_RTOL, TIGHT_ATOL)
        T.compare_tables(one, want, case + " 1 replica vs numpy")
        T.compare_tables(four, want, case + " 4 replicas vs numpy")
    for label, (a, r) in sorted(T.ERRORS.items()):
        print("ERRORS %s %.3g %.3g" % (label, a, r))
    print("OK")


if __name__ == "__main__":
    child_script.run(main)
