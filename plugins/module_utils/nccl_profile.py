#!/usr/bin/python3
"""Choose this node's NCCL / HCCL / libfabric / gloo environment from its accelerators fact.

Pure functions (imported by the tests and by the nccl_env_files module, which computes the
node's profile with node_state() and writes what conf_text() and fact_text() render, in one
round trip) plus a small CLI: the nccl_env role installs this file
as /opt/dscluster/bin/nccl_profile.py, where doctor runs it, and its preflight runs it on the
controller.

    nccl_profile.py profile --fact FILE|- [--overrides JSON] [--ofi-nccl-dir DIR]...
        -> {"profile", "env", "nccl_conf", "socket_ifname", "interfaces"} as JSON on stdout
    nccl_profile.py check-ifname SPEC --fact FILE|-
        -> exit 0 printing the interfaces SPEC selects; exit 1 with one line naming the node
           and the interfaces it does have
    nccl_profile.py state --fact FILE|- [profile's options]
        -> {"profile": the profile (its interfaces checked as check-ifname does) or null,
           "error": why not or null}: what nccl_env_files computes; exit 0 unless the
           arguments are wrong

FILE is what roles/node_facts/files/accelerators.fact prints. Errors are one line on stderr
and exit status 1. Standard library only; Python 3.9+ (nodes run their distribution's python3).

Sources for every value set here (cited again where used):
  [NCCL-ENV]  NCCL User Guide, Environment Variables
              https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html
  [NCCL-SOCK] NCCL's interface filter, src/misc/socket.cc findInterfaces() and
              src/misc/utils.cc parseStringList()/matchIfList()
              https://github.com/NVIDIA/nccl
  [AWS-NCCL]  AWS, "Get started with EFA and NCCL" (nccl-tests run with FI_PROVIDER=efa,
              FI_EFA_USE_DEVICE_RDMA=1 and the aws-ofi-nccl plugin on LD_LIBRARY_PATH)
              https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start-nccl.html
  [SM-EFA]    aws/sagemaker-training-toolkit 9a5ed9f: FI_EFA_USE_DEVICE_RDMA=1,
              RDMAV_FORK_SAFE=1, NCCL_SOCKET_IFNAME on EFA RDMA instances
              https://github.com/aws/sagemaker-training-toolkit/commit/9a5ed9fe4fef4e5858a47c5e6948fa9822bdfcac
  [HL-OFI]    Intel Gaudi docs, "Scale-out via Host NIC" (HCCL_OVER_OFI forces host-NIC
              scale-out over libfabric; EFA Gaudi Direct needs RDMAV_FORK_SAFE=1 and
              FI_EFA_USE_DEVICE_RDMA=1)
              https://docs.habana.ai/en/latest/API_Reference_Guides/HCCL_APIs/Scale_Out_via_Host_NIC.html
  [HL-ENV]    Intel Gaudi docs, HCCL environment variables (HCCL_SOCKET_IFNAME)
              https://docs.habana.ai/en/latest/API_Reference_Guides/HCCL_APIs/Using_HCCL.html
  [TORCH]     PyTorch distributed docs: GLOO_SOCKET_IFNAME is a comma-separated list of
              interface names (exact names, no prefixes)
              https://pytorch.org/docs/stable/distributed.html#common-environment-variables
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys

PROFILES = ("efa", "ib", "roce", "ethernet", "cpu", "hpu")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Where the EFA installer puts aws-ofi-nccl (installer >= 1.29: /opt/amazon/ofi-nccl; older
# builds from source: /opt/aws-ofi-nccl) [AWS-NCCL].
OFI_NCCL_DIRS = ("/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib64", "/opt/aws-ofi-nccl/lib")
OFI_NCCL_LIBS = ("libnccl-net.so", "libnccl-net-ofi.so", "libnccl-net-aws-ofi.so")
EFA_LIB_DIRS = ("/opt/amazon/efa/lib", "/opt/amazon/efa/lib64")


class ProfileError(Exception):
    """A choice that cannot work on this node; the message names the node and the fix."""


# ---- NCCL_SOCKET_IFNAME syntax [NCCL-ENV] [NCCL-SOCK] ----


def parse_ifname_spec(spec: str) -> tuple[bool, bool, list[str]]:
    """(exclude, exact, prefixes) exactly as NCCL reads NCCL_SOCKET_IFNAME.

    NCCL strips one leading '^' (exclude), then one leading '=' (exact names), then splits the
    rest on ','; an entry may end in ':<port>', which NCCL parses and ignores for interface
    names; empty entries are dropped.
    """
    rest = spec
    exclude = rest.startswith("^")
    if exclude:
        rest = rest[1:]
    exact = rest.startswith("=")
    if exact:
        rest = rest[1:]
    prefixes = [item.split(":", 1)[0] for item in rest.split(",")]
    return exclude, exact, [p for p in prefixes if p]


def ifname_matches(spec: str, name: str) -> bool:
    """Whether NCCL would consider interface `name` under NCCL_SOCKET_IFNAME=`spec`."""
    exclude, exact, prefixes = parse_ifname_spec(spec)
    if not prefixes:
        listed = True  # NCCL: an empty list matches everything (then '^' excludes everything)
    elif exact:
        listed = name in prefixes
    else:
        listed = any(name.startswith(p) for p in prefixes)
    return listed != exclude


def addressed_nics(fact: dict) -> list[dict]:
    return [n for n in fact.get("nics") or [] if n.get("ipv4")]


def describe_nics(fact: dict) -> str:
    nics = addressed_nics(fact)
    if not nics:
        return "no interface with an IPv4 address"
    return ", ".join(f"{n['name']} ({', '.join(n['ipv4'])})" for n in nics)


def hostname(fact: dict) -> str:
    return str(fact.get("hostname") or socket.gethostname())


def check_ifname(spec: str, fact: dict, variable: str = "NCCL_SOCKET_IFNAME") -> list[str]:
    """Names of the addressed interfaces `spec` selects; ProfileError when there are none."""
    if not spec or spec != spec.strip() or any(c.isspace() for c in spec):
        raise ProfileError(f"{hostname(fact)}: {variable}={spec!r} is empty or has blanks")
    matched = [n["name"] for n in addressed_nics(fact) if ifname_matches(spec, n["name"])]
    if not matched:
        raise ProfileError(
            f"{hostname(fact)}: {variable}={spec} matches no interface with an IPv4 address; "
            f"this node has: {describe_nics(fact)}"
        )
    return matched


def default_interface(fact: dict) -> str:
    """The default-route interface if it has an address, else the first addressed one."""
    nics = addressed_nics(fact)
    names = [n["name"] for n in nics]
    wanted = fact.get("default_interface") or ""
    if wanted in names:
        return wanted
    if names:
        return names[0]
    raise ProfileError(
        f"{hostname(fact)}: no interface with an IPv4 address for NCCL/gloo sockets; "
        "check the node's network (ip -4 addr)"
    )


# ---- fabric from the fact ----


def has_efa(fact: dict) -> bool:
    return bool(fact.get("efa")) or bool(fact.get("fi_info_efa"))


def hcas(fact: dict, link_layer: str) -> list[str]:
    return [
        str(d["name"])
        for d in fact.get("ib") or []
        if isinstance(d, dict) and d.get("link_layer") == link_layer
    ]


def auto_profile(fact: dict) -> str:
    """efa > ib > roce > ethernet on CUDA nodes; hpu on Gaudi; cpu otherwise."""
    kind = fact.get("kind", "cpu")
    if kind == "hpu":
        return "hpu"
    if kind != "cuda":
        return "cpu"
    if has_efa(fact):
        return "efa"
    if hcas(fact, "InfiniBand"):
        return "ib"
    if hcas(fact, "Ethernet"):
        return "roce"
    return "ethernet"


def check_profile_fits(profile: str, fact: dict) -> None:
    host = hostname(fact)
    if profile not in PROFILES:
        raise ProfileError(
            f"{host}: unknown NCCL profile {profile!r}; use one of auto, {', '.join(PROFILES)}"
        )
    if profile == "efa" and not has_efa(fact):
        raise ProfileError(
            f"{host}: profile efa forced but this node has no EFA device "
            "(/sys/class/infiniband/*, fi_info -p efa); drop the override or fix the EFA install"
        )
    if profile == "ib" and not hcas(fact, "InfiniBand"):
        raise ProfileError(
            f"{host}: profile ib forced but this node has no InfiniBand HCA "
            f"(found: {fact.get('ib') or 'none'})"
        )
    if profile == "roce" and not hcas(fact, "Ethernet"):
        raise ProfileError(
            f"{host}: profile roce forced but this node has no HCA with link_layer Ethernet "
            f"(found: {fact.get('ib') or 'none'})"
        )
    if profile == "hpu" and fact.get("kind") != "hpu":
        raise ProfileError(
            f"{host}: profile hpu forced but this node's accelerators are "
            f"{fact.get('kind', 'cpu')!r}, not Gaudi"
        )


def find_ofi_nccl(dirs: tuple[str, ...] | list[str]) -> str | None:
    """The first directory holding the aws-ofi-nccl plugin library, if any."""
    for d in dirs:
        if any(os.path.isfile(os.path.join(d, lib)) for lib in OFI_NCCL_LIBS):
            return d
    return None


# ---- the profiles ----


def profile_env(
    profile: str,
    fact: dict,
    socket_spec: str,
    interfaces: list[str],
    ofi_nccl_dir: str | None = None,
) -> dict[str, str]:
    # gloo is used by torch for CPU collectives and by DeepSpeed; it takes exact names [TORCH].
    env = {"GLOO_SOCKET_IFNAME": ",".join(interfaces)}
    if profile == "cpu":
        return env
    if profile == "hpu":
        # HCCL's bootstrap/socket interface [HL-ENV]; same filter syntax as NCCL.
        env["HCCL_SOCKET_IFNAME"] = socket_spec
        if has_efa(fact):
            # Host-NIC scale-out over libfabric's EFA provider, with Gaudi Direct [HL-OFI].
            env.update(
                {
                    "HCCL_OVER_OFI": "1",
                    "FI_PROVIDER": "efa",
                    "FI_EFA_USE_DEVICE_RDMA": "1",
                    "RDMAV_FORK_SAFE": "1",
                }
            )
        return env
    # NCCL's bootstrap and socket transport interface [NCCL-ENV].
    env["NCCL_SOCKET_IFNAME"] = socket_spec
    if profile == "efa":
        # libfabric's EFA provider through the aws-ofi-nccl net plugin; RDMA read/write on
        # the device; fork-safe verbs [AWS-NCCL] [SM-EFA]. No NCCL_IB_* here: the net plugin,
        # not NCCL's IB transport, drives EFA, and the docs set none.
        env.update({"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "RDMAV_FORK_SAFE": "1"})
        if ofi_nccl_dir:
            # NCCL loads libnccl-net.so from the library path [NCCL-ENV, NCCL_NET_PLUGIN];
            # AWS puts the plugin and libfabric on LD_LIBRARY_PATH [AWS-NCCL].
            efa_libs = [d for d in EFA_LIB_DIRS if os.path.isdir(d)]
            env["LD_LIBRARY_PATH"] = ":".join([ofi_nccl_dir, *efa_libs])
        return env
    if profile in ("ib", "roce"):
        layer = "InfiniBand" if profile == "ib" else "Ethernet"
        env["NCCL_IB_DISABLE"] = "0"
        # '=' makes the HCA names exact (mlx5_1 must not also select mlx5_10) [NCCL-ENV].
        env["NCCL_IB_HCA"] = "=" + ",".join(hcas(fact, layer))
        if profile == "roce":
            # RoCE v2 GID index (NCCL_IB_GID_INDEX, "used in RoCE mode") [NCCL-ENV].
            env["NCCL_IB_GID_INDEX"] = "3"
        return env
    # ethernet: no IB verbs transport, NCCL's socket transport only [NCCL-ENV].
    env["NCCL_IB_DISABLE"] = "1"
    return env


def check_overrides(overrides: object, fact: dict) -> dict:
    host = hostname(fact)
    if overrides is None:
        return {}
    if not isinstance(overrides, dict):
        raise ProfileError(f"{host}: NCCL overrides must be a mapping, got {overrides!r}")
    unknown = sorted(set(overrides) - {"socket_ifname", "profile", "env"})
    if unknown:
        raise ProfileError(
            f"{host}: unknown NCCL override key(s) {', '.join(unknown)}; "
            "use socket_ifname, profile, env"
        )
    env = overrides.get("env") or {}
    if not isinstance(env, dict):
        raise ProfileError(f"{host}: NCCL override env must be a mapping, got {env!r}")
    for key, value in env.items():
        if not ENV_KEY_RE.match(str(key)):
            raise ProfileError(f"{host}: NCCL override env key {key!r} is not a variable name")
        if value is not None and (not isinstance(value, (str, int)) or "\n" in str(value)):
            raise ProfileError(
                f"{host}: NCCL override env {key}={value!r} must be a one-line string "
                "(or null to drop the key)"
            )
    return overrides


def build_profile(
    fact: dict,
    overrides: dict | None = None,
    ofi_nccl_dirs: tuple[str, ...] | list[str] = OFI_NCCL_DIRS,
) -> dict:
    """The profile for this node: {"profile", "env", "nccl_conf", "socket_ifname", "interfaces"}.

    overrides: {"profile": one of PROFILES or "auto", "socket_ifname": an NCCL_SOCKET_IFNAME
    spec, "env": {KEY: VALUE or None}}; env entries are applied last, None drops a key.
    """
    overrides = check_overrides(overrides, fact)
    wanted = overrides.get("profile") or "auto"
    profile = auto_profile(fact) if wanted == "auto" else str(wanted)
    check_profile_fits(profile, fact)
    spec = overrides.get("socket_ifname") or default_interface(fact)
    variable = "HCCL_SOCKET_IFNAME" if profile == "hpu" else "NCCL_SOCKET_IFNAME"
    interfaces = check_ifname(str(spec), fact, variable)
    ofi_dir = find_ofi_nccl(ofi_nccl_dirs) if profile == "efa" else None
    env = profile_env(profile, fact, str(spec), interfaces, ofi_dir)
    for key, value in (overrides.get("env") or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[str(key)] = str(value)
    return {
        "profile": profile,
        "env": env,
        "nccl_conf": {k: v for k, v in env.items() if k.startswith("NCCL_")},
        "socket_ifname": str(spec),
        "interfaces": interfaces,
    }


# ---- CLI ----


def node_state(fact: dict, overrides: object, ofi_dirs: tuple[str, ...]) -> dict:
    """The profile, or why there is none (build_profile checks its socket interface as
    check-ifname does)."""
    state: dict = {"profile": None, "error": None}
    try:
        state["profile"] = build_profile(fact, overrides, ofi_dirs)  # type: ignore[arg-type]
    except ProfileError as exc:
        state["error"] = str(exc)
    return state


def conf_text(profile: dict, fact_path: str) -> str:
    """/etc/nccl.conf for a profile: NCCL reads KEY=VALUE lines, so NCCL_* only, sorted as
    Jinja's dictsort sorts (ignoring case), with a header naming the fact with the rest."""
    lines = [
        f"# Managed by dscluster (nccl_env): profile {profile['profile']}. NCCL_* only;",
        f"# the full environment is in {fact_path}.",
    ]
    for key, value in sorted(profile["nccl_conf"].items(), key=lambda kv: kv[0].lower()):
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def fact_text(profile: dict, conf_path: str) -> str:
    """The nccl_env local fact (facts.d/nccl_env.fact): the profile, its environment, the
    socket interface and what it selects, and where nccl.conf is; JSON as to_nice_json."""
    fact = {
        "profile": profile["profile"],
        "env": profile["env"],
        "socket_ifname": profile["socket_ifname"],
        "interfaces": profile["interfaces"],
        "nccl_conf": conf_path,
    }
    return json.dumps(fact, indent=4, sort_keys=True, separators=(",", ": ")) + "\n"


def named(message: str, node: str) -> str:
    """A profile error as the role reports it: prefixed with the inventory name unless the
    message (which names the node as its fact does) already starts with it."""
    return message if not node or message.startswith(node + ":") else f"{node}: {message}"


def read_fact(path: str) -> dict:
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path) as fh:
                text = fh.read()
        fact = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ProfileError(f"cannot read the accelerators fact {path}: {exc}") from exc
    if not isinstance(fact, dict):
        raise ProfileError(f"the accelerators fact {path} is not a JSON object")
    return fact


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prof = sub.add_parser("profile", help="print this node's NCCL/HCCL/gloo profile as JSON")
    state = sub.add_parser("state", help="the profile and its interfaces, or why not, as JSON")
    for cmd in (prof, state):
        cmd.add_argument("--fact", required=True, help="accelerators fact JSON file, - for stdin")
        cmd.add_argument("--overrides", default="", help="JSON: socket_ifname, profile, env")
        cmd.add_argument(
            "--ofi-nccl-dir",
            action="append",
            default=[],
            help="where to look for the aws-ofi-nccl plugin (repeatable; default: EFA installer's)",
        )
    chk = sub.add_parser("check-ifname", help="check an NCCL_SOCKET_IFNAME value on this node")
    chk.add_argument("spec")
    chk.add_argument("--fact", required=True, help="accelerators fact JSON file, - for stdin")
    args = parser.parse_args(argv)
    try:
        fact = read_fact(args.fact)
        if args.command == "check-ifname":
            print(" ".join(check_ifname(args.spec, fact)))
            return 0
        try:
            overrides = json.loads(args.overrides) if args.overrides.strip() else None
        except ValueError as exc:
            raise ProfileError(f"{hostname(fact)}: --overrides is not JSON ({exc})") from exc
        ofi_dirs = tuple(args.ofi_nccl_dir) or OFI_NCCL_DIRS
        if args.command == "state":
            result = node_state(fact, overrides, ofi_dirs)
        else:
            result = build_profile(fact, overrides, ofi_dirs)
    except ProfileError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
