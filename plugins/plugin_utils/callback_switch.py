# Copyright: dscluster maintainers
# Apache-2.0
"""The opt-in the collection's callbacks share (jinja_cache, facts_memo).

Each patches private ansible-core internals, in the controller's main process, where its
switch (an environment variable) is 1 or unset and ansible-core is a version it was written
against; 0 leaves ansible as it is, and any other value warns and leaves it off.

The callbacks load this file by its path in their own tree: found through callback_plugins
they are no collection package, and the name ansible_collections.dscluster.cluster may hold
another installed version, or none.
"""

from __future__ import annotations

import os

from ansible.plugins.callback import CallbackBase
from ansible.release import __version__

SUPPORTED = ("2.19.",)


class SwitchedCallback(CallbackBase):
    """A callback that a switch turns on; each sets CALLBACK_NAME and patches in __init__
    after opted_in()."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NEEDS_ENABLED = True

    def opted_in(self, variable: str) -> bool:
        """Whether switch `variable` turns this callback on here, saying why not where it
        does not."""
        name = self.CALLBACK_NAME.rsplit(".", 1)[-1]
        switch = os.environ.get(variable) or "1"
        if switch == "0":
            return False
        if switch != "1":  # dscluster refuses it before any run; a plain run stays as ansible is
            self._display.warning(f"{variable}={switch!r} is neither 1 nor 0; {name} is off")
            return False
        if not __version__.startswith(SUPPORTED):
            self._display.vvv(f"{name}: not for ansible-core {__version__}; off")
            return False
        return True
