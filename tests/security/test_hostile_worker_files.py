"""Files a meter (or a worker) can write are read by the supervisor as if hostile: never through a link, never
blocking on a FIFO, bounded, from one descriptor. A measure that is no measure ends the run's meter, it never hangs
or stalls the supervisor."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from clawstack.runs.backends import LocalBackend
from clawstack.runs.backends.base import METER_OUT_DIR, METER_RECORD
from clawstack.runs.backends.local_meter import METER_DIR
from clawstack.runs.backends.monitor import MAX_RECORD_BYTES, RecordInvalid, read_json

pytestmark = pytest.mark.security

MEASURE = {"verdict": "ok", "bytes": 10}


def in_thread(call: object, timeout_s: float = 5.0) -> object:
    """``call()`` in a thread, failing the test if it blocks (a FIFO read would never return)."""
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(_catch(call)), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "the read blocked"
    return out[0]


def _catch(call: object) -> object:
    try:
        return call()  # type: ignore[operator]
    except Exception as exc:
        return exc


def test_positive_control_a_measure_is_read(tmp_path: Path) -> None:
    (tmp_path / METER_RECORD).write_text(json.dumps(MEASURE))
    assert read_json(tmp_path / METER_RECORD) == MEASURE
    assert read_json(tmp_path / "absent.json") is None


def test_a_link_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"verdict": "ok", "secret": "s3cret"}))
    os.symlink(secret, tmp_path / METER_RECORD)
    assert isinstance(in_thread(lambda: read_json(tmp_path / METER_RECORD)), RecordInvalid)


def test_a_fifo_never_blocks(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / METER_RECORD)
    assert isinstance(in_thread(lambda: read_json(tmp_path / METER_RECORD)), RecordInvalid)


def test_a_second_hard_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "other.json").write_text(json.dumps(MEASURE))
    os.link(tmp_path / "other.json", tmp_path / METER_RECORD)
    assert isinstance(in_thread(lambda: read_json(tmp_path / METER_RECORD)), RecordInvalid)


def test_an_oversized_record_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    with open(tmp_path / METER_RECORD, "wb") as handle:
        handle.write(b'{"verdict": "ok", "pad": "' + b"x" * (MAX_RECORD_BYTES + 10) + b'"}')
    assert isinstance(in_thread(lambda: read_json(tmp_path / METER_RECORD)), RecordInvalid)


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b"\xff\xfe"])
def test_a_malformed_record_is_refused(tmp_path: Path, body: bytes) -> None:
    (tmp_path / METER_RECORD).write_bytes(body)
    assert isinstance(in_thread(lambda: read_json(tmp_path / METER_RECORD)), RecordInvalid)


def test_a_directory_or_socket_is_refused(tmp_path: Path) -> None:
    (tmp_path / METER_RECORD).mkdir()
    assert isinstance(in_thread(lambda: read_json(tmp_path / METER_RECORD)), RecordInvalid)


@pytest.mark.parametrize("kind", ["fifo", "link", "ok"])
def test_the_local_backend_ends_the_meter_instead_of_stalling(tmp_path: Path, kind: str) -> None:
    run_dir = tmp_path / "state" / "acme" / "r1"
    (run_dir / METER_DIR).mkdir(parents=True)
    out = run_dir / METER_OUT_DIR
    out.mkdir()
    record = out / METER_RECORD
    if kind == "fifo":
        os.mkfifo(record)
    elif kind == "link":
        (tmp_path / "elsewhere.json").write_text(json.dumps(MEASURE))
        os.symlink(tmp_path / "elsewhere.json", record)
    else:
        record.write_text(json.dumps(MEASURE))
    backend = LocalBackend(tmp_path / "state", pod="p")
    answer = in_thread(lambda: backend._meter_verdict(run_dir))
    assert isinstance(answer, tuple), answer
    verdict = answer[0]
    # No monitor record yet: the meter is being started, so a good measure is still pending, a bad one is final.
    assert verdict == ("pending" if kind == "ok" else "home_meter_unavailable")
