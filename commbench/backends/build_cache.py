"""Where commbench's native builds live (the shm executor, the host build of the CUDA kernels) and
when a library found there may be loaded: $COMMBENCH_CACHE_DIR, else $XDG_CACHE_HOME/commbench, else
~/.cache/commbench, one folder per build key. A cached library is loaded into every rank, so one planted
by another user would run as this one: only a folder and a file of this user's that not everyone may
write are used (group-writable is left alone: a umask of 002 with a group of one's own is common)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    if os.environ.get("COMMBENCH_CACHE_DIR"):
        return Path(os.environ["COMMBENCH_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "commbench"


def owned(path: Path) -> bool:
    """Whether `path` belongs to this user and not everyone may write it."""
    info = path.stat()
    return info.st_uid == os.geteuid() and not info.st_mode & 0o002


def cached(target: Path) -> bool:
    """A library already built at `target` that may be loaded."""
    return target.is_file() and owned(target) and owned(target.parent)


def build_folder(target: Path) -> str | None:
    """Make `target`'s folder for a build; None when it may be built there, else why not (one line)."""
    missing = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    for made in missing:  # under a umask of 000 they would be anyone's to write: not for a library's folder
        try:
            made.chmod(made.stat().st_mode & 0o7777 & ~0o002)
        except OSError:
            pass  # another rank's, made at the same moment: owned() below judges it
    if not owned(target.parent):  # another user could swap the library it loads: build nothing there
        return (f"{target.parent} is not this user's, or anyone may write it: set $COMMBENCH_CACHE_DIR to a "
                f"folder of your own")
    return None
