"""The periodic flush: each step record encoded once, the file the same JSON as a whole encoding."""

from __future__ import annotations

import json
import math

import numpy as np

from pitstop.profile.hooks import write_json_atomic
from pitstop.profile.timeline import RecordsJson


def _rec(i: int, **extra: object) -> dict[str, object]:
    return {"index": i, "total_s": 0.01 * (i + 1), "warmup": i < 2, **extra}


def test_records_json_grows_and_matches_encoding_them_all():
    enc, records = RecordsJson(), []
    assert json.loads(enc.text(records)) == []
    for i in range(5):
        records.append(_rec(i))
        assert json.loads(enc.text(records)) == records
    assert json.loads(enc.text(records)) == records  # no new record: the same text


def test_records_json_starts_afresh_when_the_records_were_dropped():
    enc, records = RecordsJson(), [_rec(0), _rec(1), _rec(2)]
    enc.text(records)
    records.clear()  # micro-steps dropped, then as many new steps as before and more
    records.extend([_rec(0, eval=True), _rec(1, eval=True), _rec(2), _rec(3)])
    assert json.loads(enc.text(records)) == records


def test_records_json_writes_nan_and_numpy_values_as_every_record_is_written():
    enc = RecordsJson()
    records = [_rec(0, h2d_gpu_s=math.nan), _rec(1, syncs=np.int64(3))]
    assert json.loads(enc.text(records)) == [_rec(0, h2d_gpu_s=None), _rec(1, syncs=3)]


def test_write_json_atomic_adds_keys_encoded_already(tmp_path):
    path = tmp_path / "m.json"
    write_json_atomic(path, {"status": "running", "x": math.inf}, {"steps": "[1,2]"})
    assert json.loads(path.read_text()) == {"status": "running", "x": None, "steps": [1, 2]}
    write_json_atomic(path, {}, {"steps": "[]"})
    assert json.loads(path.read_text()) == {"steps": []}
