"""The one error type of port mapping (NAT-PMP, UPnP IGD, and the HTTP under UPnP)."""

from __future__ import annotations


class MappingError(Exception):
    """A gateway that did not give us a mapping: `code` for programs, `reason` for people.

    Codes: ``no-gateway`` (nobody answers there), ``timeout``, ``bad-reply``
    (malformed or hostile input: wrong sizes, fields, XML with a DTD, ...),
    ``too-large``, ``gateway-refused`` (a well-formed refusal: a NAT-PMP
    result code or a UPnP SOAP fault), ``no-external-address``.
    """

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason
