"""The worker's records (protos/records.py): one definition of a registration's and a progress report's
fields and rules. Built by the worker, parsed where they enter the coordinator; the JSON they carry and
what the coordinator stores is the object the worker sent."""

from __future__ import annotations

import json

import pytest

from coordinator.schema import check_capabilities, check_progress
from protos.fields import SpecError
from protos.records import CAPABILITY_FIELDS, Progress, WorkerCapabilities
from worker.agent import lease_capabilities

SENT = {"os": "Darwin 24.1", "memory_bytes": 68719476736, "packs": ["tiny"], "pack_features": {"tiny": ["audio"]},
        "pack_generation": {"tiny": "ltx-2"}, "pack_components": {"tiny": ["transformer", "vae_decoder"]},
        "pack_bytes": {"tiny": 1234}, "pack_problems": {}, "text_encoders": {"gemma": 99}, "kinds": ["decode"]}


def test_a_registration_round_trips_as_sent_keys_and_order_included():
    caps = WorkerCapabilities.from_dict(SENT)
    assert caps.packs == ("tiny",) and caps.memory_bytes == 68719476736
    assert caps.pack_components == {"tiny": ("transformer", "vae_decoder")}
    assert caps.other == {"os": "Darwin 24.1", "pack_features": {"tiny": ["audio"]}}
    assert caps.to_json() == json.dumps(SENT)  # the wire and the stored JSON: byte for byte
    assert check_capabilities(json.dumps(SENT)) == caps
    assert set(CAPABILITY_FIELDS) <= set(SENT)  # the sample holds every typed field


@pytest.mark.parametrize(("caps", "message"), [
    ({"packs": 5}, "capability packs must be a list of names"),
    ({"memory_bytes": "lots"}, "memory_bytes 'lots' is not a whole number"),
    ({"memory_bytes": -1}, "memory_bytes -1 is negative"),
    ({"pack_generation": {"a": "x" * 40}}, "capability pack_generation['a'] is 40 characters; at most 32"),
    ({"pack_bytes": {"a": True}}, "capability pack_bytes['a'] True is not a whole number"),
    ({"text_encoders": [1]}, "capability text_encoders must be an object"),
    (["x"], "capabilities_json must be a JSON object"),
])
def test_a_registration_that_breaks_a_rule_is_refused_in_one_line(caps, message):
    with pytest.raises(SpecError) as refused:
        check_capabilities(json.dumps(caps))
    assert str(refused.value) == message


def test_the_worker_builds_its_registration_with_the_same_rules():
    with pytest.raises(SpecError, match="capability kinds must be a list of names"):
        WorkerCapabilities.from_dict({"kinds": "decode"})
    assert lease_capabilities(WorkerCapabilities()) == ["mlx"]
    assert lease_capabilities(WorkerCapabilities.from_dict({"capabilities": ["coordinator", "mlx"]})) == [
        "coordinator", "mlx"]


def test_progress_is_what_the_heartbeat_sent():
    assert Progress().to_json() == "{}"
    assert Progress(step=2, total=8).to_json() == '{"step": 2, "total": 8}'
    assert Progress(phase="run").to_json() == '{"phase": "run"}'
    odd = '{"note": "x", "step": "two", "total": 8}'  # only shape is a rule: shown as sent
    assert check_progress(odd).to_json() == odd and check_progress(odd).total == 8
    for text, message in [("[1]", "progress_json must be a JSON object"),
                          ("x" * 70_000, "progress_json is 70000 bytes; at most 65536 are accepted"),
                          ('{"a":' * 10 + "1" + "}" * 10, "progress_json is nested more than 8 deep")]:
        with pytest.raises(SpecError) as refused:
            check_progress(text)
        assert str(refused.value) == message
