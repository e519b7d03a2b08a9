"""The runtime's files on disk: private to the account that runs it, and never on a network file
system.

**Modes.** The SQLite database holds the console's sessions, every run's input and output and
the audit log; ``var/secret_key`` signs the session cookies. Another account on the machine that
can read either can take over the console, so they are created 0600, and ``var/`` (with the
database's directory, when the runtime makes it) 0700, whatever the process's umask:
directories are made with ``os.mkdir`` and then ``chmod`` (the umask masks ``mkdir``'s mode),
files with ``os.open(..., O_CREAT | O_EXCL, 0o600)`` and then ``fchmod``, before SQLite opens
them. SQLite creates a database's ``-wal``, ``-shm`` and ``-journal`` with the main file's
permission bits (and ``fchmod``s them to those bits past the umask), so a 0600 database gives
0600 companions. A file or directory that already exists is left as it is: changing the mode of
an operator's file behind their back is not ours to do; ``manage.py check`` warns about it
instead (``runtime.W001``, with the ``chmod`` that fixes it).

:func:`restrict_umask`, called first thing by ``manage.py`` and ``console/wsgi.py``, is the
second layer: everything else the processes create (collected static files, the demo's outside
world, logs, whatever an agent's tools write, files SQLite or a library make on their own) is
then private too. ``RUNTIME_UMASK`` (octal, e.g. ``027``) sets another umask for deployments
that share such files with a group; the files above stay 0600/0700 either way.

**Network file systems.** SQLite's locks are not reliable on NFS, SMB/CIFS and their kind, and
WAL's shared memory (``-shm``, mmap) only works between processes of one machine: two writers
could both think they hold the database and corrupt it. Opening a database there is refused
(design §12) with :class:`NetworkFilesystemError`, naming the path and the file system's type.
The type comes from ``/proc/self/mountinfo`` (the mount whose mount point is the longest prefix
of the database's real path, the last one mounted where several share it), or, where that file
cannot be read, from ``statfs(2)``'s ``f_type``. FUSE carries local file systems too
(fuse-overlayfs in rootless containers, ntfs-3g, ...), so a FUSE mount is refused only when
its subtype names a network one (``fuse.sshfs``, ``fuse.s3fs``, ``fuse.rclone``, ...:
``NETWORK_FUSE``); through ``statfs`` alone the subtype is unknown and FUSE is accepted. 9p is
accepted too (gVisor shows its local root file system as 9p). There is no switch to open a
database on a network file system anyway: use PostgreSQL (``DATABASE_URL``) to share one
database between machines.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import secrets
import stat
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

from runtime import conf

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
DEFAULT_UMASK = 0o077  # added to the process's umask by restrict_umask()

# -- modes -----------------------------------------------------------------------------------


def restrict_umask(environ: Mapping[str, str] = os.environ) -> int:
    """Make files this process creates from now on private: the umask gains ``077`` (a stricter
    one is kept), or becomes exactly ``RUNTIME_UMASK`` (octal) when that is set. Returns the
    umask now in effect. Call it before anything creates a file (settings make ``var/``)."""
    wanted = conf.value("RUNTIME_UMASK", environ)  # ConfigError (ImproperlyConfigured)
    if wanted is not None:
        os.umask(wanted)
        return int(wanted)
    old = os.umask(DEFAULT_UMASK)  # the only way to read the umask is to set it
    os.umask(old | DEFAULT_UMASK)
    return old | DEFAULT_UMASK


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a directory: each missing component is created 0700 whatever the umask; an
    existing directory keeps its mode (``manage.py check`` reports a loose one)."""
    path = Path(path)
    missing = []
    here = path
    while not here.exists():
        missing.append(here)
        if here.parent == here:
            break
        here = here.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, PRIVATE_DIR)
        except FileExistsError:
            continue  # made by another process meanwhile: its maker chose the mode
        os.chmod(directory, PRIVATE_DIR)  # the umask masked mkdir's mode
    return path


def open_private(path: str | os.PathLike[str], flags: int = os.O_RDWR) -> int:
    """Open ``path`` with ``flags``, creating it 0600 (whatever the umask) when it is missing; an
    existing file keeps its mode. Returns a descriptor (close-on-exec)."""
    while True:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
        except FileExistsError:
            pass
        else:
            try:
                os.fchmod(fd, PRIVATE_FILE)
            except BaseException:
                os.close(fd)
                raise
            return fd
        try:
            return os.open(path, flags | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # removed between the two opens: create it after all


def sync_directory(path: Path) -> None:
    """Sync ``path``'s directory, so a rename into it is on disk."""
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(temporary: Path, path: Path) -> None:
    """Make the written ``temporary`` the file ``path``, whole or not at all: synced, 0600,
    renamed over ``path``, the rename synced."""
    os.chmod(temporary, PRIVATE_FILE)
    fd = os.open(temporary, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    sync_directory(path)


def temporary_beside(path: Path) -> Path:
    """A name for the temporary file ``path`` is written as (hidden, this process's own)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_whole(path: str | os.PathLike[str], chunks: Iterable[bytes], *,
                temporary: Path | None = None) -> str:
    """Write ``chunks`` to ``path`` (0600) whole or not at all (a temporary file beside it,
    synced, renamed, the rename synced); the SHA-256 of what was written. A fixed
    ``temporary`` name lets the next writer replace what a killed one left."""
    path = Path(path)
    temporary = temporary or temporary_beside(path)
    digest = hashlib.sha256()
    fd = open_private(temporary, os.O_WRONLY | os.O_TRUNC)
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in chunks:
                digest.update(chunk)
                fh.write(chunk)
        publish(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return digest.hexdigest()


def private_file(path: str | os.PathLike[str]) -> bool:
    """Create ``path`` empty and 0600 (whatever the umask) unless it exists; True if it was
    created. An existing file is left alone, mode included."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, PRIVATE_FILE)
    finally:
        os.close(fd)
    return True


def secret_key_file(path: str | os.PathLike[str]) -> str:
    """The key kept in ``path``, made once (random, 0600, in a 0700 directory when the
    directory is new) by whichever process comes first; the others wait for it to be written."""
    path = Path(path)
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
    except FileExistsError:
        for _ in range(50):  # another process may be writing it right now
            key = path.read_text().strip()
            if key:
                return key
            time.sleep(0.01)
        raise RuntimeError(f"{path} is empty: delete it, or set DJANGO_SECRET_KEY") from None
    key = secrets.token_urlsafe(50)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), PRIVATE_FILE)
        fh.write(key + "\n")
        fh.flush()
        os.fsync(fh.fileno())  # a power cut must not leave an empty key file behind
    return key


def loose_mode(path: str | os.PathLike[str]) -> int | None:
    """``path``'s permission bits when its group or others have any access; None when it is
    private or does not exist."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None
    return mode if mode & 0o077 else None


def database_path(name: str | os.PathLike[str] | None) -> Path | None:
    """The file behind a SQLite ``NAME`` (a path or a ``file:`` URI); None for in-memory
    databases."""
    if isinstance(name, os.PathLike):
        return Path(name)
    if not name or name == ":memory:" or "mode=memory" in name:
        return None
    if name.startswith("file:"):
        path = unquote(urlsplit(name).path)
        return Path(path) if path and path != ":memory:" else None
    return Path(name)


def is_read_only_uri(name: str | os.PathLike[str]) -> bool:
    """A ``file:...?mode=ro`` name: SQLite must not have the file created for it."""
    if isinstance(name, os.PathLike) or not name.startswith("file:"):
        return False
    return parse_qs(urlsplit(name).query).get("mode") == ["ro"]


def sqlite_files(path: Path) -> list[Path]:
    """A database file and the files that go with it: SQLite's journals and shared memory, and
    the runtime backend's writer lock."""
    return [path] + [Path(f"{path}{suffix}") for suffix in ("-wal", "-shm", "-journal",
                                                            ".writer")]


# -- network file systems --------------------------------------------------------------------

MOUNTINFO = "/proc/self/mountinfo"

# Types as /proc/self/mountinfo names them.
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4",  # NFS
    "cifs", "smb3", "smbfs", "smb",  # SMB / CIFS
    "ncpfs", "ncp", "afs", "coda",
    # Not 9p: gVisor sandboxes (GKE Sandbox, Cloud Run's first generation) show their local
    # root file system as 9p. WSL2's Windows drives (/mnt/c) are 9p too: keep SQLite off them.
    "ceph", "glusterfs", "lustre", "beegfs", "gpfs", "orangefs",
})
# FUSE subtypes (``fuse.<subtype>``) that reach another machine.
NETWORK_FUSE = frozenset({
    "sshfs", "s3fs", "rclone", "gcsfuse", "goofys", "glusterfs", "ceph-fuse", "davfs",
    "curlftpfs", "blobfuse", "blobfuse2", "juicefs", "smbnetfs", "mountpoint-s3",
    "objectivefs", "seaweedfs", "lizardfs", "moosefs", "mfs",
})
# statfs(2) f_type magic numbers (linux/magic.h and the file systems' sources).
NETWORK_MAGIC = {
    0x6969: "nfs",
    0x517B: "smb",
    0xFE534D42: "smb2",
    0xFF534D42: "cifs",
    0x564C: "ncp",
    0x5346414F: "afs",
    0x6B414653: "afs",  # kAFS
    0x73757245: "coda",
    0x00C36400: "ceph",
    0x0BD00BD0: "lustre",
    0x19830326: "beegfs",
    0x47504653: "gpfs",
}
FUSE_MAGIC = 0x65735546  # any FUSE file system, local or not: accepted


class NetworkFilesystemError(ImproperlyConfigured):
    """The SQLite database is on a network file system, where SQLite is not safe."""


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    source: str


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a ``/proc/<pid>/mountinfo`` text, in its order (later mounts on the same
    point hide earlier ones). Lines it cannot read are skipped."""
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            dash = fields.index("-", 6)  # after the optional fields
            mounts.append(Mount(_unescape(fields[4]), _unescape(fields[dash + 1]),
                                _unescape(fields[dash + 2])))
        except (ValueError, IndexError):
            continue
    return mounts


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount ``path`` (absolute, symlinks resolved) is on: the longest mount point that is
    ``path`` or one of its parents, the last mounted where several share one."""
    found, found_len = None, -1
    for mount in mounts:
        point = mount.point.rstrip("/")
        if (path == point or path.startswith(point + "/")) and len(point) >= found_len:
            found, found_len = mount, len(point)
    return found


def is_network(fstype: str) -> bool:
    """Whether a mountinfo file system type is a network one (see the module's docstring)."""
    kind, _, subtype = fstype.partition(".")
    if kind in ("fuse", "fuseblk") and subtype:
        return subtype in NETWORK_FUSE
    return fstype in NETWORK_FILESYSTEMS


def statfs_type(path: str) -> int | None:
    """``statfs(2)``'s ``f_type`` for ``path`` (Linux), or None where it cannot be asked."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(512)  # struct statfs is 64 to 120 bytes
        if libc.statfs(os.fsencode(path), buf) != 0:
            return None
    except (OSError, AttributeError):
        return None
    # f_type is struct statfs's first member, a native word (__fsword_t); magics are 32-bit.
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def _existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def network_filesystem(path: str | os.PathLike[str], *, mountinfo: str | None = None,
                       statfs: Callable[[str], int | None] = statfs_type) -> Mount | None:
    """The network mount ``path`` would live on, or None when it is local or cannot be told.

    ``mountinfo`` is the file to read (``MOUNTINFO``, read at call time, by default);
    where it cannot be read, ``statfs`` (the ``f_type`` of the nearest existing directory)."""
    real = os.path.realpath(path)
    try:
        with open(mountinfo or MOUNTINFO) as fh:
            mounts = parse_mountinfo(fh.read())
    except OSError:
        mounts = []
    if mounts:
        mount = mount_of(real, mounts)
        return mount if mount is not None and is_network(mount.fstype) else None
    existing = str(_existing(Path(real)))
    magic = statfs(existing)
    if magic in NETWORK_MAGIC:
        return Mount(existing, NETWORK_MAGIC[magic], f"statfs f_type {magic:#x}")
    return None


def refuse_network_filesystem(path: str | os.PathLike[str], **kwargs) -> None:
    """Raise :class:`NetworkFilesystemError` when the SQLite database ``path`` is on a network
    file system (``kwargs`` go to :func:`network_filesystem`)."""
    mount = network_filesystem(path, **kwargs)
    if mount is None:
        return
    raise NetworkFilesystemError(
        f"refusing to open the SQLite database {path}: it is on a network file system "
        f"({mount.fstype}: {mount.source} on {mount.point}). SQLite's locks are not "
        "reliable there and WAL's shared memory works only within one machine, so two writers "
        "could corrupt the database. Put it on a local disk (ext4, xfs, ...), or use "
        "PostgreSQL (DATABASE_URL) to share one database between machines.")
