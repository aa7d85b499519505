"""Where commbench's native builds live (the shm executor, the host build of the CUDA kernels) and
when a library found there may be loaded: $COMMBENCH_CACHE_DIR, else $XDG_CACHE_HOME/commbench, else
~/.cache/commbench, one folder per build key. A cached library is loaded into every rank, so one planted
by another user would run as this one. So the library, its folder and every folder above it up to /
must be safe from other users (trusted_path):

- the library and its build folder are this user's, and no other user may write them;
- every folder above is this user's or root's, and no other user may write it unless its sticky bit is
  set (/tmp, mode 1777): there others may add entries but not rename or remove one that is not theirs,
  so this user's folder below it cannot be swapped. A folder that another user owns, or may write
  without the sticky bit, lets that user rename this user's folder away and put their own in its place,
  between the check and the load; it is refused however safe the folders below it look.

"Another user may write" is write permission for others, or for a group that is not this process's
own: a group-writable folder of one's own group (a umask of 002 with a group of one's own, which is
common) is left alone, one of a shared group is not. The path is followed as written and as resolved
(symlinks), so a link to another user's folder is refused too."""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path


def cache_root() -> Path:
    if os.environ.get("COMMBENCH_CACHE_DIR"):
        return Path(os.environ["COMMBENCH_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "commbench"


def _others_may_write(info: os.stat_result) -> bool:
    """Write permission for everyone, or for a group other than this process's own."""
    return bool(info.st_mode & 0o002 or info.st_mode & 0o020 and info.st_gid != os.getegid())


def owned(path: Path) -> bool:
    """Whether `path` belongs to this user and no other user may write it."""
    info = path.stat()
    return info.st_uid == os.geteuid() and not _others_may_write(info)


def untrusted_above(folder: Path, including: bool = False) -> str | None:
    """The first folder above `folder` (and `folder` itself, `including`), up to /, through which another user
    could swap `folder` (one line naming it and why), or None: each must be this user's or root's, and not
    writable by another user unless its sticky bit is set. The path as written and resolved are checked."""
    me = os.geteuid()
    absolute = Path(os.path.abspath(folder))
    for start in dict.fromkeys((absolute, Path(os.path.realpath(absolute)))):
        for path in (*([start] if including else []), *start.parents):
            try:
                info = path.stat()
            except OSError as exc:
                return f"{path} cannot be read ({exc.strerror or exc})"
            if info.st_uid not in (me, 0):
                return f"{path} belongs to another user (uid {info.st_uid})"
            if _others_may_write(info) and not info.st_mode & stat.S_ISVTX:
                return f"another user may write {path} (mode {stat.filemode(info.st_mode)}, no sticky bit)"
    return None


def trusted_path(folder: Path) -> str | None:
    """Why a library in `folder` may not be loaded (one line), or None: `folder` is this user's and no
    other user may write it, nor swap it through a folder above (untrusted_above)."""
    if not owned(folder):  # another user could swap the library it loads: build nothing there
        return f"{folder} is not this user's, or anyone may write it: set $COMMBENCH_CACHE_DIR to a folder of your own"
    return _swappable(folder, untrusted_above(folder))


def _swappable(folder: Path, above: str | None) -> str | None:
    return above and (f"{above}, so the build cache {folder} below it could be swapped by another user: set "
                      f"$COMMBENCH_CACHE_DIR to a folder of your own")


def cached(target: Path) -> bool:
    """A library already built at `target` that may be loaded."""
    return target.is_file() and owned(target) and trusted_path(target.parent) is None


def build_folder(target: Path) -> str | None:
    """Make `target`'s folder for a build; None when it may be built there, else why not (one line)."""
    missing = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
    if missing:  # nothing is made inside another user's folder (a link there could lead anywhere)
        refused = _swappable(target.parent, untrusted_above(missing[-1].parent, including=True))
        if refused:
            return refused
    target.parent.mkdir(parents=True, exist_ok=True)
    for made in missing:  # under a umask of 000 they would be anyone's to write: not for a library's folder
        try:
            made.chmod(made.stat().st_mode & 0o7777 & ~0o022)
        except OSError:
            pass  # another rank's, made at the same moment: trusted_path() below judges it
    return trusted_path(target.parent)


def find_compiler(variable: str, candidates: tuple[str, ...]) -> tuple[str | None, str]:
    """The compiler `$variable` names, else the first of `candidates` on PATH: (its path or None, what was looked
    for, to say in the error)."""
    wanted = os.environ.get(variable)
    for candidate in ([wanted] if wanted else candidates):
        path = shutil.which(candidate)
        if path:
            return path, ""
    return None, f"${variable}={wanted}" if wanted else ", ".join(candidates)
