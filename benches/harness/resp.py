"""RESP2: encoding commands, parsing replies, and the benchmark's own
blocking connection (with `INFO cpu` and `INFO commandstats`)."""

import re
import socket


def command(*args):
    """One command, RESP-encoded."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Incomplete(Exception):
    """The buffer ends inside a reply."""


class RespError:
    """An error reply (`-ERR ...`)."""

    def __init__(self, message):
        self.message = message

    def __repr__(self):
        return f"RespError({self.message!r})"


def parse(buf, pos=0):
    """One RESP2 reply at buf[pos:]: (value, next pos). Simple strings become
    str, errors RespError, integers int, bulk strings bytes, nil None, arrays
    lists. Raises Incomplete when the reply is not all there."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete
    kind = buf[pos]
    if kind == 58:  # ':'
        return int(buf[pos + 1:end]), end + 2
    if kind == 43:  # '+'
        return buf[pos + 1:end].decode(), end + 2
    if kind == 36:  # '$'
        n = int(buf[pos + 1:end])
        if n < 0:
            return None, end + 2
        start = end + 2
        if len(buf) < start + n + 2:
            raise Incomplete
        return bytes(buf[start:start + n]), start + n + 2
    if kind == 42:  # '*'
        n = int(buf[pos + 1:end])
        if n < 0:
            return None, end + 2
        return parse_many(buf, end + 2, n)
    if kind == 45:  # '-'
        return RespError(buf[pos + 1:end].decode(errors="replace")), end + 2
    raise ValueError(f"not a RESP reply at byte {pos}: {bytes(buf[pos:pos + 40])!r}")


def parse_many(buf, pos, n):
    """n replies in a row at buf[pos:]: (list of values, next pos). Raises
    Incomplete when they are not all there."""
    items = []
    for _ in range(n):
        v, pos = parse(buf, pos)
        items.append(v)
    return items, pos


def connect(port):
    """A TCP connection to the local redis-server, with TCP_NODELAY."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Conn:
    """A blocking connection for the benchmark's own commands."""

    def __init__(self, port):
        self.sock = connect(port)
        self.buf = b""

    def call(self, *args):
        self.sock.sendall(command(*args))
        while True:
            try:
                value, pos = parse(self.buf)
                break
            except Incomplete:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    raise ConnectionError("redis-server closed the connection")
                self.buf += chunk
        self.buf = self.buf[pos:]
        if isinstance(value, RespError):
            raise RuntimeError(f"{args[0]}: {value.message}")
        return value

    def close(self):
        self.sock.close()


def info(conn, section):
    text = conn.call("INFO", section).decode()
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def redis_cpu(conn):
    """used_cpu_user + used_cpu_sys: the whole Redis process, in seconds."""
    f = info(conn, "cpu")
    return float(f["used_cpu_user"]) + float(f["used_cpu_sys"])


def commandstats(conn):
    """{command: calls} since the last CONFIG RESETSTAT."""
    out = {}
    for name, fields in info(conn, "commandstats").items():
        if name.startswith("cmdstat_"):
            calls = re.search(r"calls=(\d+)", fields)
            out[name[len("cmdstat_"):]] = int(calls.group(1))
    return out
