# Copyright: dscluster maintainers
# Apache-2.0
"""Share compiled Jinja templates between the worker processes of one playbook run.

ansible-core 2.19 compiles every template and conditional afresh in every forked worker (one
fork per task and host), and keeps no compiled form: on a 3-node re-converge about 5,500
compiles of fewer than 500 distinct templates, about half of the workers' CPU time. With this
callback enabled, a worker that compiles a template writes the code object into a directory
made for this run (keyed by the template's text and every compile setting), and the workers
after it load it instead of parsing and generating Python again. The directory is removed when
the run ends; nothing is kept between runs (a filter's calling convention, read at compile
time, could differ with another collection set). The directory's name carries the run's pid:
a run killed before it could remove its own (SIGKILL) leaves one behind, and the next run
removes those whose process is gone.

It patches ansible-core's private template environment, so it applies only to the versions it
was written against (2.19); on others, or with DSCLUSTER_JINJA_CACHE=0, it does nothing.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import marshal
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

# This tree's plugin_utils, by path (callback_switch.py's docstring says why).
_SWITCH = importlib.util.spec_from_file_location(
    "dscluster_callback_switch", Path(__file__).parents[1] / "plugin_utils" / "callback_switch.py"
)
callback_switch = importlib.util.module_from_spec(_SWITCH)
_SWITCH.loader.exec_module(callback_switch)

DOCUMENTATION = r"""
name: jinja_cache
type: aggregate
short_description: share compiled Jinja templates between the workers of one run
description:
  - Compiled templates and conditionals are written to a directory made for the run and loaded
    by later workers instead of being compiled again; the directory is removed at the end.
  - Applies to ansible-core 2.19 only; set C(DSCLUSTER_JINJA_CACHE=0) to turn it off.
requirements:
  - enable in configuration (callbacks_enabled)
"""

_INSTALLED: dict[str, str] = {}
PREFIX = "dscluster-jinja-"
_OWNED = re.compile(re.escape(PREFIX) + r"(\d+)-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process, or no right to ask: not ours to judge
        return True
    return True


def sweep(parent: str) -> list[str]:
    """Remove this user's run directories in `parent` whose run's process is gone (a run
    killed before its exit hook); returns their names."""
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        owned = _OWNED.match(entry.name)
        if owned is None or _alive(int(owned.group(1))):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.name)
    return removed


class _CodeCache:
    """Code objects by key: this process's own, then the run's directory."""

    def __init__(self, cache_dir: str, fields: tuple[str, ...], compile_context) -> None:
        self.dir = cache_dir
        self.fields = fields
        self.compile_context = compile_context
        self.memo: dict[str, object] = {}

    def key(self, env, kind: str, source: str, extra: object) -> str:
        ctx = self.compile_context.current(optional=True)
        settings = (
            tuple(getattr(env, name) for name in self.fields),
            bool(ctx and ctx.escape_backslashes),
            env.optimized,
            tuple(sorted(env.extensions)),
            type(env).__qualname__,
            extra,
        )
        text = repr((kind, str(source), settings))
        return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()

    def load(self, key: str):
        code = self.memo.get(key)
        if code is None:
            try:
                with open(os.path.join(self.dir, key), "rb") as handle:
                    code = marshal.load(handle)
            except (OSError, EOFError, ValueError, TypeError):
                return None
            self.memo[key] = code
        return code

    def store(self, key: str, code) -> None:
        self.memo[key] = code
        try:
            fd, part = tempfile.mkstemp(dir=self.dir, prefix=".part-")
            with os.fdopen(fd, "wb") as handle:
                marshal.dump(code, handle)
            os.replace(part, os.path.join(self.dir, key))  # whole or absent for other workers
        except (OSError, ValueError):
            pass


def _internals():
    """ansible-core's template environment class, its override field names and compile context,
    and Jinja's TemplateExpression; None where any of them is not there."""
    try:
        from ansible._internal._templating import _jinja_bits as bits  # noqa: PLC0415
        from jinja2.environment import TemplateExpression  # noqa: PLC0415
    except ImportError:
        return None
    found = tuple(
        getattr(bits, name, None)
        for name in (
            "AnsibleEnvironment",
            "_TEMPLATE_OVERRIDE_FIELD_NAMES",
            "_TemplateCompileContext",
        )
    )
    return None if None in found else (*found, TemplateExpression)


def _compile_patch(plain_compile, cache: _CodeCache, capture: threading.local):
    def compile_(self, source, name=None, filename=None, raw=False, defer_init=False):
        # only the anonymous compiles of from_string (templates, conditionals, template files
        # read by a lookup); named ones (include/import) go through Jinja's loader as before
        if (
            not isinstance(source, str)
            or name
            or filename
            or raw
            or self._debuggable_template_source
        ):
            code = plain_compile(self, source, name, filename, raw, defer_init)
            made = getattr(capture, "made", None)
            if made is not None and not isinstance(source, str):
                made.append(code)
            return code
        key = cache.key(self, "template", source, defer_init)
        code = cache.load(key)
        if code is None:
            code = plain_compile(self, source, name, filename, raw, defer_init)
            cache.store(key, code)
        return code

    return compile_


def _expression_patch(plain_expression, cache: _CodeCache, capture: threading.local, expression):
    def compile_expression(self, source, undefined_to_none=True):
        if not isinstance(source, str) or self._debuggable_template_source:
            return plain_expression(self, source, undefined_to_none)
        key = cache.key(self, "expression", source, None)
        code = cache.load(key)
        if code is not None:
            template = self.template_class.from_code(self, code, self.make_globals(None), None)
            return expression(template, undefined_to_none)
        # compile_expression parses, then compiles the node tree: keep what that compile made
        outer, capture.made = getattr(capture, "made", None), []
        try:
            result = plain_expression(self, source, undefined_to_none)
            made = capture.made
        finally:
            capture.made = outer
        if len(made) == 1:
            cache.store(key, made[0])
        return result

    return compile_expression


def install(cache_dir: str) -> bool:
    """Patch the template environment of this process (and the workers it forks) to keep
    compiled code in cache_dir. Returns False, changing nothing, where the internals it relies
    on are not there."""
    if _INSTALLED:
        return True
    internals = _internals()
    if internals is None:
        return False
    env_class, fields, compile_context, expression = internals
    cache = _CodeCache(cache_dir, fields, compile_context)
    capture = threading.local()  # the code a compile_expression's inner compile made
    env_class.compile = _compile_patch(env_class.compile, cache, capture)
    env_class.compile_expression = _expression_patch(
        env_class.compile_expression, cache, capture, expression
    )
    _INSTALLED["dir"] = cache_dir
    return True


class CallbackModule(callback_switch.SwitchedCallback):
    CALLBACK_NAME = "dscluster.cluster.jinja_cache"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Callbacks load in the controller's main process before any worker forks.
        if _INSTALLED or not self.opted_in("DSCLUSTER_JINJA_CACHE"):
            return
        owner = os.getpid()
        for name in sweep(tempfile.gettempdir()):
            self._display.vvv(f"jinja_cache: removed {name}, left by a run that is gone")
        cache_dir = tempfile.mkdtemp(prefix=f"{PREFIX}{owner}-")

        def remove() -> None:
            if os.getpid() == owner:
                shutil.rmtree(cache_dir, ignore_errors=True)

        atexit.register(remove)
        if not install(cache_dir):
            remove()
            self._display.vvv("jinja_cache: template internals not found; off")
            return
        self._display.vvv(f"jinja_cache: compiled templates shared in {cache_dir}")
