"""How fast is the spec digest? Spec digests per second for a 2 KiB spec, against json.dumps(sort_keys=True) plus
sha256 (which is not canonical JSON, but is what one would write without RFC 8785) in the same run.

Run: .venv/bin/python bench/jcs_digest.py [--seconds 1.0] [--repeats 7]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from clawstack.common.digest import spec_digest
from clawstack.common.strictjson import loads_spec


def make_spec(target_bytes: int = 2048) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "template": "worker",
        "task": "Summarize ticket 42 and propose a fix. " * 20,
        "tools": [f"ticket-api.tool_{i}" for i in range(12)],
        "max_runtime_seconds": 900,
        "home": "ticket-42",
    }
    filler = 0
    while len(json.dumps(spec, separators=(",", ":"), ensure_ascii=False).encode()) < target_bytes:
        spec[f"label_{filler:02d}"] = "é€😀 value " * 3
        filler += 1
    return spec


def rate(fn: Callable[[], object], seconds: float) -> float:
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(100):
            fn()
        count += 100
        now = time.perf_counter()
        if now >= deadline:
            return count / (now - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=1.0, help="duration of one repetition")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    spec = make_spec()
    size = len(json.dumps(spec, separators=(",", ":"), ensure_ascii=False).encode())
    body = json.dumps(spec).encode()

    def baseline() -> object:
        return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def digest() -> object:
        return spec_digest(spec)

    def parse_and_digest() -> object:
        return spec_digest(loads_spec(body))

    results: dict[str, list[float]] = {"baseline": [], "digest": [], "parse+digest": []}
    for _ in range(args.repeats):  # interleaved so that machine noise hits all three alike
        results["baseline"].append(rate(baseline, args.seconds))
        results["digest"].append(rate(digest, args.seconds))
        results["parse+digest"].append(rate(parse_and_digest, args.seconds))

    base = statistics.median(results["baseline"])
    print(f"spec: {size} bytes canonical, {len(spec)} fields; {args.repeats} repetitions of {args.seconds} s")
    print(f"{'case':<42} {'median/s':>12} {'min/s':>12} {'max/s':>12} {'vs baseline':>12}")
    labels = {
        "baseline": "json.dumps(sort_keys) + sha256 (baseline)",
        "digest": "spec_digest (RFC 8785 JCS + sha256)",
        "parse+digest": "strict parse + spec_digest",
    }
    for key, values in results.items():
        med = statistics.median(values)
        print(f"{labels[key]:<42} {med:>12,.0f} {min(values):>12,.0f} {max(values):>12,.0f} {med / base:>11.3f}x")


if __name__ == "__main__":
    main()
