"""Unit conversions done once, at the edge. Inside the code everything is SI:
seconds, bytes, bytes/s, FLOP/s (STYLE.md rule 7)."""

import re

from .bounds import MESSAGE_BYTES
from .errors import InputError

GB = 1e9  # bytes; "GB/s" in files means gigaBYTES per second (CONTRACT.md)
GIB = 2**30  # bytes
TFLOPS = 1e12  # FLOP/s
US = 1e-6  # seconds

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?)[bB]?\s*$")
_SIZE_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text: str, key: str = "size") -> int:
    """Parse '1M', '256MB', '1G', '4096' into bytes, nccl-tests style (K/M/G are powers of 1024).

    >>> parse_size("1M"), parse_size("2k"), parse_size("512")
    (1048576, 2048, 512)
    """
    match = _SIZE_RE.match(str(text))
    if not match:
        raise InputError(key, f"cannot parse size {text!r} (examples: 4096, 64K, 1M, 1G)")
    number, prefix, _ = match.groups()
    value = float(number) * 1024 ** _SIZE_POWERS[prefix.lower()]
    if value <= 0:
        raise InputError(key, f"size {text!r} must be positive")
    return MESSAGE_BYTES.check(key, int(value))


def parse_sizes(text: str, key: str = "--sizes") -> list[int]:
    """Parse a comma list of sizes, or a 'lo:hi' range doubling from lo to hi (nccl-tests -b/-e/-f 2)."""
    if ":" in text:
        lo_text, hi_text = text.split(":", 1)
        lo, hi = parse_size(lo_text, key), parse_size(hi_text, key)
        if hi < lo:
            raise InputError(key, f"range {text!r} ends below its start")
        sizes = [lo]
        while sizes[-1] * 2 <= hi:
            sizes.append(sizes[-1] * 2)
        return sizes
    return [parse_size(part, key) for part in text.split(",") if part.strip()]


BYTE_UNITS = {"GB": GB, "GiB": GIB}  # display units of memory sizes


def format_duration(seconds: float) -> str:
    """A duration for people, in the unit that reads best: ms below 1 s, s below 2 min,
    else min.

    >>> format_duration(0.0123), format_duration(12.345), format_duration(1078.3422)
    ('12.3 ms', '12.35 s', '17.97 min')
    """
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    return f"{seconds / 60:.2f} min"


def format_bytes(nbytes: float, unit: str = "GB") -> str:
    """``nbytes`` in ``unit`` (a key of BYTE_UNITS), one decimal: ``format_bytes(2**30, "GiB") == '1.0 GiB'``."""
    return f"{nbytes / BYTE_UNITS[unit]:.1f} {unit}"
