"""What one socket read costs a subscriber process, whatever it carries: one 200-byte message
every `--period` seconds (each its own read) to a subscriber in a process of its own, its CPU
seconds from /proc over the messages it got. The kinds, alternated round by round:

- block:  a thread blocked in `socket.recv` (the least a Python process pays a wake-up);
- raw:    an asyncio Protocol that only counts (asyncio's callback, no client library);
- nats:   nats-py's subscription with a callback;
- direct: the bridge's `DirectClient` (reads served in the socket's callback);
- paced:  the same with `read_interval` (`read_pacing`: one read per tick, not per message).

    python bench/read_cost.py                  # 1,500 messages 4 ms apart, two rounds
    python bench/read_cost.py --kinds direct paced --rounds 4

read_pacing.py's figures are from it. Clock ticks are 10 ms: compare kinds in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nats

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_out import cpu_seconds

from nats_otel.devkit.processes import start_topology
from nats_otel.devkit.topology import single_server

SUBJECT = "read.cost"
KINDS = ("block", "raw", "nats", "direct", "paced")

# The subscriber: connects, says "ready", counts until a line on stdin, prints the count.
_SUBSCRIBER = r'''
import asyncio, socket, sys, threading
kind, url, subject, interval = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
got = [0]
def raw_handshake():
    userinfo, hostport = url.split("://", 1)[1].rsplit("@", 1)
    user, password = userinfo.split(":", 1)
    host, port = hostport.rsplit(":", 1)
    hello = (f'CONNECT {{"verbose":false,"user":"{user}","pass":"{password}"}}\r\n'
             f'SUB {subject} 1\r\nPING\r\n').encode()
    return host, int(port), hello
async def main():
    if kind == "block":
        host, port, hello = raw_handshake()
        sock = socket.create_connection((host, port))
        sock.sendall(hello)
        def read():
            while data := sock.recv(65536):
                got[0] += data.count(b"MSG ")
        threading.Thread(target=read, daemon=True).start()
    elif kind == "raw":
        host, port, hello = raw_handshake()
        class Counter(asyncio.Protocol):
            def connection_made(self, transport): transport.write(hello)
            def data_received(self, data): got[0] += data.count(b"MSG ")
        await asyncio.get_running_loop().create_connection(Counter, host, port)
    elif kind == "nats":
        import nats
        nc = await nats.connect(url)
        async def on_msg(msg): got[0] += 1
        await nc.subscribe(subject, cb=on_msg)
        await nc.flush()
    else:
        from nats_otel.bridge.sources.direct import DirectClient
        nc = DirectClient(interval if kind == "paced" else 0.0)
        await nc.connect(url)
        def on_frame(subject, reply, headers, payload): got[0] += 1
        await nc.subscribe_direct(subject, on_frame)
        await nc.flush()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    print(got[0], flush=True)
asyncio.run(main())
'''


async def one_kind(url: str, kind: str, messages: int, period: float, interval: float) -> tuple[int, float]:
    """(messages the subscriber got, its CPU seconds while they came)."""
    sub = subprocess.Popen([sys.executable, "-c", _SUBSCRIBER, kind, url, SUBJECT, str(interval)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert sub.stdout is not None and sub.stdin is not None
        if sub.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {kind} subscriber did not start")
        nc = await nats.connect(url)
        await asyncio.sleep(1.0)
        before = cpu_seconds(sub.pid)
        started = time.monotonic()
        for i in range(messages):
            await nc.publish(SUBJECT, b"x" * 200)
            await nc.flush()
            await asyncio.sleep(max(0.0, started + (i + 1) * period - time.monotonic()))
        await asyncio.sleep(0.5)
        spent = cpu_seconds(sub.pid) - before
        await nc.close()
        sub.stdin.write("\n")
        sub.stdin.flush()
        return int(sub.stdout.readline()), spent
    finally:
        sub.kill()
        sub.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1500)
    parser.add_argument("--period", type=float, default=0.004, help="seconds between messages")
    parser.add_argument("--interval", type=float, default=0.1, help="the paced kind's read_interval")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="read-cost-") as tmp, \
            start_topology(single_server(), Path(tmp) / "nats") as topo:
        url = topo.client_url("n1", "a")
        for round_no in range(1, args.rounds + 1):
            for kind in args.kinds:
                got, spent = asyncio.run(one_kind(url, kind, args.messages, args.period, args.interval))
                print(f"round {round_no} {kind:6s}: {got} of {args.messages} messages, {spent:.2f} CPU-s, "
                      f"{spent / max(got, 1) * 1e6:.0f} µs a message", flush=True)


if __name__ == "__main__":
    main()
