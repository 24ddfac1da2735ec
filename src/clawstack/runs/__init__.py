"""The run supervisor, ``claw runs serve``: one isolated one-shot worker per run, over a Unix-socket HTTP API."""

from clawstack.runs.client import AsyncRunsClient, RunsClient
from clawstack.runs.errors import RunsError
from clawstack.runs.ledger import Ledger, RunRecord
from clawstack.runs.server import RunsServer, make_app
from clawstack.runs.supervisor import Supervisor

__all__ = ["AsyncRunsClient", "Ledger", "RunRecord", "RunsClient", "RunsError", "RunsServer", "Supervisor", "make_app"]
