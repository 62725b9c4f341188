"""A shuffler's address as gRPC takes it, checked when a sender is made.

``host:port`` (a name, an IPv4 address or ``[IPv6]``), optionally behind gRPC's
``dns:///``, ``ipv4:`` or ``ipv6:`` schemes, or ``unix:PATH``. A URL
(``http://host:port``) or a missing port would otherwise look like a shuffler that
is never reachable.
"""

from __future__ import annotations

__all__ = ["check_target"]

_GRPC_SCHEMES = ("dns:///", "dns:", "ipv4:", "ipv6:")


def check_target(target: object) -> str:
    """``target`` if it is a gRPC target with a port; ``ValueError`` naming what is wrong."""
    if not isinstance(target, str) or not target.strip():
        raise ValueError(
            f"target must be 'host:port', e.g. 'shuffler.example:7400', got {target!r}"
        )
    if target.startswith("unix:"):
        return target
    if "://" in target and not target.startswith("dns:///"):
        raise ValueError(
            f"target {target!r}: a shuffler's address is 'host:port' without a scheme "
            "(TLS is chosen with tls=True, plaintext with tls=False)"
        )
    rest = target
    for scheme in _GRPC_SCHEMES:
        if rest.startswith(scheme):
            rest = rest[len(scheme) :]
            break
    host, sep, port = rest.rpartition(":")
    if rest.endswith("]"):
        host, sep = "", ""
    if not sep or not host or (":" in host and not host.startswith("[")):
        if ":" in rest and not rest.startswith("["):
            raise ValueError(f"target {target!r}: an IPv6 address goes in brackets: '[::1]:7400'")
        raise ValueError(f"target {target!r} has no port: write 'host:port', e.g. '{rest}:7400'")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"target {target!r}: port {port!r} is not a port number (1 to 65535)")
    return target
