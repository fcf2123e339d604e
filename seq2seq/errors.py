"""The one exception type the CLI turns into a one-line message and a non-zero exit."""


class Seq2SeqError(Exception):
    """A user-facing error: bad input, bad data, a broken run directory.

    Raised anywhere in the library with a message that already says what is wrong
    and, where possible, what to do; ``seq2seq.commands.cli.main`` prints it as one line and
    exits with status 2. Programming errors stay ordinary exceptions.
    """
