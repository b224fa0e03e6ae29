"""Where an assignment's `base_url` may point (SPEC §9, §11): never at link-local or cloud-metadata
addresses, never with userinfo or a query.

Checked twice: when a `base_url` is written (admin, YAML: `base_url_problem`) and again at dispatch,
after name resolution (`address_forbidden` on every address a name resolves to, in the upstream
clients' resolvers: `proxy.upstream`, `proxy.upstream_ws`, `catalog.services`), so a name that later
resolves to a metadata address (DNS rebinding, a changed record) is refused with nothing sent.

Loopback and private networks stay allowed: self-hosted upstreams and the demo live there, and only
superusers set a `base_url`.
"""

import asyncio
import ipaddress
import socket
import string
import unicodedata
from urllib.parse import urlsplit

# Names of metadata services that resolve only inside their cloud (so a resolver check alone would
# not see them from elsewhere) and must never be a destination anyway.
FORBIDDEN_HOSTS = frozenset(
    {
        "metadata.google.internal",
        "metadata.goog",
        "metadata",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.azure.internal",
        "metadata.platformequinix.com",
    }
)
# Metadata addresses outside the link-local ranges.
FORBIDDEN_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure wire server
    )
)


class ForbiddenDestination(OSError):
    """A dispatch refused because the upstream's host is, or resolves to, a forbidden address. An
    OSError, so the HTTP clients report it as a failure to connect: nothing was sent."""


def address_forbidden(address: str) -> bool:
    """Link-local (169.254.0.0/16, fe80::/10, incl. every cloud's 169.254.169.254), a metadata
    address, unspecified or multicast; an IPv4 address mapped into IPv6 is judged as IPv4."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return True
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_link_local or ip.is_unspecified or ip.is_multicast or ip in FORBIDDEN_ADDRESSES


# The dots IDNA reads as a full stop besides ".", after NFKC (which maps the full-width one to ".").
_DOTS = str.maketrans({"\u3002": ".", "\uff61": "."})


def _ipv4_number(part: str) -> int | None:
    """One part of an IPv4 address as inet_aton reads it: decimal, 0x hexadecimal or 0 octal."""
    if part.startswith("0x"):
        base, digits, rest = 16, string.hexdigits, part[2:]
    elif part.startswith("0") and len(part) > 1:
        base, digits, rest = 8, string.octdigits, part[1:]
    else:
        base, digits, rest = 10, string.digits, part
    if (not rest and base != 16) or any(c not in digits for c in rest):
        return None
    return int(rest or "0", base)


def _ipv4(name: str) -> ipaddress.IPv4Address | None:
    """`name` read as inet_aton and the URL standard read a host of numbers (`2852039166`,
    `0251.0376.0251.0376`, `0xa9fea9fe`, `169.254.43518`): the address, or None for a name."""
    parts = name.split(".")
    numbers = [_ipv4_number(part) for part in parts]
    if not 1 <= len(parts) <= 4 or any(n is None for n in numbers):
        return None
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(parts)):
        return None
    return ipaddress.IPv4Address(sum(n << (8 * (3 - i)) for i, n in enumerate(head)) + last)


def _folded(host: str) -> str:
    return unicodedata.normalize("NFKC", host).translate(_DOTS).strip("[]").rstrip(".").lower()


def canonical_host(host: str) -> str:
    """The one normalisation of a host both checks use (when a `base_url` is written and at dispatch):
    full-width and other compatibility characters folded (NFKC), IDNA's other full stops read as
    dots, lower case, no brackets or trailing dot, and an address of numbers spelled in any base read as
    the address it names (`2852039166` is `169.254.169.254`)."""
    name = _folded(host)
    ipv4 = _ipv4(name)
    return name if ipv4 is None else str(ipv4)


def host_forbidden(host: str) -> bool:
    """A host name or address literal (in any spelling `canonical_host` reads) that is refused before
    any resolution."""
    name = canonical_host(host)
    if name in FORBIDDEN_HOSTS:
        return True
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    return address_forbidden(name)


def base_url_problem(url: str) -> str | None:
    """Why `url` cannot be a `base_url`, in words fit for an admin form or a YAML error; None if it can."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        return "must be an http(s) URL"
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        return "must be an http(s) URL"
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        # Credentials are stored encrypted or named by api_key_env; in a URL they would be in plaintext.
        return "must not contain credentials (use api_key_env)"
    if parts.query or parts.fragment or url.rstrip().endswith(("?", "#")):
        return "must not have a query or fragment"
    if host_forbidden(parts.hostname):
        return "must not point at a link-local or cloud-metadata address"
    if _ipv4(_folded(parts.hostname)) is not None and canonical_host(parts.hostname) != parts.hostname:
        # `2852039166`, `0x7f.1`, full-width digits: the HTTP client connects to none of them.
        return "must spell its host plainly (an IPv4 address as four decimal numbers)"
    return None


def _allowed(host: str, infos: list) -> list[str]:
    addresses = [info[4][0] for info in infos]
    if not addresses or any(address_forbidden(a) for a in addresses):
        raise ForbiddenDestination(f"{host} resolves to a forbidden address")
    return addresses


async def resolve_allowed(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to, all of them allowed, or ForbiddenDestination (an OSError, like
    a failed resolution)."""
    if host_forbidden(host):
        raise ForbiddenDestination(f"{host} is a forbidden destination")
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return _allowed(host, infos)


def resolve_allowed_sync(host: str, port: int) -> list[str]:
    if host_forbidden(host):
        raise ForbiddenDestination(f"{host} is a forbidden destination")
    return _allowed(host, socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
