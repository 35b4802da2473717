"""Text from elsewhere made safe to print: a case name from a bundle, a backend's exception message, a
file name. Any of them can hold terminal escapes (ESC [ ... that recolour, move the cursor or retitle
the window), carriage returns that overwrite a line already printed, or bidirectional overrides that
reorder what is shown: printable() writes every such character as its Python escape (\\x1b, \\r,
\\u202e), so what reaches the terminal is what was there.
"""

from __future__ import annotations

_LAYOUT = "\n\t"  # the characters a block of lines keeps
_WITHOUT_LAYOUT = str.maketrans("", "", _LAYOUT)


def printable(text: str, lines: bool = True) -> str:
    """`text` with each character that is not printable (control characters, format characters such as
    the bidirectional overrides, line and paragraph separators) written as its escape; newlines and
    tabs kept when `lines`, escaped too otherwise (one line)."""
    plain = text.translate(_WITHOUT_LAYOUT) if lines else text
    if plain.isprintable():
        return text
    return "".join(ch if ch.isprintable() or (lines and ch in _LAYOUT) else _escape(ch) for ch in text)


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    """'\\r' of a carriage return, '\\x1b' of ESC, '\\u202e' of RIGHT-TO-LEFT OVERRIDE."""
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
