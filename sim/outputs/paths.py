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
  hostile name cannot leave the output folder;
- a path that exists must be a regular file (never a device such as /dev/full, a FIFO or a
  socket), and its folder must be on a writable, real filesystem (not /proc, /sys, devtmpfs
  or a read-only mount): checked with ``os.stat``/``os.statvfs`` and the mount table;
- every write goes through :func:`written`: a temporary file in the target folder, fsynced,
  then renamed over the target, so a failed write (ENOSPC, EACCES, EROFS, EISDIR...) leaves
  the old file intact and exits 2 naming the flag and the path, never a traceback.
"""

from contextlib import contextmanager
import os
from pathlib import Path
import re
import stat
import tempfile

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


# Kernel filesystems that hold no user files (proc(5), sysfs(5), the kernel's devtmpfs and
# cgroup documentation): a write there is a kernel interface call, not a file.
PSEUDO_FS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs",
                       "securityfs", "pstore", "bpf", "configfs", "fusectl", "mqueue", "hugetlbfs",
                       "efivarfs", "binfmt_misc", "autofs", "rpc_pipefs", "nsfs"})


def _mount_of(folder: Path) -> tuple[str, str]:
    """(mount point, filesystem type) of the mount holding ``folder``, from /proc/self/mounts
    (the longest mount point that contains it); ('', '') where the table cannot be read."""
    real = os.path.realpath(folder)
    best = ("", "")
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return best
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, parts[2])
    return best


def _check_filesystem(folder: Path, flag: str) -> None:
    """``folder`` is on a real, writable filesystem: not a pseudo filesystem (no blocks, or a
    kernel type in PSEUDO_FS, or the device folder /dev), not mounted read-only."""
    try:
        vfs = os.statvfs(folder)
    except OSError as e:
        raise InputError(flag, f"cannot use folder {folder}: {e.strerror}") from None
    point, fstype = _mount_of(folder)
    device_dir = fstype in ("tmpfs", "devtmpfs") and point == "/dev"
    if vfs.f_blocks == 0 or fstype in PSEUDO_FS or device_dir:
        raise InputError(flag, f"folder {folder} is on a kernel pseudo filesystem ({fstype or 'no blocks'}), "
                               "not a place for files")
    if vfs.f_flag & os.ST_RDONLY:
        raise InputError(flag, f"folder {folder} is on a read-only filesystem")


def _check_existing(p: Path, flag: str, what: str = "a file path") -> None:
    """A path that exists must be a regular file (following links): never a directory, a
    device (/dev/full, /dev/zero), a FIFO or a socket."""
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return
    except OSError as e:
        raise InputError(flag, f"cannot use {p}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(flag, f"{p} is a directory; give {what}")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(flag, f"{p} is not a regular file (a device, FIFO or socket); give {what}")


def regular_file(path, flag: str) -> Path:
    """``path`` exists and is a regular file, for reading back (a resume file, a journal):
    InputError naming ``flag`` for a device, FIFO, socket or directory, which could block or
    never end."""
    p = Path(path)
    _check_existing(p, flag, "a regular file")
    return p


def output_file(path, flag: str, suffixes: tuple[str, ...]) -> Path:
    """Check that ``path`` can be written as a file with one of ``suffixes`` (".png", ...)
    in a folder that exists; InputError naming ``flag`` otherwise."""
    p = Path(path)
    if p.suffix not in suffixes:
        raise InputError(flag, f"expected a {' or '.join(suffixes)} path, got {str(path)!r}")
    _check_existing(p, flag)
    folder = p.parent
    if not folder.is_dir():
        raise InputError(flag, f"folder {folder} does not exist (clustersim creates no folders for a file)")
    _check_filesystem(folder, flag)
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
        _check_filesystem(d.parent, flag)
        if not _writable(d.parent):
            raise InputError(flag, f"cannot create {d}: permission denied")
    else:
        _check_filesystem(d, flag)
        if not _writable(d):
            raise InputError(flag, f"cannot write in {d}: permission denied")
    return d


def make_dir(path, flag: str) -> Path:
    """Check ``path`` as :func:`output_dir` does, then create it (that one level) if missing."""
    d = output_dir(path, flag)
    try:
        d.mkdir(exist_ok=True)
    except OSError as e:
        raise InputError(flag, f"cannot create {d}: {e.strerror}") from None
    return d


def file_in(folder: Path, name: str, suffix: str) -> Path:
    """``folder / (safe_name(name) + suffix)``: always directly inside ``folder``."""
    return Path(folder) / f"{safe_name(name)}{suffix}"


def _mode_for(p: Path) -> int:
    """The permission bits a plain ``open(p, "w")`` would give: the old file's, else 0o666 less the umask."""
    try:
        return stat.S_IMODE(os.stat(p).st_mode)
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


@contextmanager
def written(path, flag: str):
    """Write ``path`` atomically: yields a temporary path in the same folder, with the same
    suffix (so writers that read the format off the suffix, such as ``savefig``, still can);
    when the block ends it is fsynced and renamed over ``path``. Any OSError (ENOSPC, EACCES,
    EROFS, EISDIR, EIO...) removes the temporary file, leaves ``path`` as it was, and becomes
    InputError naming ``flag`` and the path (exit 2).

    The one door every user-visible output goes through (traces, timelines and plots, spans,
    sweep and plan tables, study outputs)."""
    p = Path(path)
    _check_existing(p, flag)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=f".tmp{p.suffix}")
        os.close(fd)
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(p))
        os.replace(tmp, p)
        tmp = None
    except OSError as e:
        raise InputError(flag, f"cannot write {p}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def write_bytes(path, data: bytes, flag: str) -> None:
    """``data`` to ``path`` through :func:`written`."""
    with written(path, flag) as tmp, open(tmp, "wb") as f:
        f.write(data)
