"""Where the command line's text meets the terminal: everything printed passes `terminal_safe`.

`main()` runs every command with stdout and stderr wrapped (`safe_console`), so an app's message, a Flink
exception or a Git error printed by any command (or logged by `run`) shows its escape sequences, carriage
returns and bidi overrides as escapes (`\\u001b[2J`) instead of obeying them. The two writers whose escapes are
their own (the plan's colours, the progress line's erase) write through `write_styled` and make the user parts
of their text safe themselves. One wrapper at the edge, as the HTTP server redacts every text answer: a print
added later cannot forget it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO, cast

from reconciler.terminal import terminal_safe


class SafeStream:
    """A text stream that writes `terminal_safe(text)` to the one it wraps (newlines kept: it cannot tell a
    table from a stack trace; one-line fields are made one line where they are printed)."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(terminal_safe(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return self.inner.isatty()

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, errors, ... of the wrapped stream
        return getattr(self.inner, name)


def write_styled(out: TextIO, text: str) -> None:
    """Write `text` as is, past a `SafeStream`: for text whose escapes are ours and whose other parts the caller
    made safe (`render.to_text(color=True)`, the progress line)."""
    (out.inner if isinstance(out, SafeStream) else out).write(text)


def show_plan(text: str, *, color: bool) -> None:
    """Print `render.to_text(plan, color=color)`: coloured text, made safe by render, as is; plain text escaped
    here like everything else."""
    if color:
        write_styled(sys.stdout, text)
    else:
        sys.stdout.write(text)


@contextmanager
def safe_console() -> Iterator[None]:
    """Wrap sys.stdout and sys.stderr in a `SafeStream` for the duration (restored after)."""
    out, err = sys.stdout, sys.stderr
    if not isinstance(out, SafeStream):
        sys.stdout = cast(TextIO, SafeStream(out))
    if not isinstance(err, SafeStream):
        sys.stderr = cast(TextIO, SafeStream(err))
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
