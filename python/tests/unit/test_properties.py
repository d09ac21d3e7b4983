"""Property tests of every parser and renderer a user's input reaches (issue 14).

Any input either gives output that DeepSpeed's / Slurm's own parsers accept, or raises
DsclusterError - nothing else; round trips keep the data. The budget is fixed (the
`dscluster-parsers` profile: few examples, no deadline, derandomized so CI repeats itself).
"""

from __future__ import annotations

import collections
import json
import pathlib
import re
import string
import tempfile
from typing import Any

import hostlist
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dscluster import hostfile
from dscluster.deepspeed_env import extra_env_texts, parse_env_file, render_env
from dscluster.errors import DsclusterError
from dscluster.launch_env import derive_launch_env
from dscluster.node_facts import NodeFacts, read_facts_file
from dscluster.sources import names, slurm, static
from dscluster.text import one_line
from dscluster.validate import MAX_NODES, MAX_SLOTS

from .clirun import DS_HOSTFILE_RE

settings.register_profile(
    "dscluster-parsers",
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
PROFILE = settings.get_profile("dscluster-parsers")
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def refused_or(fn, *args: Any) -> Any:
    """fn(*args), or None when it refused with a usable one-line DsclusterError."""
    try:
        return fn(*args)
    except DsclusterError as exc:
        assert one_line(str(exc)), "an empty error message"
        return None


# ---- the reference parsers: what DeepSpeed and Slurm themselves do --------------------------


def deepspeed_hostfile(text: str) -> dict[str, int]:
    """deepspeed/launcher/runner.py::_parse_hostfile on the lines of a file."""
    pool: collections.OrderedDict[str, int] = collections.OrderedDict()
    for raw in _readlines(text):
        line = raw.strip()
        match = re.search(r"^(\S+)\s+slots=(\d+)", line)
        if line.startswith("#") or line == "":
            continue
        if not match:
            raise ValueError(f"bad entry {line}")
        if match.group(1) in pool:
            raise ValueError(f"multiple entries for {match.group(1)}")
        pool[match.group(1)] = int(match.group(2))
    if not pool:
        raise ValueError("empty hostfile")
    return dict(pool)


def _readlines(text: str) -> list[str]:
    """file.readlines() of a file holding `text`: split after each \\n only."""
    return [line for line in re.split(r"(?<=\n)", text) if line]


def deepspeed_env(text: str) -> dict[str, str]:
    """deepspeed/launcher/runner.py: each line split once on '=', key and value stripped."""
    env: dict[str, str] = {}
    for var in _readlines(text):
        key, val = var.split("=", maxsplit=1)
        env[key.strip()] = val.strip()
    return env


def slurm_counts(text: str) -> list[int]:
    """python-hostlist's SLURM_TASKS_PER_NODE parser (Slurm's documented format)."""
    return hostlist.parse_slurm_tasks_per_node(text)


# ---- strategies -----------------------------------------------------------------------------

NAME_ALPHABET = string.ascii_letters + string.digits + "._-"
JUNK = st.text(alphabet=st.sampled_from(NAME_ALPHABET + ",:[]- \n\t\x00x()é:;/$"), max_size=30)
names_st = st.text(alphabet=NAME_ALPHABET, min_size=1, max_size=12)
number = st.integers(min_value=0, max_value=120)


@st.composite
def ranges(draw) -> str:
    items = []
    for _ in range(draw(st.integers(1, 3))):
        lo = draw(number)
        hi = draw(st.one_of(st.none(), st.integers(lo - 2, lo + 40)))
        width = draw(st.integers(1, 4))
        item = f"{lo:0{width}d}" if hi is None else f"{lo:0{width}d}-{max(hi, 0):0{width}d}"
        items.append(item)
    return "[" + ",".join(items) + "]"


@st.composite
def host_patterns(draw) -> str:
    prefix = draw(names_st)
    if draw(st.booleans()):
        prefix += draw(ranges())
        if draw(st.booleans()):
            prefix += draw(st.text(alphabet=NAME_ALPHABET, max_size=3))
    return prefix


@st.composite
def host_lists(draw, slots: bool = True) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        part = draw(host_patterns())
        if slots and draw(st.booleans()):
            part += ":" + draw(st.sampled_from(["1", "4", "1024", "1025", "0", "-2", "x", "08"]))
        parts.append(part)
    return ",".join(parts)


def mutated(text_st):
    """A structured text, sometimes with junk spliced in."""

    @st.composite
    def build(draw) -> str:
        text = draw(text_st)
        if draw(st.booleans()):
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(JUNK) + text[at:]
        return text

    return build()


any_host_text = st.one_of(mutated(host_lists()), st.text(max_size=40))


# ---- host lists (inventory static --hosts) ---------------------------------------------------


def check_entries(entries: list[tuple[str, int]]) -> None:
    assert 1 <= len(entries) <= MAX_NODES
    hosts = [h for h, _ in entries]
    assert len(set(hosts)) == len(hosts)
    for host, slots in entries:
        names.check_host_name(host)
        assert 1 <= slots <= MAX_SLOTS
    text = hostfile.render_hostfile(entries)
    assert all(DS_HOSTFILE_RE.match(line) for line in text.splitlines())
    assert deepspeed_hostfile(text) == dict(entries)


@PROFILE
@given(text=any_host_text, default=st.integers(-2, 1030))
def test_host_lists_give_a_valid_hostfile_or_refuse(text, default):
    entries = refused_or(static.parse_hosts, text, default)
    if entries is None:
        return
    check_entries(entries)
    bare = [p.rpartition(":")[0] if ":" in p else p for p in static.split_top_level(text)]
    assert [h for h, _ in entries] == hostlist.expand_hostlist(",".join(bare))


@PROFILE
@given(text=host_lists(slots=False))
def test_valid_host_lists_expand_as_python_hostlist_does(text):
    entries = refused_or(static.parse_hosts, text, 2)
    try:
        expected = hostlist.expand_hostlist(text, allow_duplicates=True)
    except hostlist.BadHostlist:
        assert entries is None
        return
    if entries is not None:
        assert [h for h, _ in entries] == expected
        assert {s for _, s in entries} == {2}


@PROFILE
@given(
    count=st.integers(1, 10**12),
    width=st.integers(1, 13),
)
def test_huge_host_ranges_are_refused_before_expanding(count, width):
    text = f"n[{0:0{width}d}-{count:0{width}d}]"
    entries = refused_or(static.parse_hosts, text, 1)
    assert (entries is None) == (count + 1 > MAX_NODES or width > 18)


# ---- Slurm node lists and count lists --------------------------------------------------------


@PROFILE
@given(text=st.one_of(mutated(host_lists(slots=False)), st.text(max_size=40)))
def test_node_lists_expand_to_hostfile_names_or_refuse(text):
    nodes = refused_or(slurm.expand_nodelist, text)
    if nodes is None:
        return
    check_entries([(n, 1) for n in nodes])
    assert nodes == hostlist.expand_hostlist(text.strip())
    # and back: Slurm's compressed form of the nodes expands to the same nodes
    assert set(slurm.expand_nodelist(hostlist.collect_hostlist(nodes))) == set(nodes)


counts_st = st.lists(st.tuples(st.integers(0, 2000), st.integers(1, 5)), min_size=1, max_size=5)


def render_counts(items: list[tuple[int, int]]) -> str:
    return ",".join(f"{c}(x{r})" if r > 1 else str(c) for c, r in items)


@PROFILE
@given(items=counts_st)
def test_count_lists_round_trip(items):
    text = render_counts(items)
    expected = [c for c, r in items for _ in range(r)]
    assert slurm.parse_counts(text, "SLURM_TASKS_PER_NODE") == expected
    assert slurm.parse_counts(text) == slurm_counts(text)


count_text = st.one_of(
    mutated(st.builds(render_counts, counts_st)),
    st.from_regex(r"[0-9]{1,3}\(x[0-9]{1,14}\)(,[0-9]\(x[0-9]{1,12}\))?", fullmatch=True),
    st.text(alphabet="0123456789(x),- \n", max_size=20),
)


@PROFILE
@given(text=count_text)
def test_count_lists_parse_as_slurm_or_refuse(text):
    counts = refused_or(slurm.parse_counts, text, "SLURM_JOB_CPUS_PER_NODE")
    if counts is None:
        return
    assert 1 <= len(counts) <= MAX_NODES
    assert counts == slurm_counts(text.strip()) or counts == slurm_counts(
        ",".join(p.strip() for p in text.split(","))
    )


SLURM_VARS = (
    "SLURM_GPUS_ON_NODE",
    "SLURM_JOB_GPUS",
    "SLURM_GPUS_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_JOB_CPUS_PER_NODE",
)
env_value = st.one_of(
    st.sampled_from(["", "0", "4", "abc", "-1", "99999999999", "2(x3)", "a100:4", "0,1"]),
    count_text,
    st.text(max_size=12),
)


@PROFILE
@given(env=st.dictionaries(st.sampled_from(SLURM_VARS), env_value), nodes=st.integers(1, 5))
def test_slots_from_slurm_env_are_slots_or_refused(env, nodes):
    hosts = [f"n{i}" for i in range(nodes)]
    result = refused_or(slurm.slots_and_source, env, hosts)
    if result is None:
        return
    slots, source = result
    assert len(slots) == nodes
    assert all(1 <= s <= 1024 for s in slots)
    assert source in (*SLURM_VARS, "default")
    check_entries(list(zip(hosts, slots, strict=True)))


# ---- the DeepSpeed hostfile --------------------------------------------------------------------

entries_st = st.lists(
    st.tuples(
        st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
        st.integers(1, 1024),
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda e: e[0].lower() if e[0].lower() in names.RESERVED_NAMES else e[0],
)


@PROFILE
@given(entries=entries_st)
def test_hostfile_render_parse_round_trip(entries):
    text = hostfile.render_hostfile(entries)
    assert hostfile.parse_hostfile(text, "hostfile") == entries
    assert deepspeed_hostfile(text) == dict(entries)


hostfile_text = st.one_of(
    mutated(st.builds(hostfile.render_hostfile, entries_st)),
    st.lists(
        st.one_of(
            st.from_regex(r"[a-z0-9]{1,4}[ \t]+slots=[0-9a-z]{0,5}", fullmatch=True),
            st.sampled_from(["", "# comment", "  ", "n1 slots=two", "n1", "::1 slots=2"]),
        ),
        max_size=5,
    ).map("\n".join),
    st.text(max_size=40),
)


@PROFILE
@given(text=hostfile_text)
def test_hand_edited_hostfiles_parse_as_deepspeed_does_or_refuse(text):
    entries = refused_or(hostfile.parse_hostfile, text, "inventories/x/hostfile")
    if entries is None:
        return
    assert deepspeed_hostfile(text) == dict(entries)
    check_entries(entries)


# ---- .deepspeed_env -------------------------------------------------------------------------

env_key = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True), st.text(max_size=6)
)
env_val = st.one_of(st.from_regex(r"[\w@%+=:,./-]{1,12}", fullmatch=True), st.text(max_size=12))


@PROFILE
@given(env=st.dictionaries(env_key, env_val, max_size=5))
def test_deepspeed_env_render_is_what_deepspeed_reads(env):
    text = refused_or(render_env, env)
    if text is None:
        return
    assert deepspeed_env(text) == env
    assert parse_env_file(text, ".deepspeed_env") == env


@PROFILE
@given(
    text=st.one_of(
        st.lists(st.tuples(env_key, env_val).map("=".join), max_size=4).map("\n".join),
        st.text(max_size=40),
    )
)
def test_deepspeed_env_parse_agrees_with_deepspeed_or_refuses(text):
    env = refused_or(parse_env_file, text, ".deepspeed_env")
    if env is None:
        return
    assert deepspeed_env(text) == env
    if env:
        assert parse_env_file(render_env(env), "x") == env


# ---- recorded facts -----------------------------------------------------------------------------

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
json_any = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
FACT_KEYS = (
    "accelerators",
    "accelerators.kind",
    "accelerators.count",
    "accelerators.cpus",
    "accelerators.nvidia",
    "accelerators.nvidia.models",
    "cpu_slots",
    "interface",
    "address",
    "versions",
    "versions.venv",
    "versions.torch_extensions_dir",
    "versions.pycache_dir",
    "nccl_env",
    "nccl_env.env",
)


def good_facts() -> dict[str, Any]:
    return {
        "accelerators": {"kind": "cuda", "count": 4, "cpus": 8, "nvidia": {"models": ["A"]}},
        "cpu_slots": 2,
        "interface": "eth0",
        "address": "10.0.0.1",
        "versions": {"venv": "/opt/v", "torch_extensions_dir": "/opt/ext"},
        "nccl_env": {"env": {"NCCL_SOCKET_IFNAME": "eth0"}},
    }


def set_key(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    node: Any = data
    *path, last = dotted.split(".")
    for key in path:
        if not isinstance(node, dict):
            return data
        node = node.setdefault(key, {})
    if isinstance(node, dict):
        node[last] = value
    return data


def check_node_facts(facts: NodeFacts) -> None:
    assert isinstance(facts.accelerator, str) and isinstance(facts.venv, str)
    for count in (facts.accelerator_count, facts.cpu_slots, facts.cpus):
        assert isinstance(count, int) and not isinstance(count, bool) and count >= 0
    assert all(isinstance(m, str) for m in facts.models)
    # what the launch files are made of: valid, or refused
    refused_or(hostfile.render_hostfile, [(facts.host, facts.slots)])
    env = refused_or(derive_launch_env, [facts])
    if env is not None:
        refused_or(render_env, env[0])


@PROFILE
@given(changes=st.lists(st.tuples(st.sampled_from(FACT_KEYS), json_any), max_size=3))
def test_facts_with_wrong_types_load_or_refuse(changes):
    data = good_facts()
    for key, value in changes:
        data = set_key(data, key, value)
    facts = refused_or(NodeFacts.from_json, "n1", data, "facts/n1.json")
    if facts is not None:
        check_node_facts(facts)


@PROFILE
@given(data=json_any)
def test_any_json_document_loads_or_refuses(data):
    facts = refused_or(NodeFacts.from_json, "n1", data, "facts/n1.json")
    if facts is not None:
        check_node_facts(facts)


@PROFILE
@given(
    raw=st.one_of(
        st.binary(max_size=40),
        st.builds(lambda d: json.dumps(d).encode(), json_any),
        st.just(b'{"accelerators": 1' + b"\xff\xfe}"),
        st.just(b"[" * 5000 + b"]" * 5000),
        st.just(b"1" * 5000),
    )
)
def test_facts_files_of_any_bytes_load_or_refuse(raw):
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "n1.json"
        path.write_bytes(raw)
        facts = refused_or(read_facts_file, path, "n1")
    if facts is not None:
        check_node_facts(facts)


# ---- dscluster_extra_env ------------------------------------------------------------------------


@PROFILE
@given(extra=st.one_of(st.dictionaries(st.one_of(env_key, st.integers()), json_any), json_any))
def test_extra_env_renders_as_text_or_refuses(extra):
    env = refused_or(extra_env_texts, extra, "dscluster_extra_env in demo")
    if env is None:
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    assert all(ENV_KEY_RE.fullmatch(k) for k in env)
    text = refused_or(render_env, env)
    if text is not None:
        assert deepspeed_env(text) == env


@pytest.mark.parametrize(
    ("value", "text"),
    [(4, "4"), (True, "1"), (False, "0"), (0.5, "0.5"), ("x", "x"), (-3, "-3")],
)
def test_extra_env_plain_values(value, text):
    assert extra_env_texts({"K": value}, "x") == {"K": text}
