"""GPT-2's byte <-> unicode map (chapter 2).

Byte-level BPE works on bytes, but its vocabulary and merges are stored as
text. GPT-2 maps each of the 256 byte values to a printable character:
printable Latin-1 bytes map to themselves, the other 68 (control bytes,
space, 0x7F-0xA0, 0xAD) to the characters from U+0100 up, in byte order.
So a space is ``Ġ`` (U+0120) and a newline ``Ċ`` (U+010A); ``"Ġthe"`` is the
token for `` the``.
"""

from __future__ import annotations

from functools import cache


@cache
def bytes_to_unicode() -> dict[int, str]:
    """The 256-entry map from byte value to its printable stand-in character."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shift)
            shift += 1
    return mapping


@cache
def unicode_to_bytes() -> dict[str, int]:
    """The inverse of :func:`bytes_to_unicode`."""
    return {c: b for b, c in bytes_to_unicode().items()}


@cache
def _translation() -> dict[int, str]:
    return dict(bytes_to_unicode())


def encode_bytes(data: bytes) -> str:
    """Bytes -> their stand-in string (``b" hi"`` -> ``"Ġhi"``).

    Same as ``"".join(bytes_to_unicode()[b] for b in data)``, three times as
    fast: Latin-1 turns each byte into the character with that code, and
    ``str.translate`` maps the characters in C.
    """
    return data.decode("latin-1").translate(_translation())


def decode_chars(text: str) -> bytes:
    """Stand-in string -> bytes; ``ValueError`` on a character outside the map."""
    table = unicode_to_bytes()
    try:
        return bytes(table[c] for c in text)
    except KeyError as e:
        raise ValueError(f"{e.args[0]!r} is not a byte-level BPE character") from None
