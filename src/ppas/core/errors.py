"""One error type for bad user input: the CLI turns it into one line and exit code 2."""


class PpasError(ValueError):
    """Bad input: a config string, a trace file, a name or a number. The message is one
    line that names the problem and, where there is a closed set, the allowed values."""


#: Exit code of a run that finished but completed no request (every request failed, or the
#: trace had none): ``ppas bench``, ``simulate`` and ``sweep``. Bad input is 2; an
#: interrupted bench 130 (SIGINT) or 143 (SIGTERM).
NO_SUCCESS = 1
