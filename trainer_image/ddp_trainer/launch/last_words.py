"""Why a worker of a user's script failed, read from the torchrun output the node wrapper relays:
the exception line that ends the first Python traceback a worker printed in a torchrun start.

The bundled trainer writes its own termination message (:mod:`ddp_trainer.launch.exits`); a
script of the user's does not, and torchrun knows only its exit code (its ``ChildFailedError``
says "To enable traceback see ..." unless the script used torch's ``@record``). Its traceback
is in the log all the same: after ``Traceback (most recent call last):`` come the frames
(indented), then one unindented line, ``module.Kind: message``. The first worker's exception is
kept, as the worker's own message is (the first failure is the cause; a peer's broken
collective that follows is a consequence), and torchrun's own ``ChildFailedError`` is never
taken for it. Each worker line carries torchrun's ``[rankN]:`` prefix, so tracebacks of
several local ranks, interleaved line by line, are read apart.

A script that does not compile prints no ``Traceback`` line: Python writes where (``File
"/scripts/train.py", line 3``), the line and a caret, then ``SyntaxError: invalid syntax``.
That location starts a traceback too, and a SyntaxError (IndentationError, TabError) is said
with where it points, as Python's own ``str()`` of it does: ``SyntaxError: invalid syntax
(/scripts/train.py, line 3)``. Pure: fed lines, no I/O."""

from __future__ import annotations

import re

from ddp_api.contract import SYNTAX_ERRORS

_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:\s?")
_TRACEBACK = "Traceback (most recent call last):"
_NOT_THE_CAUSE = ("ChildFailedError",)  # torchrun's summary of a failed worker
# Where a SyntaxError points: a frame's location has ", in <function>" after the line number.
_AT = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)$')
_KIND = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*\.)*(?P<kind>[A-Za-z_][A-Za-z0-9_]*)(?::\s?|$)")


def exception_line(text: str) -> str | None:
    """``Kind: message`` from the line that ends a traceback (its module path dropped); None
    for a line that is no exception's."""
    found = _KIND.match(text)
    if not found or not found["kind"][:1].isupper():
        return None
    rest = text[found.end() :].strip()
    return f"{found['kind']}: {rest}" if rest else found["kind"]


class LastWords:
    """Fed the lines of a torchrun start's output; :attr:`said` is the first worker
    exception's ``Kind: message`` ("" while none ended)."""

    def __init__(self) -> None:
        self.said = ""
        self._in_traceback: dict[str, bool] = {}  # by rank prefix ("" without one)
        self._at: dict[str, str] = {}  # the last "file, line N" a SyntaxError may point to

    def feed(self, line: bytes) -> None:
        if self.said:
            return
        text = line.decode("utf-8", "replace").rstrip("\r\n")
        prefix = _PREFIX.match(text)
        who = prefix.group(1) if prefix else ""
        text = text[prefix.end() :] if prefix else text
        if text.startswith(_TRACEBACK):
            self._in_traceback[who] = True
            self._at[who] = ""
            return
        at = _AT.match(text)
        if at:  # in a traceback, or the start of a script's own SyntaxError
            self._in_traceback[who] = True
            self._at[who] = f"{at['file']}, line {at['line']}"
            return
        if not self._in_traceback.get(who) or not text.strip() or text[:1] in (" ", "\t"):
            return  # outside a traceback, or one of its frames
        self._in_traceback[who] = False
        said = exception_line(text)
        if said is None or said.startswith(_NOT_THE_CAUSE):
            return
        if said.split(":", 1)[0] in SYNTAX_ERRORS and self._at.get(who):
            said = f"{said} ({self._at[who]})"
        self.said = said
