"""Building the C++/CUDA extensions: one builder at a time, always with the same ninja.

torch's JIT builder runs whichever `ninja` comes first on PATH. Two versions (the system's and
the one this project installs) write incompatible build logs, so a process that finds the
other version's log rebuilds the extension from scratch (a minute of compiling per switch on
a small machine). The build therefore puts the installed `ninja` package's first on PATH.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path


def extension_name(base: str) -> str:
    """`base` with a tag of this checkout's path: torch caches an extension's build by name,
    and two checkouts (a development tree and a run's, or a clean clone beside them) sharing
    one name would each rebuild it from scratch whenever the other had built it last."""
    where = str(Path(__file__).resolve().parents[2])
    return f"{base}_{hashlib.sha256(where.encode()).hexdigest()[:8]}"


def _ninja_bin_dir() -> str | None:
    try:
        import ninja
    except ImportError:  # the system's ninja, if any, builds
        return None
    return getattr(ninja, "BIN_DIR", None)


@contextlib.contextmanager
def build_environment(build_dir: str) -> Iterator[None]:
    """Hold an OS file lock on `build_dir` while torch builds/loads an extension there, with
    the installed ninja first on PATH.

    torch's own lock is a file that exists while a build runs; a process killed mid-build
    leaves it behind and every later build waits for it forever. The OS releases our `flock`
    when its holder dies, and every builder takes it first, so a torch lock file found while
    holding it is a dead build's leftover and is removed.
    """
    os.makedirs(build_dir, exist_ok=True)
    path = os.environ.get("PATH", "")
    ninja_dir = _ninja_bin_dir()
    with open(os.path.join(build_dir, "credit-build.flock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(build_dir, "lock"))
        if ninja_dir:
            os.environ["PATH"] = ninja_dir + os.pathsep + path
        try:
            yield
        finally:
            os.environ["PATH"] = path
