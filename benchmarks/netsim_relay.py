#!/usr/bin/env python3
"""A simulated network on loopback: a userspace TCP relay that adds a one-way
delay and a byte rate to every connection through it.

Why a relay: the issue asked for hosts in network namespaces joined by veth
pairs with ``tc netem``; this machine's kernel has no netem module
("Specified qdisc kind is unknown"), so the delay and the rate are made here,
in userspace, on 127.0.0.1 only.

    netsim_relay.py --ports 40001:2222,40002:2300 --delay-us 50 --rate-gbit 10

Each ``--ports LISTEN:TARGET`` pair listens on 127.0.0.1:LISTEN and forwards
every accepted connection to 127.0.0.1:TARGET; nothing else is ever reached.
(TensorFlow's gRPC tasks accept a cluster spec that names another port for
them than the one they bound, so a worker whose cluster spec names the relay
ports for every task, itself included, sends every connection, in both
directions, through the relay: ``benchmarks/bench_pinned.py`` does that.)

Each direction of a pair is one link of ``--rate-gbit``: bytes leave it in
order at that rate and arrive ``--delay-us`` later (the link model of
netem's ``delay`` + ``rate``).  The relay prints ``netsim_relay ready`` when
listening and then reads commands on stdin, one a line:

    set DELAY_US RATE_GBIT   change the link (0 rate: unlimited)
    stats                    print one JSON line: bytes per listening port
                             and direction, chunks, and how late chunks left (mean and max
                             microseconds past their due time: the relay's
                             own error, Python's sleep granularity)
    reset                    zero the counters

It exits when stdin closes (its parent went away) or on SIGTERM.
"""
import argparse
import collections
import json
import signal
import socket
import sys
import threading
import time

CHUNK = 256 * 1024


class Link:
    """One direction of a pair: a rate-limited, delayed FIFO link."""

    def __init__(self, net):
        self.net = net
        self.lock = threading.Lock()
        self.free_at = 0.0  # when the link has sent everything queued so far
        self.bytes = 0
        self.chunks = 0

    def due(self, n):
        """When `n` bytes handed to the link now arrive at the far end."""
        now = time.perf_counter()
        with self.lock:
            rate = self.net.rate_bytes_s
            start = max(now, self.free_at)
            self.free_at = start + (n / rate if rate > 0 else 0.0)
            self.bytes += n
            self.chunks += 1
            return self.free_at + self.net.delay_s


class Net:
    def __init__(self, delay_us, rate_gbit):
        self.set(delay_us, rate_gbit)
        self.late_sum = 0.0
        self.late_max = 0.0
        self.late_n = 0
        self.lock = threading.Lock()

    def set(self, delay_us, rate_gbit):
        self.delay_s = float(delay_us) * 1e-6
        self.rate_bytes_s = float(rate_gbit) * 1e9 / 8

    def late(self, seconds):
        with self.lock:
            self.late_sum += seconds
            self.late_n += 1
            self.late_max = max(self.late_max, seconds)


def pump(src, dst, link, net):
    """Reads src, delays each chunk on `link`, writes it to dst (two threads:
    the reader never waits on the delay, so chunks queue as on a wire)."""
    queue = collections.deque()
    ready = threading.Condition()
    closed = []

    def writer():
        try:
            while True:
                with ready:
                    while not queue and not closed:
                        ready.wait()
                    if not queue:
                        break
                    due, data = queue.popleft()
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                net.late(max(0.0, time.perf_counter() - due))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (dst, src):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    threading.Thread(target=writer, daemon=True).start()
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            due = link.due(len(data))
            with ready:
                queue.append((due, data))
                ready.notify()
    except OSError:
        pass
    with ready:
        closed.append(True)
        ready.notify()


def serve(listener, target, links, net):
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        try:
            upstream = socket.create_connection(target)
        except OSError:
            client.close()
            continue
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=pump, args=(client, upstream, links[0], net), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client, links[1], net), daemon=True).start()


HOST = "127.0.0.1"  # the only address the relay listens on or connects to


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ports", required=True,
                   help="comma list of LISTEN:TARGET port pairs on 127.0.0.1")
    p.add_argument("--delay-us", type=float, default=0.0)
    p.add_argument("--rate-gbit", type=float, default=0.0, help="0: unlimited")
    args = p.parse_args(argv)
    net = Net(args.delay_us, args.rate_gbit)
    maps = {}
    for pair in [p for p in args.ports.split(",") if p]:
        listen, target = (int(x) for x in pair.split(":"))
        target = (HOST, target)
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, listen))
        listener.listen(64)
        links = (Link(net), Link(net))
        maps[listen] = links
        threading.Thread(target=serve, args=(listener, target, links, net), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("netsim_relay ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "set":
            net.set(float(words[1]), float(words[2]))
            print("ok", flush=True)
        elif words[0] == "reset":
            for links in maps.values():
                for link in links:
                    link.bytes = link.chunks = 0
            with net.lock:
                net.late_sum = net.late_max = 0.0
                net.late_n = 0
            print("ok", flush=True)
        elif words[0] == "stats":
            print(json.dumps({
                "maps": {str(port): {"in": links[0].bytes, "out": links[1].bytes,
                                     "chunks": links[0].chunks + links[1].chunks}
                         for port, links in maps.items()},
                "late_mean_us": net.late_sum / max(1, net.late_n) * 1e6,
                "late_max_us": net.late_max * 1e6}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
