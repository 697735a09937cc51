"""Where a command may write: every output path is checked before anything is simulated.

Rules (one helper for every command: ``run --trace/--timeline/--spans``, ``plot -o``,
``sweep --out``, ``study --out-dir``, the gallery, ``numerics --plot``):

- a file goes exactly where the user pointed; its folder must already exist (no parents
  are ever created);
- only a folder the user names as an output folder (``--out-dir``, the gallery's ``--out``,
  ``plot``'s default ``plots/``) is created, that one level alone;
- the suffix is the one the format needs; an existing directory, a missing folder or a
  place this process cannot write is refused at once, one line naming the flag;
- a file name made from a scenario's ``name`` is sanitized (:func:`safe_name`), so a
  hostile name cannot leave the output folder.
"""

import os
from pathlib import Path
import re

from ..errors import InputError

_UNSAFE = re.compile(r"(?:[^A-Za-z0-9._-]|\.{2,})+")  # also "..": no parent references, even harmless ones
MAX_NAME = 120  # characters of a file name made from a scenario name


def safe_name(name: str, default: str = "scenario") -> str:
    """A file name made of ``name``: letters, digits, ``._-`` only (every other run of
    characters, path separators and ``..`` included, becomes ``-``), no leading dot, at
    most MAX_NAME characters.

    >>> safe_name("../../etc/x"), safe_name("/abs/name"), safe_name("GPT 3 (175B)"), safe_name("..")
    ('etc-x', 'abs-name', 'GPT-3-175B', 'scenario')
    """
    text = re.sub("-{2,}", "-", _UNSAFE.sub("-", str(name))).strip(".-")[:MAX_NAME].rstrip(".-")
    return text or default


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def output_file(path, flag: str, suffixes: tuple[str, ...]) -> Path:
    """Check that ``path`` can be written as a file with one of ``suffixes`` (".png", ...)
    in a folder that exists; InputError naming ``flag`` otherwise."""
    p = Path(path)
    if p.suffix not in suffixes:
        raise InputError(flag, f"expected a {' or '.join(suffixes)} path, got {str(path)!r}")
    if p.is_dir():
        raise InputError(flag, f"{p} is a directory; give a file path")
    folder = p.parent
    if not folder.is_dir():
        raise InputError(flag, f"folder {folder} does not exist (clustersim creates no folders for a file)")
    if not _writable(folder) or (p.exists() and not os.access(p, os.W_OK)):
        raise InputError(flag, f"cannot write {p}: permission denied")
    return p


def output_dir(path, flag: str) -> Path:
    """Check that ``path`` is, or can be made as, a writable folder whose parent exists;
    InputError naming ``flag`` otherwise. Nothing is created: :func:`make_dir` does."""
    d = Path(path)
    if d.exists() and not d.is_dir():
        raise InputError(flag, f"{d} exists and is not a folder")
    if not d.exists():
        if not d.parent.is_dir():
            raise InputError(flag, f"folder {d.parent} does not exist (clustersim creates only {d.name}/ itself)")
        if not _writable(d.parent):
            raise InputError(flag, f"cannot create {d}: permission denied")
    elif not _writable(d):
        raise InputError(flag, f"cannot write in {d}: permission denied")
    return d


def make_dir(path, flag: str) -> Path:
    """Check ``path`` as :func:`output_dir` does, then create it (that one level) if missing."""
    d = output_dir(path, flag)
    d.mkdir(exist_ok=True)
    return d


def file_in(folder: Path, name: str, suffix: str) -> Path:
    """``folder / (safe_name(name) + suffix)``: always directly inside ``folder``."""
    return Path(folder) / f"{safe_name(name)}{suffix}"
