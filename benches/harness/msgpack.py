"""MessagePack decoding, for the packed replies of the Lua designs (what
cmsgpack.pack writes for a flat array of numbers)."""

import struct


def unpack(data):
    """A MessagePack value, whole."""
    value, pos = _unpack(data, 0)
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} bytes after the MessagePack value")
    return value


def _unpack(b, pos):
    t = b[pos]
    pos += 1
    if t <= 0x7F:
        return t, pos
    if t >= 0xE0:
        return t - 0x100, pos
    if 0x90 <= t <= 0x9F:
        return _array(b, pos, t & 0x0F)
    if t == 0xDC:
        return _array(b, pos + 2, int.from_bytes(b[pos:pos + 2], "big"))
    if t == 0xDD:
        return _array(b, pos + 4, int.from_bytes(b[pos:pos + 4], "big"))
    if 0xCC <= t <= 0xCF:
        size = 1 << (t - 0xCC)
        return int.from_bytes(b[pos:pos + size], "big"), pos + size
    if 0xD0 <= t <= 0xD3:
        size = 1 << (t - 0xD0)
        return int.from_bytes(b[pos:pos + size], "big", signed=True), pos + size
    if t == 0xCB:
        return struct.unpack(">d", b[pos:pos + 8])[0], pos + 8
    if t == 0xCA:
        return struct.unpack(">f", b[pos:pos + 4])[0], pos + 4
    if t in (0xC0, 0xC2, 0xC3):
        return {0xC0: None, 0xC2: False, 0xC3: True}[t], pos
    raise ValueError(f"MessagePack type {t:#x} not expected in a decision's reply")


def _array(b, pos, n):
    items = []
    for _ in range(n):
        v, pos = _unpack(b, pos)
        items.append(v)
    return items, pos
