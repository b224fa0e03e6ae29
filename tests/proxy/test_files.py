"""The Files API (SPEC §4, §5.2, §7.2) over real sockets: the official openai SDK -> the gateway under
uvicorn -> fake OpenAI accounts that parse the multipart upload and keep the files they hold."""

import hashlib
import json

import httpx
import openai
import pytest

from devkit.behaviours import rate_limited, unavailable
from pools.models import Assignment
from proxy.ledger.models import Attempt, RequestRecord
from routing.models import Affinity
from tests.factories import GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import AUTH, TIMEOUT, attempt_statuses, ledger_settled, record_of, wait_for

OTHER_KEY = "sk-gw-e2e-files-other-key-5555"
DATA = b'{"prompt": "a"}\n' * 4096  # 64 KiB of JSONL


def sdk(gateway: str, key: str = GATEWAY_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key=key, max_retries=0, timeout=15)


def _upload(gateway: str, data: bytes = DATA, key: str = GATEWAY_KEY):
    with sdk(gateway, key) as client:
        return client.files.with_raw_response.create(file=("train.jsonl", data), purpose="user_data")


def test_the_openai_sdk_uploads_retrieves_reads_and_deletes_a_file(gateway, two_assignments):
    a, b, (acct_a, _) = two_assignments
    raw = _upload(gateway)
    created = raw.parse()
    assert (created.object, created.bytes, created.filename, created.purpose) == (
        "file",
        len(DATA),
        "train.jsonl",
        "user_data",
    )
    assert raw.headers["x-gateway-attempts"] == "1"
    # The first eligible account of the plan holds it, byte for byte.
    assert list(a.files) == [created.id] and b.files == {}
    assert a.files[created.id].sha256 == hashlib.sha256(DATA).hexdigest()
    affinity = wait_for(lambda: Affinity.objects.filter(kind="file", key=created.id).first(), what="affinity")
    assert (affinity.assignment_id, affinity.gateway_key.name) == (acct_a.pk, "e2e")

    with sdk(gateway) as client:
        assert client.files.retrieve(created.id).model_dump() == created.model_dump()
        assert client.files.content(created.id).read() == DATA
        ledger_settled()  # SQLite's shared-cache test database: no two writers at once
        deleted = client.files.delete(created.id)
        assert (deleted.id, deleted.deleted) == (created.id, True)
        assert a.files == {}
        ledger_settled()
        assert not Affinity.objects.filter(kind="file").exists()  # the file is gone: so is its pin
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(created.id)
    assert b.hit_count() == 0


def test_an_upload_fails_over_before_the_client_sees_anything_and_replays_the_whole_body(
    gateway, two_assignments
):
    a, b, (_, acct_b) = two_assignments
    a.script_files(rate_limited())  # answered after reading the whole upload, as a server does
    raw = _upload(gateway)
    created = raw.parse()
    assert raw.headers["x-gateway-attempts"] == "2"
    assert a.files == {} and list(b.files) == [created.id]
    assert b.files[created.id].sha256 == hashlib.sha256(DATA).hexdigest()
    record = record_of(raw)
    assert (record.route, record.outcome, record.requested_model) == ("/v1/files", "ok", "")
    assert attempt_statuses(record) == ["retryable_failed", "succeeded"]
    affinity = wait_for(lambda: Affinity.objects.filter(kind="file").first(), what="affinity")
    assert affinity.assignment_id == acct_b.pk
    # Later operations go to b, which holds it, never to a.
    with sdk(gateway) as client:
        assert client.files.content(created.id).read() == DATA
    assert a.hit_count(path=f"/v1/files/{created.id}/content") == 0


def test_file_operations_go_only_to_the_owning_assignment(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script_files(unavailable(503))
    created = _upload(gateway).parse()  # held by b
    b.script_files(unavailable(503))  # b is down now: GET, content and DELETE are not handed to a
    for call in ("retrieve", "content", "delete"):
        with sdk(gateway) as client, pytest.raises(openai.InternalServerError) as failed:
            getattr(client.files, call)(created.id)
        assert failed.value.status_code == 503
    assert a.hit_count(path=f"/v1/files/{created.id}") == 0
    assert a.hit_count(path=f"/v1/files/{created.id}/content") == 0
    assert len(b.files) == 1


def _other_key(pools) -> None:
    GatewayKeyFactory(name="other", raw_key=OTHER_KEY, pools=pools)


def test_another_keys_file_is_answered_exactly_like_an_unknown_one(gateway, two_assignments):
    a, b, (acct_a, _) = two_assignments
    _other_key([acct_a.pool])  # the same pool, even: the file is key 1's
    created = _upload(gateway).parse()
    hits = a.hit_count()
    answers = []
    for file_id in (created.id, "file-" + "0" * 24):
        for method, suffix in (("GET", ""), ("GET", "/content"), ("DELETE", "")):
            response = httpx.request(
                method,
                f"{gateway}/v1/files/{file_id}{suffix}",
                headers={"authorization": f"Bearer {OTHER_KEY}"},
                timeout=TIMEOUT,
            )
            answers.append((method, suffix, response.status_code, response.json()))
    assert answers[:3] == answers[3:]
    assert {status for _, _, status, _ in answers} == {404}
    assert answers[0][3]["error"]["code"] == "file_not_found"
    assert a.hit_count() == hits and b.hit_count() == 0  # nothing reached any account
    assert list(a.files) == [created.id]  # and the owner's file is untouched
    with sdk(gateway, OTHER_KEY) as client, pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.id)


def test_a_file_whose_assignment_left_the_pool_is_a_conflict(gateway, two_assignments):
    a, b, (acct_a, _) = two_assignments
    created = _upload(gateway).parse()
    ledger_settled()  # SQLite's shared-cache test database: no two writers at once
    Assignment.objects.filter(pk=acct_a.pk).update(pool=PoolFactory(name="elsewhere"))
    response = httpx.get(f"{gateway}/v1/files/{created.id}", headers=AUTH, timeout=TIMEOUT)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "file_assignment_conflict"
    assert (a.hit_count(), b.hit_count()) == (1, 0)  # only the upload: never the other account


def _multipart(size: int) -> tuple[bytes, str]:
    boundary = "gateway-test-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nuser_data\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="x.bin"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    return (
        head + b"x" * size + f"\r\n--{boundary}--\r\n".encode(),
        f"multipart/form-data; boundary={boundary}",
    )


def test_an_upload_over_the_limit_is_refused_before_or_while_it_is_read(gateway, two_assignments, settings):
    a, b, _ = two_assignments
    settings.GATEWAY_MAX_UPLOAD_BYTES = 100_000
    body, content_type = _multipart(200_000)
    declared = httpx.post(
        f"{gateway}/v1/files", content=body, headers={**AUTH, "content-type": content_type}, timeout=TIMEOUT
    )
    assert declared.status_code == 413
    assert declared.json()["error"]["code"] == "request_too_large"

    def chunks():
        for start in range(0, len(body), 16_384):
            yield body[start : start + 16_384]

    streamed = httpx.post(  # chunked: no content-length to refuse it by
        f"{gateway}/v1/files",
        content=chunks(),
        headers={**AUTH, "content-type": content_type},
        timeout=TIMEOUT,
    )
    assert streamed.status_code == 413
    assert streamed.json()["error"]["code"] == "request_too_large"
    assert a.files == {} and b.files == {}
    assert a.hit_count() <= 1 and b.hit_count() == 0  # at most the one cut-off attempt, never a replay
    ledger_settled()
    assert set(RequestRecord.objects.values_list("outcome", flat=True)) == {"request_too_large"}


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({}, 401, "authentication_error"),
        ({**AUTH, "content-type": "application/json"}, 400, "invalid_request"),
    ],
    ids=["no-key", "not-multipart"],
)
def test_a_bad_upload_is_a_typed_error_and_reaches_no_upstream(
    gateway, two_assignments, headers, status, code
):
    a, b, _ = two_assignments
    response = httpx.post(f"{gateway}/v1/files", content=b"{}" * 1000, headers=headers, timeout=TIMEOUT)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert a.hit_count() == 0 and b.hit_count() == 0


def test_file_ledger_rows_hold_no_file_name_id_or_content(gateway, two_assignments, caplog):
    caplog.set_level("INFO", logger="gateway")
    with sdk(gateway) as client:
        created = client.files.create(
            file=("canary-name-8812.jsonl", b"canary-file-content-31337\n"), purpose="batch"
        )
        client.files.retrieve(created.id)
        client.files.content(created.id).read()
        client.files.delete(created.id)
    ledger_settled()
    rows = wait_for(lambda: list(RequestRecord.objects.all()) if RequestRecord.objects.count() >= 4 else None)
    assert sorted(r.route for r in rows) == [
        "/v1/files",
        "/v1/files/{id}",
        "/v1/files/{id}/content",
        "DELETE /v1/files/{id}",
    ]
    assert {(r.outcome, r.status_code) for r in rows} == {("ok", 200)}
    assert all(r.attempts.get().status == "succeeded" for r in rows)
    dumped = json.dumps(
        [list(RequestRecord.objects.values()), list(Attempt.objects.values()), caplog.text], default=str
    )
    assert caplog.text.count('"route": "/v1/files') == 3  # the log was seen, one line per request
    for secret in ("canary-file-content", "canary-name-8812", created.id):
        assert secret not in dumped


def test_a_gateway_bug_during_an_upload_is_the_apis_typed_500(gateway, two_assignments, monkeypatch, caplog):
    from proxy import files

    async def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(files, "_relay", broken)
    body, content_type = _multipart(10)
    response = httpx.post(
        f"{gateway}/v1/files", content=body, headers={**AUTH, "content-type": content_type}, timeout=TIMEOUT
    )
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert "files: the upload failed" in caplog.text
