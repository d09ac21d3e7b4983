"""The one exception type of dscluster: a message a user can act on, printed as one line."""


class DsclusterError(Exception):
    """A problem the user can fix; the message names it and says what to do."""
