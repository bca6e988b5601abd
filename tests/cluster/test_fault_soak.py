"""Fault soak (issue 31): many cycles of training on 2 real embedding hosts
(``python -m tf_tpu_emb.server`` on 127.0.0.1) by a real trainer process
(soak_trainer_script.py), each with a fault at a random point of a random
step, the documented recovery, and a check that nothing was lost or
half-applied.

A cycle starts from checkpoint C (written by the trainer) at step n0 and
runs steps n0..n0+K-1 while one fault is delivered (seeded choice):

* kinds: ``kill-host`` (SIGKILL a random host), ``hang-host`` (SIGSTOP it
  past the step's deadline: ``hosts.run(timeout_s=)`` must end the step),
  ``pause-host`` (SIGSTOP, SIGCONT within the deadline), ``kill-trainer``
  (SIGKILL the trainer), ``pause-trainer`` (SIGSTOP, SIGCONT), ``none``;
* points: ``enqueue`` (before the step's ids are routed), ``recv`` (the
  activations are back from every host, nothing sent yet: between Recv and
  Send), ``update`` (the gradients released, the fault a random 0-20 ms later:
  during the hosts' Send and update).

Recovery is the README's: a dead or hung host is restarted, the trainer
calls ``hosts.reconnect()`` and restores C; a dead trainer is replaced by a
new process, which must be able to build (the old one's lease ends: no host
left locked) and restores C; then the same steps run again.  After every
cycle every table and slot (Adagrad) must equal a single engine in this
process restored from C and given the same steps, bit for bit.

Time-bounded: cycles start while less than ``TF_TPU_EMB_SOAK_SECONDS``
(default 25: the CI form, about 45 s with the start-up, 5-6 cycles) have
passed (at least 2 cycles run); ``TF_TPU_EMB_SOAK_SEED`` (default 22, whose
first cycles kill a host, kill the trainer, hang and pause a host) seeds
the choices (printed; fault timing is real time, so not every cycle
replays exactly); ``TF_TPU_EMB_SOAK_REPORT`` names a JSON file for the
counts; ``TF_TPU_EMB_SOAK_FAULTS=KIND@POINT,...`` plays only those faults,
in turn (to reproduce one); ``TF_TPU_EMB_SOAK_HOSTS`` sets the number of
hosts (default 2); ``TF_TPU_EMB_SOAK_PIPELINE=1`` trains both sides with
``pipeline_execution_with_tensor_core`` (a step's update waits for the next
lookup: a fault can find one kept on a host).  The trainer runs two steps a
``tf.function`` call: a host holds step n+1's batch while step n's update
runs (and puts its rows first), and with pipelining looks it up before step
n's gradients come, so a fault can find either under way.  Run the long form with
``TF_TPU_EMB_SOAK_SECONDS=900 .venv/bin/pytest tests/cluster/test_fault_soak.py -q -s``.
"""
import collections
import json
import os
import queue
import signal
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import harness
import soak_model as model
from cluster import LoopbackCluster

pytestmark = [pytest.mark.system, pytest.mark.slow]

# Hosts: TF_TPU_EMB_SOAK_HOSTS (default 2; the 3-host form of issue 31).
S = int(os.environ.get("TF_TPU_EMB_SOAK_HOSTS") or 2)
LEASE_S = 3.0
STEP_TIMEOUT_S = 5.0
KINDS = ("kill-host", "hang-host", "pause-host", "kill-trainer", "pause-trainer", "none")
POINTS = ("enqueue", "recv", "update")


class Trainer:
    """soak_trainer_script.py as a child process."""

    def __init__(self, cluster):
        spec = json.dumps(cluster.cluster_spec.as_dict())
        self.proc = harness.start_python(
            [harness.script(__file__, "soak_trainer_script.py"), spec, str(LEASE_S),
             str(STEP_TIMEOUT_S)], stdin=True)
        self.lines = queue.Queue()
        self.output = collections.deque(maxlen=60)
        threading.Thread(target=self._read, daemon=True).start()
        self.built_after_s = float(self.expect("BUILT", 240).split()[1])

    def _read(self):
        for line in self.proc.stdout:
            self.output.append(line)
            if line.startswith(("POINT", "OK", "ERROR", "BUILT")):
                self.lines.put(line.strip())
        self.lines.put(None)

    def next(self, timeout_s):
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError("no answer from the trainer within %s s:\n%s"
                                 % (timeout_s, "".join(self.output))) from None
        if line is None:
            raise AssertionError("the trainer exited with %s:\n%s"
                                 % (self.proc.wait(), "".join(self.output)))
        return line

    def expect(self, prefix, timeout_s=120):
        line = self.next(timeout_s)
        assert line.startswith(prefix), (line, "".join(self.output))
        return line

    def send(self, text):
        try:
            self.proc.stdin.write(text + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # it was killed

    def command(self, text, timeout_s=120):
        self.send(text)
        line = self.next(timeout_s)
        while line.startswith("POINT"):
            self.send("go")
            line = self.next(timeout_s)
        return line

    def signal(self, sig):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self):
        self.signal(signal.SIGKILL)
        self.proc.wait()


def _compare(got_file, want):
    got = dict(np.load(got_file))
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    return [name for name in want if not np.array_equal(got[name], want[name])]


def test_fault_soak(tmp_path):
    seconds = float(os.environ.get("TF_TPU_EMB_SOAK_SECONDS", "25"))
    seed = int(os.environ.get("TF_TPU_EMB_SOAK_SEED", "22"))
    print("fault soak: seed %d, %g s, %d hosts, lease %g s, step deadline %g s, pipelining %s"
          % (seed, seconds, S, LEASE_S, STEP_TIMEOUT_S,
             os.environ.get("TF_TPU_EMB_SOAK_PIPELINE") or "off"),
          flush=True)
    rng = np.random.default_rng(seed)
    # KIND@POINT,... (e.g. kill-trainer@recv): only these faults, to reproduce one
    only = [f.split("@") for f in os.environ.get("TF_TPU_EMB_SOAK_FAULTS", "").split(",") if f]
    faults = collections.Counter()
    mismatches, cycles, max_build_wait = [], 0, 0.0
    reference = model.make()
    reference.build(model.B)
    reference_checkpoint = tf.train.Checkpoint(embedding=reference)
    with LoopbackCluster(S, lifetime_s=max(1200, 3 * seconds)) as cluster:
        trainer = Trainer(cluster)
        try:
            n0 = 0
            checkpoint = str(tmp_path / "ckpt-0")
            assert trainer.command("save " + checkpoint) == "OK"
            start = time.monotonic()
            while cycles < 2 or time.monotonic() - start < seconds:
                k = int(rng.integers(2, 5))
                kind, point = KINDS[rng.integers(len(KINDS))], POINTS[rng.integers(len(POINTS))]
                if only:
                    kind, point = only[cycles % len(only)]
                at = n0 + int(rng.integers(k))
                host = int(rng.integers(S))
                pause_s = float(rng.uniform(0.05, 0.5))
                late_s = float(rng.uniform(0.0, 0.02))
                target = ("trainer" if kind.endswith("trainer") else
                          "host %d" % host if kind != "none" else "-")
                faults["%s at %s" % (kind, point) if kind != "none" else kind] += 1
                print("cycle %d: steps %d-%d, %s at %s of step %d on %s ..." % (
                    cycles, n0, n0 + k - 1, kind, point, at, target), flush=True)

                def deliver():
                    if kind == "kill-host":
                        cluster.procs[host].send_signal(signal.SIGKILL)
                    elif kind in ("hang-host", "pause-host"):
                        cluster.procs[host].send_signal(signal.SIGSTOP)
                        if kind == "pause-host":
                            time.sleep(pause_s)
                            cluster.procs[host].send_signal(signal.SIGCONT)
                    elif kind == "kill-trainer":
                        trainer.signal(signal.SIGKILL)
                    elif kind == "pause-trainer":
                        trainer.signal(signal.SIGSTOP)
                        time.sleep(pause_s)
                        trainer.signal(signal.SIGCONT)

                trainer.send("steps %d %d" % (n0, n0 + k))
                fired, answer = kind == "none", None
                while answer is None:
                    try:
                        line = trainer.next(4 * STEP_TIMEOUT_S + 180)
                    except AssertionError:
                        if kind == "kill-trainer" and fired:
                            answer = "KILLED"
                            break
                        raise
                    if not line.startswith("POINT"):
                        answer = line
                        break
                    _, name, n = line.split()
                    here = int(n) == at and name == ("recv" if point == "update" else point)
                    if fired or not here:
                        trainer.send("go")
                        continue
                    fired = True
                    if point == "update":
                        trainer.send("go")
                        time.sleep(late_s)
                        deliver()
                    else:
                        deliver()
                        trainer.send("go")
                recovered = False
                if kind == "kill-trainer":
                    trainer.kill()
                    trainer = Trainer(cluster)  # must build: the old lease ends
                    max_build_wait = max(max_build_wait, trainer.built_after_s)
                    assert trainer.command("restore " + checkpoint) == "OK"
                    recovered = True
                elif kind in ("kill-host", "hang-host") or answer != "OK":
                    if kind in ("kill-host", "hang-host"):
                        cluster.restart(host)  # SIGKILL first (a stopped host too)
                    assert trainer.command("recover " + checkpoint) == "OK"
                    recovered = True
                if kind == "hang-host" and fired:  # (OK: it came after the last step)
                    assert answer == "OK" or answer.startswith(
                        "ERROR DeadlineExceededError"), answer
                if recovered:  # the same steps again, from the checkpoint
                    assert trainer.command("steps %d %d" % (n0, n0 + k)) == "OK"
                else:
                    assert answer == "OK", (kind, point, target, answer)
                dump = str(tmp_path / ("state-%d.npz" % cycles))
                assert trainer.command("dump " + dump) == "OK"
                reference_checkpoint.restore(checkpoint)
                for n in range(n0, n0 + k):
                    model.step(reference, n)
                bad = _compare(dump, model.state(reference))
                if bad:
                    mismatches.append((cycles, kind, point, target, bad))
                print("cycle %d: %s%s" % (cycles, "recovered, " if recovered else "",
                                          "MISMATCH %s" % bad if bad else "equal"), flush=True)
                n0 += k
                cycles += 1
                checkpoint = str(tmp_path / ("ckpt-%d" % cycles))
                assert trainer.command("save " + checkpoint) == "OK"
            assert trainer.command("quit") == "OK"
            assert trainer.proc.wait(60) == 0
        finally:
            trainer.kill()
        alive = [proc.poll() is None for proc in cluster.procs]
        assert all(alive), alive
    reference.shutdown()
    summary = {"seed": seed, "seconds": seconds, "cycles": cycles, "steps": n0,
               "faults": dict(sorted(faults.items())), "mismatches": len(mismatches),
               "max_build_wait_after_trainer_kill_s": max_build_wait}
    print("fault soak summary:", json.dumps(summary), flush=True)
    if os.environ.get("TF_TPU_EMB_SOAK_REPORT"):
        with open(os.environ["TF_TPU_EMB_SOAK_REPORT"], "w") as f:
            json.dump(summary, f, indent=1)
    assert not mismatches, mismatches
