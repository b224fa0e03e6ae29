"""OpenAI's Files API on a fake upstream: `POST /v1/files` (multipart with `purpose` and `file`),
`GET /v1/files/{id}`, `GET /v1/files/{id}/content` and `DELETE /v1/files/{id}`.

An upload is parsed as a stream and kept on disk (never whole in memory), answered with a file object;
an id this account does not hold gets OpenAI's 404 (`invalid_request_error`, param `id`), and so does a
request that references a `file-...` id it does not hold (`_missing_file`, for the API routes).
`script_files(...)` scripts these requests (an upload's body is read before a scripted rejection, as a
server does).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import BodyPartReader, web

from devkit.behaviours import (
    BAD_KEY,
    ApiError,
    Behaviour,
    Hang,
    JsonObject,
    RawError,
    Reject,
    Serve,
    missing_parameter,
    no_such_file,
    serve,
)
from devkit.server import FakeServer, drop, openai_failure
from devkit.wire import new_id

FILE_PURPOSES = frozenset({"assistants", "batch", "fine-tune", "vision", "user_data", "evals"})
FILES_SCRIPT = "(files)"  # the script key of Files API requests (they name no model)


@dataclass(frozen=True)
class StoredFile:
    """A file an account holds: its object's fields, the SHA-256 of its bytes and where they are."""

    id: str
    filename: str
    purpose: str
    bytes: int
    sha256: str
    created_at: int
    path: Path

    def object(self) -> JsonObject:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": None,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


class FilesApi(FakeServer):
    """A fake server that holds an account's files and serves the Files API (`_add_file_routes`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._files: dict[str, StoredFile] = {}
        self._file_dir: Path | None = None

    def stop(self) -> None:
        super().stop()
        if self._file_dir is not None:
            shutil.rmtree(self._file_dir, ignore_errors=True)
            self._file_dir = None

    def _add_file_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/files", self._handle_file_upload)
        app.router.add_get("/v1/files/{file_id}", self._handle_file)
        app.router.add_delete("/v1/files/{file_id}", self._handle_file)
        app.router.add_get("/v1/files/{file_id}/content", self._handle_file_content)

    def script_files(self, first: Behaviour, *then: Behaviour) -> None:
        """Answer the next Files API requests with these behaviours (`Serve`: as the API would)."""
        self.script(FILES_SCRIPT, first, *then)

    @property
    def files(self) -> dict[str, StoredFile]:
        with self._lock:
            return dict(self._files)

    def _files_behaviour(self) -> Behaviour:
        with self._lock:
            script = self._scripts.get(FILES_SCRIPT)
            if script:
                return script.pop(0) if len(script) > 1 else script[0]
        return serve()

    async def _files_scripted(self, request: web.Request, behaviour: Behaviour) -> web.StreamResponse | None:
        """A scripted Files answer other than Serve, once the request's body has been read."""
        match behaviour:
            case Serve():
                return None
            case Reject(status=status, error=err):
                return openai_failure(status, err)
            case RawError(status=status, body=body):
                return web.json_response(dict(body), status=status)
            case Hang(seconds=seconds):
                await self._pause(seconds)
        return drop(request)

    async def _handle_file_upload(self, request: web.Request) -> web.StreamResponse:
        self._record(request, None, None, "http")
        if not self._authorized(request):
            return openai_failure(401, BAD_KEY)
        behaviour = self._files_behaviour()
        if not request.content_type.startswith("multipart/"):
            await request.read()
            return openai_failure(400, missing_parameter("file"))
        if self._file_dir is None:
            self._file_dir = Path(tempfile.mkdtemp(prefix=f"fake-{self.name}-files-"))
        file_id = new_id("file-")
        path = self._file_dir / file_id
        purpose: str | None = None
        filename: str | None = None
        size = 0
        digest = hashlib.sha256()
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                continue  # a nested multipart: not part of the Files API
            if part.name == "purpose":
                purpose = await part.text()
            elif part.name == "file":
                filename = part.filename or "upload"
                with path.open("wb") as out:  # streamed to disk, a chunk at a time
                    while chunk := await part.read_chunk(1 << 16):
                        size += len(chunk)
                        digest.update(chunk)
                        out.write(chunk)
            else:
                await part.release()
        scripted = await self._files_scripted(request, behaviour)
        if scripted is not None or filename is None or purpose is None or purpose not in FILE_PURPOSES:
            path.unlink(missing_ok=True)
        if scripted is not None:
            return scripted
        if filename is None:
            return openai_failure(400, missing_parameter("file"))
        if purpose is None:
            return openai_failure(400, missing_parameter("purpose"))
        if purpose not in FILE_PURPOSES:
            invalid = ApiError(
                "invalid_request_error", f"Invalid value for purpose: '{purpose}'.", None, "purpose"
            )
            return openai_failure(400, invalid)
        stored = StoredFile(file_id, filename, purpose, size, digest.hexdigest(), int(time.time()), path)
        with self._lock:
            self._files[file_id] = stored
        return web.json_response(stored.object())

    def _stored(self, request: web.Request) -> StoredFile | None:
        with self._lock:
            return self._files.get(request.match_info["file_id"])

    async def _handle_file(self, request: web.Request) -> web.StreamResponse:
        """GET (the file object) and DELETE /v1/files/{id}."""
        self._record(request, None, None, "http")
        if not self._authorized(request):
            return openai_failure(401, BAD_KEY)
        scripted = await self._files_scripted(request, self._files_behaviour())
        if scripted is not None:
            return scripted
        stored = self._stored(request)
        if stored is None:
            return openai_failure(404, no_such_file(request.match_info["file_id"]))
        if request.method == "DELETE":
            with self._lock:
                self._files.pop(stored.id, None)
            stored.path.unlink(missing_ok=True)
            return web.json_response({"id": stored.id, "object": "file", "deleted": True})
        return web.json_response(stored.object())

    async def _handle_file_content(self, request: web.Request) -> web.StreamResponse:
        self._record(request, None, None, "http")
        if not self._authorized(request):
            return openai_failure(401, BAD_KEY)
        scripted = await self._files_scripted(request, self._files_behaviour())
        if scripted is not None:
            return scripted
        stored = self._stored(request)
        if stored is None:
            return openai_failure(404, no_such_file(request.match_info["file_id"]))
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = stored.bytes
        await response.prepare(request)
        with stored.path.open("rb") as source:
            while chunk := source.read(1 << 16):
                await response.write(chunk)
        await response.write_eof()
        return response

    def _missing_file(self, body: JsonObject) -> str | None:
        """A `file-...` id the body references that this account does not hold (OpenAI's ids: another
        account's file does not exist here)."""
        pending: list[object] = [body]
        while pending:
            item = pending.pop()
            if isinstance(item, dict):
                file_id = item.get("file_id")
                if isinstance(file_id, str) and file_id.startswith("file-") and file_id not in self.files:
                    return file_id
                pending.extend(item.values())
            elif isinstance(item, list):
                pending.extend(item)
        return None
