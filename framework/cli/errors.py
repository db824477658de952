"""The one error type of the command line: a user error reported in one line, exit status 2."""


class CLIError(Exception):
    """A user error the CLI reports in one line (exit status 2), never with a traceback."""
