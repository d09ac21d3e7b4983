"""Every node-health parser, fed any text, any bytes, or a recording cut short or spliced
with junk, either parses or raises Unreadable with one line naming its file: nothing else.

The budget is fixed like test_properties.py's: few examples, no deadline, derandomized.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dscluster.doctor.health import Unreadable, nvidia, nvlink, topology

from .health_fixtures import LSPCI_ROOT_PORT, NVLINK_A100_E, T4, TOPO_H20, fixture

PROPERTIES = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# (parser, the file its errors name, a recording of that file)
PARSERS = [
    (nvidia.parse, nvidia.FILE, T4),
    (nvlink.parse_status, nvlink.STATUS, "nvlink/nvidia-smi-nvlink-s_4x_v100-sxm2.txt"),
    (nvlink.parse_errors, nvlink.ERRORS, NVLINK_A100_E),
    (topology.parse_topo, topology.TOPO, TOPO_H20),
    (topology.parse_lspci, topology.LSPCI, LSPCI_ROOT_PORT),
]
IDS = [name for _, name, _ in PARSERS]


def parses_or_unreadable(parse, name: str, text: str) -> None:
    try:
        parse(text)
    except Unreadable as exc:
        assert str(exc).startswith(f"{name}: ") and "\n" not in str(exc)


@pytest.mark.parametrize(("parse", "name", "_recording"), PARSERS, ids=IDS)
@PROPERTIES
@given(text=st.text())
def test_any_text_parses_or_is_unreadable(parse, name, _recording, text):
    parses_or_unreadable(parse, name, text)


@pytest.mark.parametrize(("parse", "name", "_recording"), PARSERS, ids=IDS)
@PROPERTIES
@given(data=st.binary())
def test_any_bytes_parse_or_are_unreadable(parse, name, _recording, data):
    parses_or_unreadable(parse, name, data.decode("utf-8", errors="surrogateescape"))


@pytest.mark.parametrize(("parse", "name", "recording"), PARSERS, ids=IDS)
@PROPERTIES
@given(cut=st.integers(0, 20000), junk=st.text(max_size=20))
def test_cut_or_spliced_recording_parses_or_is_unreadable(parse, name, recording, cut, junk):
    text = fixture(recording)
    parses_or_unreadable(parse, name, text[:cut] + junk + text[cut + len(junk) :])
