"""AWS Signature Version 4 over a request as it will be sent, by botocore's signer (never by hand): the
proxy's upstream calls and the catalog's signed model listings (Bedrock's control plane) share it."""

from collections.abc import Mapping

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from proxy.wire.providers.base import SigV4

# The headers a SigV4 signature covers: what no proxy between here and AWS rewrites (the host, when
# not given, is the URL's, as the client sends it).
_SIGNED_HEADERS = ("host", "content-type")


def sign(method: str, url: str, headers: Mapping[str, str], body: bytes, sigv4: SigV4) -> dict[str, str]:
    """SigV4's headers for a request, computed over its final URL, those of its headers and its body."""
    wanted = {name.lower(): value for name, value in headers.items() if name.lower() in _SIGNED_HEADERS}
    aws = AWSRequest(method=method, url=url, headers=wanted, data=body)
    credentials = Credentials(sigv4.access_key_id, sigv4.secret_access_key, sigv4.session_token or None)
    SigV4Auth(credentials, sigv4.service, sigv4.region).add_auth(aws)
    return {
        name: aws.headers[name]
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token")
        if name in aws.headers
    }
