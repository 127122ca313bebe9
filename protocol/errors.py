"""The one error type for bytes that came from outside.

Every decoder in locomesh turns bad input into a `ProtocolError` with a reason a
person can read, and a short machine-readable `code` that services count and
charge to the sender's reputation. Nothing else may escape a decoder: a
`KeyError` or `UnicodeDecodeError` leaking out of a parser is a bug.
"""

from __future__ import annotations


class ProtocolError(ValueError):
    """Input that does not follow the wire protocol.

    `code` is a stable identifier (``"bad-signature"``, ``"too-large"``, ...);
    `str(error)` is the human explanation.
    """

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason
