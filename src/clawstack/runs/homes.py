"""Task homes on disk: ``<pod>/.claw-homes/<installation>/<home>/``, one private directory per installation and
home id, which no caller ever names by path.

The supervisor creates a home when a run first needs it, owned by the uid its workers run as (65534 under a root
supervisor) and private to it (0700); the directories above it are the supervisor's own (0700). Two installations
that use one id get two homes. A home is reserved by the run that holds it (see
:meth:`clawstack.runs.ledger.Ledger.home_holder`); deleting one is refused while it is reserved, and is how a task
is reset: the next run for that id starts with an empty home and a new session. ``claw up`` and ``claw down``
leave homes in place.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Final

from clawstack.common.files import ensure_private_dir, fsync_dir
from clawstack.runs.backends.base import INSTALLATION

HOME_OWNER_UID: Final = 65534
"""Who owns a home under a root supervisor: the uid its workers run as."""
HOME_ID: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
"""1 to 128 of ``A-Z a-z 0-9 . _ -``, not starting with a dot."""


class Homes:
    """The homes under ``root`` (``<pod>/.claw-homes``); ``owner_uid`` owns each home when the supervisor is root."""

    def __init__(self, root: Path, *, owner_uid: int | None = None) -> None:
        self.root = root
        self._owner_uid = owner_uid

    def path(self, installation: str, home: str) -> Path:
        """Where the home lives (``ValueError`` for ids outside their patterns: no path is built from them)."""
        if INSTALLATION.fullmatch(installation) is None or HOME_ID.fullmatch(home) is None:
            raise ValueError("invalid installation or home id")
        return self.root / installation / home

    def exists(self, installation: str, home: str) -> bool:
        return os.path.isdir(self.path(installation, home)) and not os.path.islink(self.path(installation, home))

    def ensure(self, installation: str, home: str) -> Path:
        """The home, created empty (0700, owned by the workers' uid) if it does not exist yet."""
        path = self.path(installation, home)
        ensure_private_dir(self.root)
        ensure_private_dir(path.parent)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if os.path.islink(path) or not path.is_dir():
                raise ValueError("the home is not a directory") from None
            return path
        if self._owner_uid is not None:
            os.chown(path, self._owner_uid, self._owner_uid)
        fsync_dir(path.parent)
        return path

    def delete(self, installation: str, home: str) -> bool:
        """Remove the home and everything in it (links are removed, never followed); whether it existed."""
        path = self.path(installation, home)
        if os.path.islink(path):
            os.unlink(path)
        elif path.is_dir():
            shutil.rmtree(path)  # fd-based on Linux: a link inside is removed, not followed
        else:
            return False
        fsync_dir(path.parent)
        return True


__all__ = ["HOME_ID", "HOME_OWNER_UID", "Homes"]
