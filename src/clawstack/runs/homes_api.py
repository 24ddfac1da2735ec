"""The homes endpoints: ``GET``/``DELETE /v1/homes/{installation}/{home}`` and the home's deliverables.

A home's status says whether it exists and which run reserves it. Deleting a home is refused with ``home_busy``
while a run reserves it, and is decided under the supervisor's admission lock, so no launch for the home is
admitted while it is being removed. Deliverables are read in a thread by :mod:`clawstack.runs.deliverables`,
whether or not a run holds the home. No answer or error carries a host path.
"""

from __future__ import annotations

import asyncio
from typing import Any

from clawstack.runs.admission import check_installation
from clawstack.runs.deliverables import DeliverableError, fetch_deliverable, list_deliverables
from clawstack.runs.errors import RunsError
from clawstack.runs.homes import HOME_ID
from clawstack.runs.supervisor import Answer, Supervisor


def _check_home(installation: str, home: str) -> None:
    check_installation(installation)
    if not HOME_ID.fullmatch(home):
        raise RunsError("request_invalid", "home is 1 to 128 of A-Z a-z 0-9 . _ - and does not start with a dot")


class HomesAPI:
    """The homes of one supervisor's pod."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.sup = supervisor

    def _body(self, installation: str, home: str) -> dict[str, Any]:
        holder = self.sup.ledger.home_holder(installation, home)
        return {
            "installation": installation,
            "home": home,
            "exists": self.sup.homes.exists(installation, home),
            "reserved_by": None if holder is None else holder.run_id,
        }

    def status(self, installation: str, home: str) -> Answer:
        _check_home(installation, home)
        body = self._body(installation, home)
        if not body["exists"] and body["reserved_by"] is None:
            raise RunsError("home_unknown", "no such home")
        return Answer(200, body)

    async def delete(self, installation: str, home: str) -> Answer:
        _check_home(installation, home)
        async with self.sup.admission_lock:  # no launch for this home is admitted meanwhile
            holder = self.sup.ledger.home_holder(installation, home)
            if holder is not None:
                raise RunsError(
                    "home_busy", f"run {holder.run_id} reserves the home; delete it once that run has ended"
                )
            if not await asyncio.to_thread(self.sup.homes.delete, installation, home):
                raise RunsError("home_unknown", "no such home")
        return Answer(200, {"installation": installation, "home": home, "deleted": True})

    async def deliverables(self, installation: str, home: str) -> Answer:
        _check_home(installation, home)
        try:
            listing = await asyncio.to_thread(list_deliverables, self.sup.paths.homes, installation, home)
        except DeliverableError as exc:
            raise RunsError(exc.code, exc.message) from exc
        return Answer(200, listing.to_json())

    async def deliverable(self, installation: str, home: str, name: str, sha256: str | None) -> Answer:
        _check_home(installation, home)
        try:
            body = await asyncio.to_thread(
                fetch_deliverable, self.sup.paths.homes, installation, home, name, expected_sha256=sha256
            )
        except DeliverableError as exc:
            raise RunsError(exc.code, exc.message) from exc
        return Answer(200, body)


__all__ = ["HomesAPI"]
