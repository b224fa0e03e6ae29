"""AWS Signature Version 4 over an httpx request as it will be sent, by botocore's signer (never by hand):
the proxy's upstream calls and the catalog's signed model listings (Bedrock's control plane) share it."""

import httpx
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from proxy.providers.base import SigV4

# The headers a SigV4 signature covers: what no proxy between here and AWS rewrites.
_SIGNED_HEADERS = ("host", "content-type")


def sign(request: httpx.Request, sigv4: SigV4) -> None:
    """Add SigV4's headers to `request`, computed over its final URL, those headers and its body bytes."""
    aws = AWSRequest(
        method=request.method,
        url=str(request.url),
        headers={name: request.headers[name] for name in _SIGNED_HEADERS if name in request.headers},
        data=request.content,
    )
    credentials = Credentials(sigv4.access_key_id, sigv4.secret_access_key, sigv4.session_token or None)
    SigV4Auth(credentials, sigv4.service, sigv4.region).add_auth(aws)
    for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
        if name in aws.headers:
            request.headers[name] = aws.headers[name]
