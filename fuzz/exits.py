"""How a command ends, for every front end of the command line: its exit code, and one line instead of a traceback.

    0    nothing new found
    1    a finding: a new failure, or a regression on replay
    2    bad usage or bad input, said in one line that names the option or the file and the fix
    130  stopped by Ctrl-C (SIGINT), 143 by SIGTERM: 128 + the signal, as a shell reports it
    141  its output was closed early (`attnfuzz backends | head -1`): 128 + SIGPIPE, quietly, since 1 means a finding
"""

from __future__ import annotations

import os
import select
import signal
import sys
from typing import Callable

from attnfuzz.engine import interrupt
from attnfuzz.store.corpus import CorpusError
from attnfuzz.store.paths import PathError

USAGE = 2
CLOSED_OUTPUT = 128 + signal.SIGPIPE


class UsageError(Exception):
    """Bad usage: the message names the option and the fix (exit 2)."""


def run(command: str, body: Callable[[], int]) -> int:
    """`body()`'s exit code, or the code and the one line that end it otherwise (the module docstring)."""
    try:
        with interrupt.interruptible():  # SIGINT / SIGTERM end the command as an interruption, not a crash
            return body()
    except interrupt.Interrupted as e:
        print(f"attnfuzz {command}: {e}", file=sys.stderr)
        return e.exit_code
    except (UsageError, PathError, CorpusError) as e:  # a corpus file that cannot be read would drop its known bug
        print(f"attnfuzz: {e}", file=sys.stderr)
        return USAGE
    except BrokenPipeError:
        if not closed_output():
            raise  # a pipe of attnfuzz's own (a worker's), not the output: an error to see
        return CLOSED_OUTPUT


def closed_output() -> bool:
    """Whether stdout or stderr is a pipe whose reader has gone; each that is is pointed at /dev/null, so that
    Python's flush at exit does not fail on it again (the note on SIGPIPE in Python's `signal` docs)."""
    closed = False
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            gone = any(events & select.POLLERR for _, events in poller.poll(0))  # a pipe without a reader
        except (OSError, ValueError, AttributeError):  # closed, or a stream without a file descriptor
            continue
        if gone:
            closed = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
    return closed
