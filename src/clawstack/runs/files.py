"""A run's private files beside the ledger, in ``<pod>/.claw-runs/`` (every file 0600 in a 0700 directory):

- ``admitted/<template-id>.json``: the template a run was admitted with, kept by its id whatever is compiled since;
- ``results/<installation>/<run_id>.txt``: the bounded answer;
- ``secrets/<installation>/<run_id>.credential``: the orchestrator's callback credential;
- ``secrets/<installation>/<run_id>.identity``: the secret of the run's proxy identity, for restart recovery.

Every write is on disk before it returns (:func:`~clawstack.common.files.write_private`).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Final

from clawstack.common.errors import ClawError
from clawstack.common.files import ensure_private_dir, fsync_dir, read_private, write_private
from clawstack.common.ids import new_secret
from clawstack.pod.artifacts import PodPaths
from clawstack.runs.ledger import RunRecord

MAX_TEMPLATE_BYTES: Final = 4 * 1024 * 1024
MAX_RESULT_BYTES: Final = 64 * 1024 * 1024
MAX_CREDENTIAL_BYTES: Final = 8192


class RunFiles:
    """The files of every run of one pod; see the module docstring."""

    def __init__(self, paths: PodPaths) -> None:
        self.root = paths.runs
        self._admitted: dict[str, dict[str, Any]] = {}

    def _private_parent(self, path: Path) -> None:
        """Make every directory from the root down to ``path``'s parent 0700 as it is created: a missing level made
        by ``mkdir -p`` would get the umask's mode (``secrets/``, ``results/``)."""
        directory = ensure_private_dir(self.root)
        for part in path.parent.relative_to(self.root).parts:
            directory = ensure_private_dir(directory / part)

    # -- admitted templates --------------------------------------------------------------------------------------

    def _admitted_path(self, template_id: str) -> Path:
        return self.root / "admitted" / f"{template_id.removeprefix('sha256:')}.json"

    def keep_template(self, template: dict[str, Any]) -> None:
        """Keep ``template`` by its id (once), so that every run admitted with it finds it again."""
        if template["id"] in self._admitted:
            return
        path = self._admitted_path(template["id"])
        self._private_parent(path)
        if not path.exists():
            write_private(path, json.dumps(template).encode())
        self._admitted[template["id"]] = template

    def template(self, template_id: str) -> dict[str, Any]:
        """The template a run was admitted with."""
        cached = self._admitted.get(template_id)
        if cached is None:
            cached = json.loads(read_private(self._admitted_path(template_id), max_bytes=MAX_TEMPLATE_BYTES))
            self._admitted[template_id] = cached
        return cached

    # -- results -------------------------------------------------------------------------------------------------

    def result_path(self, record: RunRecord) -> Path:
        return self.root / "results" / record.installation / f"{record.run_id}.txt"

    def store_result(self, record: RunRecord, text: bytes) -> None:
        path = self.result_path(record)
        self._private_parent(path)
        write_private(path, text)

    def read_result(self, record: RunRecord) -> bytes:
        return read_private(self.result_path(record), max_bytes=MAX_RESULT_BYTES)

    # -- secrets -------------------------------------------------------------------------------------------------

    def _secret(self, record: RunRecord, kind: str) -> Path:
        return self.root / "secrets" / record.installation / f"{record.run_id}.{kind}"

    def store_credential(self, record: RunRecord, credential: str) -> None:
        path = self._secret(record, "credential")
        self._private_parent(path)
        write_private(path, credential.encode())

    def read_credential(self, record: RunRecord) -> str | None:
        """The held credential, or ``None`` when it cannot be read (the run's credential is then ``missing``)."""
        try:
            return read_private(self._secret(record, "credential"), max_bytes=MAX_CREDENTIAL_BYTES).decode()
        except (OSError, ClawError, UnicodeDecodeError):
            return None

    def identity_secret(self, record: RunRecord) -> str:
        """The run's identity secret: the stored one, or a new one stored first (so a retry reuses it)."""
        path = self._secret(record, "identity")
        try:
            return str(json.loads(read_private(path, max_bytes=4096))["secret"])
        except (OSError, ClawError, ValueError, KeyError):
            pass
        self._private_parent(path)
        secret = new_secret(32)
        write_private(path, json.dumps({"secret": secret}).encode())
        return secret

    def forget_identity_secret(self, record: RunRecord) -> None:
        """Delete the identity secret once the identity is revoked: nothing can use it any more."""
        self._remove(self._secret(record, "identity"))

    def remove_secrets(self, record: RunRecord) -> None:
        """Delete both of the run's secret files (full-pod teardown: no callback follows)."""
        self._remove(self._secret(record, "identity"))
        self._remove(self._secret(record, "credential"))

    @staticmethod
    def _remove(path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            fsync_dir(path.parent)


__all__ = ["RunFiles"]
