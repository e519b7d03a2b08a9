"""The runtime's files are private whatever the umask, loose modes are reported by `manage.py
check` (runtime.W001), and a SQLite database on a network file system is refused
(runtime.E001; the backend's refusal is in test_backend.py)."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from runtime import checks
from runtime.host import files

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# -- private files and directories -----------------------------------------------------------


@pytest.mark.parametrize("mask", [0o022, 0o000, 0o002])
def test_private_dir_makes_every_missing_directory_0700_whatever_the_umask(tmp_path, mask):
    with umask(mask):
        files.private_dir(tmp_path / "var" / "deep" / "er")
    for d in ("var", "var/deep", "var/deep/er"):
        assert mode(tmp_path / d) == 0o700, d


def test_private_dir_leaves_an_existing_directory_as_it_is(tmp_path):
    (tmp_path / "var").mkdir()
    os.chmod(tmp_path / "var", 0o755)
    files.private_dir(tmp_path / "var")
    assert mode(tmp_path / "var") == 0o755


@pytest.mark.parametrize("mask", [0o022, 0o000])
def test_private_file_is_0600_whatever_the_umask_and_an_existing_file_keeps_its_mode(
        tmp_path, mask):
    with umask(mask):
        assert files.private_file(tmp_path / "db") is True
        assert mode(tmp_path / "db") == 0o600
        (tmp_path / "old").write_text("x")
        os.chmod(tmp_path / "old", 0o644)
        assert files.private_file(tmp_path / "old") is False
    assert mode(tmp_path / "old") == 0o644 and (tmp_path / "old").read_text() == "x"


def test_open_private_creates_0600_even_under_a_umask_that_would_forbid_reopening(tmp_path):
    with umask(0o277):  # O_CREAT's mode alone would give 0400: read-only for the owner too
        fd = files.open_private(tmp_path / "runtime.sqlite3.writer")
        os.close(fd)
        assert mode(tmp_path / "runtime.sqlite3.writer") == 0o600
        os.close(files.open_private(tmp_path / "runtime.sqlite3.writer"))  # opens again


def test_the_secret_key_is_made_once_0600_in_a_0700_directory_whatever_the_umask(tmp_path):
    with umask(0o022):
        key = files.secret_key_file(tmp_path / "var" / "secret_key")
    assert len(key) > 50
    assert mode(tmp_path / "var") == 0o700
    assert mode(tmp_path / "var" / "secret_key") == 0o600
    assert files.secret_key_file(tmp_path / "var" / "secret_key") == key  # kept
    (tmp_path / "empty").touch()
    with pytest.raises(RuntimeError, match="is empty: delete it, or set DJANGO_SECRET_KEY"):
        files.secret_key_file(tmp_path / "empty")


@pytest.mark.parametrize(("main", "mask"), [(0o600, 0o022), (0o600, 0o000), (0o644, 0o077)])
def test_sqlite_gives_wal_and_shm_the_main_files_mode_whatever_the_umask(tmp_path, main, mask):
    """What the runtime relies on: SQLite makes -wal and -shm with the database's own mode, so
    a 0600 database keeps its companions private (and a 0644 one does not)."""
    db = tmp_path / "x.sqlite3"
    with umask(mask):
        files.private_file(db)
        os.chmod(db, main)
        conn = sqlite3.connect(db)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("CREATE TABLE t (x)")
            conn.commit()
            assert mode(Path(f"{db}-wal")) == main
            assert mode(Path(f"{db}-shm")) == main
        finally:
            conn.close()


def test_restrict_umask_adds_077_keeps_a_stricter_one_and_obeys_runtime_umask():
    with umask(0o022):
        assert files.restrict_umask({}) == 0o077
        assert os.umask(0o022) == 0o077
    with umask(0o027):
        assert files.restrict_umask({}) == 0o077
    with umask(0o277):
        assert files.restrict_umask({}) == 0o277  # never looser than the one it found
    with umask(0o022):
        assert files.restrict_umask({"RUNTIME_UMASK": "027"}) == 0o027
        assert os.umask(0o022) == 0o027
        from django.core.exceptions import ImproperlyConfigured

        for bad in ("rw", "999", "1000"):
            with pytest.raises(ImproperlyConfigured, match="RUNTIME_UMASK"):
                files.restrict_umask({"RUNTIME_UMASK": bad})


def _run_with_umask_022(code: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RUNTIME_VAR_DIR": str(tmp_path / "var"),
           "DJANGO_SETTINGS_MODULE": "console.settings"}
    env.pop("RUNTIME_UMASK", None)
    env.pop("DATABASE_URL", None)
    return subprocess.run([sys.executable, *(("-c", code) if code else ()), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: os.umask(0o022))


def test_manage_py_starts_with_umask_077_so_settings_make_var_0700(tmp_path):
    done = _run_with_umask_022("", tmp_path, "manage.py", "shell", "-v", "0", "-c",
                               "import os; print(oct(os.umask(0)))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "0o77"
    assert mode(tmp_path / "var") == 0o700
    assert mode(tmp_path / "var" / "secret_key") == 0o600


def test_the_wsgi_application_starts_with_umask_077(tmp_path):
    done = _run_with_umask_022("import os, console.wsgi; print(oct(os.umask(0)))", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0o77"
    assert mode(tmp_path / "var") == 0o700


# -- the check: loose modes ------------------------------------------------------------------


def _sqlite(path: Path) -> dict:
    return {"default": {"ENGINE": "runtime.storage.sqlite", "NAME": str(path)}}


def test_the_check_warns_on_a_0644_database_and_is_silent_on_0600(tmp_path):
    var = files.private_dir(tmp_path / "var")
    db = var / "runtime.sqlite3"
    files.private_file(db)
    files.private_file(var / "secret_key")
    paths = checks.private_paths(_sqlite(db), var)
    assert checks.loose_mode_warnings(paths) == []
    os.chmod(db, 0o644)
    [warning] = checks.loose_mode_warnings(paths)
    assert warning.id == "runtime.W001" and warning.obj == str(db)
    assert "mode 0644" in warning.msg and "every other account" in warning.msg
    assert f"chmod go-rwx {db}" in warning.hint
    os.chmod(db, 0o600)
    assert checks.loose_mode_warnings(paths) == []


def test_the_check_covers_wal_shm_lock_var_and_secret_key(tmp_path):
    var = tmp_path / "var"
    var.mkdir()
    os.chmod(var, 0o755)
    db = var / "runtime.sqlite3"
    loose = [db, Path(f"{db}-wal"), Path(f"{db}-shm"), Path(f"{db}.writer"),
             var / "secret_key"]
    for path in loose:
        path.touch()
        os.chmod(path, 0o640)
    warned = {w.obj: w for w in checks.loose_mode_warnings(checks.private_paths(_sqlite(db),
                                                                                 var))}
    assert set(warned) == {str(p) for p in [var, *loose]}
    assert "mode 0640: open to its group;" in warned[str(db)].msg
    assert "should be 0700" in warned[str(var)].msg
    assert "should be 0600" in warned[str(var / "secret_key")].msg


def test_the_check_ignores_other_engines_and_in_memory_databases(tmp_path):
    databases = {"pg": {"ENGINE": "django.db.backends.postgresql", "NAME": "x"},
                 "mem": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
                 "uri": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": "file:memorydb_default?mode=memory&cache=shared"}}
    assert checks.sqlite_databases(databases) == []
    assert checks.private_paths(databases, None) == []


def test_manage_py_check_shows_the_warning(tmp_path):
    var = files.private_dir(tmp_path / "var")
    db = var / "runtime.sqlite3"
    files.private_file(db)
    clean = _run_with_umask_022("", tmp_path, "manage.py", "check")
    assert clean.returncode == 0, clean.stderr
    assert "runtime.W001" not in clean.stdout + clean.stderr
    os.chmod(db, 0o644)
    loose = _run_with_umask_022("", tmp_path, "manage.py", "check")
    assert loose.returncode == 0, loose.stderr  # a warning: commands still run
    assert f"{db}: (runtime.W001) mode 0644" in loose.stderr
    assert f"chmod go-rwx {db}" in loose.stderr


# -- network file systems --------------------------------------------------------------------

MOUNTINFO = """\
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 27 0:27 / /tmp rw,relatime - tmpfs tmpfs rw
40 27 0:40 / /srv/nfs rw,relatime shared:5 master:2 - nfs4 files:/export rw,vers=4.2
41 40 254:1 / /srv/nfs/local rw,relatime - xfs /dev/vdb rw
42 27 0:42 / /srv/nfs3 rw - nfs files:/old rw
43 27 0:43 / /mnt/share rw - cifs //win/share rw
44 27 0:44 / /mnt/smb3 rw - smb3 //win/other rw
45 27 0:45 / /mnt/ssh rw,nosuid - fuse.sshfs me@host:/home/me rw
46 27 0:46 / /mnt/rootless rw - fuse.fuse-overlayfs fuse-overlayfs rw
47 27 0:47 / /var/lib/containers rw - overlay overlay rw
48 27 0:48 / /mnt/my\\040nfs rw - nfs files:/spaced rw
49 27 0:49 / /mnt/later rw - nfs files:/hidden rw
50 27 0:50 / /mnt/later rw - ext4 /dev/vdc rw
51 27 0:51 / /mnt/ntfs rw - fuseblk /dev/sdb1 rw
52 27 0:52 / /sandbox rw - 9p none rw,trans=fd
this line is not a mount
"""


@pytest.fixture
def mountinfo(tmp_path) -> str:
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    return str(path)


@pytest.mark.parametrize(("path", "fstype"), [
    ("/srv/nfs/runtime.sqlite3", "nfs4"),
    ("/srv/nfs/deep/er/runtime.sqlite3", "nfs4"),  # not there yet: its mount still counts
    ("/srv/nfs3/db", "nfs"),
    ("/mnt/share/db", "cifs"),
    ("/mnt/smb3/db", "smb3"),
    ("/mnt/ssh/db", "fuse.sshfs"),
    ("/mnt/my nfs/db", "nfs"),
])
def test_a_network_file_system_is_found_by_mountinfo(mountinfo, path, fstype):
    mount = files.network_filesystem(path, mountinfo=mountinfo)
    assert mount is not None and mount.fstype == fstype


@pytest.mark.parametrize("path", [
    "/work/runtime.sqlite3",  # ext4 at /
    "/tmp/db",  # tmpfs
    "/srv/nfs/local/db",  # xfs mounted inside the NFS mount: the longest prefix wins
    "/srv/nfsx/db",  # a name that merely starts like the NFS mount point
    "/mnt/rootless/db",  # FUSE, but fuse-overlayfs is local
    "/mnt/ntfs/db",  # fuseblk (ntfs-3g): local
    "/sandbox/db",  # 9p: how gVisor shows its local root
    "/var/lib/containers/db",  # overlay
    "/mnt/later/db",  # ext4 mounted over an NFS mount: the last mount hides the first
])
def test_a_local_file_system_is_accepted(mountinfo, path):
    assert files.network_filesystem(path, mountinfo=mountinfo) is None


def test_the_refusal_names_the_path_and_the_file_system(mountinfo):
    with pytest.raises(files.NetworkFilesystemError) as refused:
        files.refuse_network_filesystem("/srv/nfs/runtime.sqlite3", mountinfo=mountinfo)
    text = str(refused.value)
    assert text.startswith("refusing to open the SQLite database /srv/nfs/runtime.sqlite3: "
                           "it is on a network file system (nfs4: files:/export on /srv/nfs)")
    assert "PostgreSQL" in text
    files.refuse_network_filesystem("/srv/nfs/local/db", mountinfo=mountinfo)  # no error


def test_a_symlink_into_a_network_mount_is_followed(tmp_path):
    (tmp_path / "remote").mkdir()
    (tmp_path / "var").symlink_to(tmp_path / "remote")
    info = tmp_path / "mountinfo"
    info.write_text(f"27 1 254:0 / / rw - ext4 /dev/vda rw\n"
                    f"40 27 0:40 / {tmp_path}/remote rw - nfs files:/x rw\n")
    mount = files.network_filesystem(tmp_path / "var" / "db", mountinfo=str(info))
    assert mount is not None and mount.point == f"{tmp_path}/remote"


@pytest.mark.parametrize(("magic", "refused"), [
    (0x6969, "nfs"), (0x517B, "smb"), (0xFE534D42, "smb2"), (0xFF534D42, "cifs"),
    (0xEF53, None),  # ext4
    (0x58465342, None),  # xfs
    (0x01021994, None),  # tmpfs
    (0x794C7630, None),  # overlay
    (0x65735546, None),  # FUSE: its subtype is unknown here, so accepted
    (None, None),  # statfs could not be asked
])
def test_without_mountinfo_statfs_f_type_decides(tmp_path, magic, refused):
    asked = []

    def statfs(path: str) -> int | None:
        asked.append(path)
        return magic

    mount = files.network_filesystem(tmp_path / "new" / "db", mountinfo=str(tmp_path / "none"),
                                     statfs=statfs)
    assert asked == [str(tmp_path)]  # the nearest directory that exists
    assert (mount.fstype if mount else None) == refused


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="statfs(2) is Linux's")
def test_statfs_reads_the_real_f_type():
    assert files.statfs_type("/proc") == 0x9FA0  # PROC_SUPER_MAGIC


def test_the_check_reports_a_database_on_a_network_file_system(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(f"27 1 254:0 / / rw - ext4 /dev/vda rw\n"
                    f"40 27 0:40 / {tmp_path}/nfs rw - nfs4 files:/export rw\n")
    [error] = checks.network_filesystem_errors(_sqlite(tmp_path / "nfs" / "db.sqlite3"),
                                               mountinfo=str(info))
    assert error.id == "runtime.E001" and error.obj == str(tmp_path / "nfs" / "db.sqlite3")
    assert "network file system (nfs4" in error.msg
    assert checks.network_filesystem_errors(_sqlite(tmp_path / "db.sqlite3"),
                                            mountinfo=str(info)) == []


def test_database_path_reads_paths_and_file_uris(tmp_path):
    assert files.database_path(tmp_path / "a") == tmp_path / "a"
    assert files.database_path("/x/a.sqlite3") == Path("/x/a.sqlite3")
    assert files.database_path("file:/x/a%20b.sqlite3?mode=ro") == Path("/x/a b.sqlite3")
    assert files.is_read_only_uri("file:/x/a.sqlite3?mode=ro")
    assert not files.is_read_only_uri("/x/a.sqlite3")
    for memory in ("", ":memory:", "file:memorydb_default?mode=memory&cache=shared", None):
        assert files.database_path(memory) is None
