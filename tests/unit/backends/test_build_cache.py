"""The native build cache (commbench/backends/build_cache.py) loads a library only from a folder that no
other user can change, nor swap through any folder above it (issue 32): a cache root that another user owns,
or may write without the sticky bit, is refused with one line; a sticky folder such as /tmp above it is not.
The tests run as root, so os.chown gives a folder to another uid."""
import os

import pytest

from commbench.backends import build_cache as B

STRANGER = 54321  # a uid that is neither root nor this process's
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another uid needs root")


def _target(root):
    return root / "shm_native" / "0123456789abcdef" / "libcb_shm.so"


def _planted(root):
    """A library of this user's in a folder of this user's, below `root`: what a cache hit looks like."""
    target = _target(root)
    target.parent.mkdir(parents=True)
    target.write_bytes(b"\x7fELF")
    return target


@needs_root
@pytest.mark.parametrize("mode", [0o777, 0o755])
def test_a_cache_root_of_another_user_is_refused(tmp_path, mode):
    """COMMBENCH_CACHE_DIR at another user's folder (mode 0777) was accepted: only the library and its own
    folder were checked, so that user could swap the folder between the check and the load."""
    root = tmp_path / "theirs"
    root.mkdir()
    target = _planted(root)
    os.chown(root, STRANGER, STRANGER)
    root.chmod(mode)
    refused = B.build_folder(target)
    assert refused == (f"{root} belongs to another user (uid {STRANGER}), so the build cache {target.parent} below "
                       f"it could be swapped by another user: set $COMMBENCH_CACHE_DIR to a folder of your own")
    assert not B.cached(target)


@needs_root
def test_a_folder_anyone_may_write_above_the_cache_is_refused_unless_sticky(tmp_path):
    """/tmp's case: others may add entries to a folder with the sticky bit, but not rename or remove this
    user's, so a cache below it stays this user's; without the sticky bit they could swap it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    target = _planted(shared / "me")
    shared.chmod(0o1777)
    assert B.build_folder(target) is None and B.cached(target)
    shared.chmod(0o777)
    assert B.build_folder(target).startswith(f"another user may write {shared} (mode drwxrwxrwx, no sticky bit)")
    assert not B.cached(target)
    shared.chmod(0o1777)
    os.chown(shared, STRANGER, 0)  # sticky, but its owner may remove anything in it
    assert B.build_folder(target).startswith(f"{shared} belongs to another user")


@needs_root
def test_a_link_to_another_users_folder_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    (theirs / "cache").mkdir(parents=True)
    os.chown(theirs, STRANGER, STRANGER)
    (tmp_path / "link").symlink_to(theirs / "cache")
    target = _target(tmp_path / "link")
    assert B.build_folder(target).startswith(f"{theirs} belongs to another user")


@needs_root
def test_a_folder_its_group_may_write_is_this_users_only_when_the_group_is(tmp_path):
    """A umask of 002 with a group of one's own stays usable; a group other users share is refused."""
    mine = tmp_path / "mine"
    target = _planted(mine / "cache")
    mine.chmod(0o775)
    assert B.build_folder(target) is None and B.cached(target)
    os.chown(mine, os.geteuid(), STRANGER)
    assert B.build_folder(target).startswith(f"another user may write {mine} (mode drwxrwxr-x")
    assert not B.cached(target)


def test_this_users_own_cache_is_used(tmp_path):
    target = _planted(tmp_path / "cache")
    assert B.build_folder(target) is None and B.cached(target)
    target.parent.chmod(0o777)
    assert B.build_folder(target).endswith("is not this user's, or anyone may write it: set $COMMBENCH_CACHE_DIR "
                                          "to a folder of your own")
    assert not B.cached(target)


@needs_root
def test_nothing_is_made_inside_another_users_folder(tmp_path):
    root = tmp_path / "theirs"
    root.mkdir(mode=0o777)
    os.chown(root, STRANGER, STRANGER)
    target = _target(root / "cache")
    assert B.build_folder(target).startswith(f"{root} belongs to another user")
    assert os.listdir(root) == []
