"""What the proxy reports about a task-home run's model calls, as the supervisor reads it: absent when the proxy
reported nothing; a malformed report keeps its well-formed counts and is never called complete."""

from __future__ import annotations

from clawstack.runs.proxylink import Usage, read_usage


def test_a_well_formed_report() -> None:
    report = {"served_by": {"subscription": 12, "api_key": 3}, "served_by_complete": True, "last_plan_failure": None}
    assert read_usage(report) == Usage({"subscription": 12, "api_key": 3}, True, None)
    failed = report | {"last_plan_failure": "subscription_limit_reached"}
    assert read_usage(failed) == Usage({"subscription": 12, "api_key": 3}, True, "subscription_limit_reached")


def test_nothing_reported_is_absent() -> None:
    assert read_usage({"id": "run-1", "state": "revoked"}) is None


def test_a_restarted_proxy_reports_a_subset() -> None:
    assert read_usage({"served_by": {"api_key": 1}, "served_by_complete": False}) == Usage({"api_key": 1}, False, None)


def test_malformed_reports_are_incomplete() -> None:
    for bad, kept in (
        ({"api_key": -1}, {}),
        ({"api_key": True}, {}),
        ({"api_key": "3"}, {}),
        ({"api_key": 2, "token": 5}, {"api_key": 2}),
    ):
        assert read_usage({"served_by": bad, "served_by_complete": True}) == Usage(kept, False, None), bad
    assert read_usage({"served_by": [1], "served_by_complete": True}) == Usage({}, False, None)
    odd_failure = {"served_by": {"api_key": 1}, "served_by_complete": True, "last_plan_failure": "sk-secret"}
    assert read_usage(odd_failure) == Usage({"api_key": 1}, False, None)
    assert read_usage({"served_by": {"api_key": 1}}) == Usage({"api_key": 1}, False, None)
