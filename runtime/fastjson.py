"""JSON on the request path: orjson, where the standard library's encoder and decoder were about 7 % of
the event loop's time at c=50 (bench/profile.md): the upstream's answer read, the body sent upstream
and the ledger's journal line. (The request's log line keeps the standard library's spacing, which
operators' log queries may match.)

`dumps` gives compact UTF-8 bytes, as `json.dumps(value, ensure_ascii=False, separators=(",", ":"))`
encoded would, and falls back to exactly that for what orjson refuses (an integer beyond 64 bits, a key
that is not a string); a string with a lone surrogate fails either way (it has no UTF-8). orjson
writes a NaN or an infinity as null where the standard library (allow_nan=False) refused it: what is
encoded here comes from JSON already read, which holds none (proxy.ingress.decode_json). Unlike the
standard library, orjson writes U+2028, U+2029 and U+0085 unescaped: text holding its lines must split
them on "\n" alone, not `str.splitlines`. `loads` refuses NaN and Infinity, numbers that overflow a
double and lone surrogates, and reads an integer beyond 64 bits as a float: a client's body, whose
numbers are relayed, is read by the standard library (proxy.ingress.decode_json).
"""

import json

import orjson

loads = orjson.loads  # bytes or str; an invalid document raises orjson.JSONDecodeError, a ValueError


def dumps(value: object) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
