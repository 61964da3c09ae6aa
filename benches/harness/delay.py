"""A network's round trip between the servers and Redis, on one machine: a
TCP proxy that holds every chunk it reads for half the round trip before it
writes it on, in each direction (`ab.py --rtt`).

Loopback's round trip is a few microseconds, so a client whose writes wait
for the previous write's acknowledgement (Nagle's algorithm, without
`TCP_NODELAY`) loses nothing there. Through this proxy, the client's kernel
gets the acknowledgement of a call when the proxy's kernel sends it: with
the call's reply, a round trip later, unless its delayed-ACK timer fires
first, as with a Redis across a network. The proxy's own sockets have
`TCP_NODELAY` on, so it adds no Nagle of its own.

Two threads per direction per connection: one reads and stamps each chunk
with its time to leave, one sleeps until then and writes it, so chunks keep
their order and each is delayed by half the round trip, not more (plus the
sleep's slack, some 50 to 100 µs; `measured_rtt` says what a `PING` takes
through it)."""

import queue
import socket
import threading
import time


class DelayProxy:
    """Listens on a free port of 127.0.0.1 and forwards each connection to
    `upstream_port`, `rtt_ms` / 2 late each way."""

    def __init__(self, upstream_port, rtt_ms):
        self.upstream_port = upstream_port
        self.half = rtt_ms / 2000.0
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.sockets = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sockets += [client, upstream]
            self._pipe(client, upstream)
            self._pipe(upstream, client)

    def _pipe(self, src, dst):
        chunks = queue.SimpleQueue()

        def read():
            while True:
                try:
                    data = src.recv(65536)
                except OSError:
                    data = b""
                chunks.put((time.monotonic() + self.half, data))
                if not data:
                    return

        def write():
            while True:
                due, data = chunks.get()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    with_shutdown(dst)
                    return
                try:
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()

    def measured_rtt(self, pings=50):
        """The median time of a `PING` through the proxy, in ms."""
        took = []
        with socket.create_connection(("127.0.0.1", self.port)) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(pings):
                start = time.monotonic()
                s.sendall(b"PING\r\n")
                got = b""
                while not got.endswith(b"\r\n"):
                    chunk = s.recv(64)
                    if not chunk:
                        raise RuntimeError("the proxy closed the PING's connection")
                    got += chunk
                if got != b"+PONG\r\n":
                    raise RuntimeError(f"PING through the proxy answered {got!r}")
                took.append(time.monotonic() - start)
        took.sort()
        return took[len(took) // 2] * 1000

    def stop(self):
        self.closed = True
        self.listener.close()
        for s in self.sockets:
            with_shutdown(s)


def with_shutdown(s):
    """Shuts `s` down both ways; a socket already closed is left as it is."""
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
