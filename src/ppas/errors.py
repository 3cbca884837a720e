"""One error type for bad user input: the CLI turns it into one line and exit code 2."""


class PpasError(ValueError):
    """Bad input: a config string, a trace file, a name or a number. The message is one
    line that names the problem and, where there is a closed set, the allowed values."""
