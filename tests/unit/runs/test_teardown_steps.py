"""Full-pod teardown ends a run the way a served run ends: through a recorded ``revoked`` step, secrets removed."""

from __future__ import annotations

from pathlib import Path

import pytest

from clawstack.pod.artifacts import PodPaths
from clawstack.runs.files import RunFiles
from clawstack.runs.ledger import Ledger, RunRecord
from clawstack.runs.teardown import finish_after_proxy_stopped


def test_proxy_stopped_passes_through_revoked_and_removes_the_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = PodPaths(tmp_path)
    ledger = Ledger(paths.runs)
    ledger.open()
    record = RunRecord(
        installation="acme",
        run_id="r1",
        generation=1,
        spec_digest="sha256:" + "0" * 64,
        spec={"template": "worker", "task": "t"},
        template="worker",
        template_id="sha256:" + "1" * 64,
        models=[],
        tools=[],
        authority_expires_at="2030-01-01T00:00:00Z",
        accepted_at="2029-01-01T00:00:00Z",
        state="revoking",
        cancelled=True,
        credential="held",
    )
    ledger.insert(record)
    ledger.close()
    files = RunFiles(paths)
    files.store_credential(record, "orchestrator-token")
    files.identity_secret(record)
    recorded: list[str] = []
    original = Ledger.update

    def update(self: Ledger, changed: RunRecord) -> None:
        recorded.append(changed.state)
        original(self, changed)

    monkeypatch.setattr(Ledger, "update", update)
    finish_after_proxy_stopped(paths, ["acme/r1"])
    assert recorded == ["revoked", "stopped"]
    assert list((paths.runs / "secrets" / "acme").iterdir()) == []
    ledger.open()
    final = ledger.get("acme", "r1")
    ledger.close()
    assert final is not None
    assert (final.state, final.revoked, final.revocation_proof) == ("stopped", True, "proxy_stopped")
