"""The example pod's tool service: a tiny ticket store behind one managed tool, `get_ticket`.

Run: python examples/pod/ticket_api.py [--host 127.0.0.1] [--port 18091]. It checks the bearer the proxy sends (TICKET_API_TOKEN,
with the pod's default) itself: the descriptor tells the proxy to send it, and the service must validate it.
"""

from __future__ import annotations

import argparse
import hmac
import os

from aiohttp import web

TICKETS = {
    42: {
        "id": 42,
        "title": "Printer on fire",
        "status": "open",
        "body": "The third-floor printer smokes when printing duplex. Tried: power cycle. Customer waiting.",
    },
    7: {
        "id": 7,
        "title": "VPN drops hourly",
        "status": "pending",
        "body": "VPN disconnects every hour on the hour. Tried: new client version.",
    },
}


def make_app(token: str) -> web.Application:
    async def get_ticket(request: web.Request) -> web.Response:
        if not hmac.compare_digest(request.headers.get("Authorization", ""), f"Bearer {token}"):
            return web.json_response({"error": "unauthorized"}, status=401)
        body = await request.json()
        ticket = TICKETS.get(body.get("id")) if isinstance(body, dict) else None
        if ticket is None:
            return web.json_response({"error": "no such ticket"}, status=404)
        return web.json_response(ticket)

    app = web.Application()
    app.router.add_post("/tools/get_ticket", get_ticket)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18091)
    args = parser.parse_args()
    token = os.environ.get("TICKET_API_TOKEN", "example-ticket-token-change-me")
    web.run_app(make_app(token), host=args.host, port=args.port, print=lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
