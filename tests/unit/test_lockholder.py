"""Which process holds an embedded store's lock, read from /proc/locks by device and inode."""

import fcntl
import os
import subprocess
import sys

import pytest

from hqueue.storage.lockholder import holder_listed, lock_pid

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="Linux lists locks in /proc/locks")


def listing(pid: int, major: int, minor: int, inode: int) -> str:
    """One line of /proc/locks as Linux writes it (device numbers in hex)."""
    return f"1: POSIX  ADVISORY  WRITE {pid} {major:02x}:{minor:02x}:{inode} 0 EOF"


@pytest.fixture
def lock_file(tmp_path):
    path = tmp_path / "LOCK"
    path.write_bytes(b"")
    return os.stat(path)


def test_a_lock_held_by_another_process_is_found(tmp_path):
    (tmp_path / "LOCK").write_bytes(b"")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,sys; f=open(sys.argv[1],'r+'); fcntl.lockf(f, fcntl.LOCK_EX); "
            "print('held', flush=True); sys.stdin.read()",
            str(tmp_path / "LOCK"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        assert lock_pid(str(tmp_path)) == holder.pid
    finally:
        holder.kill()
        holder.wait()
    assert lock_pid(str(tmp_path)) is None


def test_a_lock_on_another_file_system_with_the_same_inode_is_not_this_stores(lock_file):
    # Two tmpfs mounts (/tmp and /run, say) number their inodes alike: an unrelated lock
    # there must not keep clients from taking over a store whose holder is gone.
    major, minor = os.major(lock_file.st_dev), os.minor(lock_file.st_dev)
    stranger = listing(1, major + 1, minor, lock_file.st_ino)
    assert holder_listed(stranger, lock_file) is None
    holder = listing(4242, major, minor, lock_file.st_ino)
    assert holder_listed(f"{stranger}\n{holder}\n", lock_file) == 4242


def test_device_numbers_are_read_in_hex(lock_file):
    major, minor = os.major(lock_file.st_dev), os.minor(lock_file.st_dev)
    decimal = f"1: POSIX  ADVISORY  WRITE 4242 {major}:{minor + 10}:{lock_file.st_ino} 0 EOF"
    assert holder_listed(decimal, lock_file) is None  # (minor+10 in decimal is not minor in hex)
    assert holder_listed(listing(4242, major, minor, lock_file.st_ino), lock_file) == 4242


def test_a_lock_listed_on_the_file_systems_device_is_found_when_its_holder_has_the_file_open(tmp_path, lock_file):
    # btrfs lists a subvolume's files on the file system's device, not the one stat gives:
    # the holder is known by the file it has open.
    with open(tmp_path / "LOCK", "r+") as opened:
        fcntl.lockf(opened, fcntl.LOCK_EX)
        other_device = listing(os.getpid(), os.major(lock_file.st_dev) + 1, 0, lock_file.st_ino)
        assert holder_listed(other_device, lock_file) == os.getpid()
        assert holder_listed(listing(1, 0xFFF, 0, lock_file.st_ino + 1), lock_file) is None


def test_waiters_and_odd_lines_are_skipped(lock_file):
    major, minor = os.major(lock_file.st_dev), os.minor(lock_file.st_dev)
    device = f"{major:02x}:{minor:02x}:{lock_file.st_ino}"
    lines = [
        f"1: -> POSIX  ADVISORY  WRITE 77 {device} 0 EOF",
        "2: FLOCK  ADVISORY  WRITE",
        f"3: POSIX  ADVISORY  WRITE -1 {device} 0 EOF",
        f"4: POSIX  ADVISORY  WRITE 99 zz:yy:{lock_file.st_ino} 0 EOF",
    ]
    assert holder_listed("\n".join(lines), lock_file) is None
