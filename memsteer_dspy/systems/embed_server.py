"""A local OpenAI-compatible ``/v1/embeddings`` endpoint backed by a packaged embedder.

Memory packages that take their embedder as a URL (MemPalace's ``openai-compat`` model, Mem0's
``openai`` embedder with a base URL) are pointed at this server, so they embed with the same
packaged, offline model our dense designs use (MiniLM by default) and never download one.
In-process, 127.0.0.1, a free port; ``requests`` counts the calls, ``texts`` the inputs embedded.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class EmbeddingServer:
    """``with EmbeddingServer(embedder) as s: s.api_base`` — serves ``embedder.encode``."""

    def __init__(self, embedder: Any, *, model: str = "minilm"):
        self.embedder = embedder
        self.model = model
        self.requests = 0
        self.texts = 0
        self._lock = threading.Lock()  # one encode at a time: the model is not re-entrant on CPU
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def api_base(self) -> str:
        assert self._httpd is not None, "the server is not running: use it as a context manager"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def embed(self, texts: list[str]) -> list[list[float]]:
        with self._lock:
            self.requests += 1
            self.texts += len(texts)
            return [list(map(float, v)) for v in self.embedder.encode(list(texts))]

    def __enter__(self) -> EmbeddingServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._send(
                    200, {"object": "list", "data": [{"id": server.model, "object": "model"}]}
                )

            def do_POST(self) -> None:  # noqa: N802
                if not self.path.rstrip("/").endswith("/embeddings"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                texts = body.get("input", [])
                texts = [texts] if isinstance(texts, str) else list(texts)
                vectors = server.embed(texts)
                self._send(
                    200,
                    {
                        "object": "list",
                        "model": server.model,
                        "data": [
                            {"object": "embedding", "index": i, "embedding": v}
                            for i, v in enumerate(vectors)
                        ],
                        "usage": {"prompt_tokens": 0, "total_tokens": 0},
                    },
                )

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
