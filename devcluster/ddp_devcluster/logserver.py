"""The test kubelet's read-only HTTPS API: ``GET /containerLogs/{namespace}/{pod}/{container}``,
what the API server calls for ``kubectl logs`` (pods/log); podlogs.py decides what to send.

One server per node, all on one port, each on its node's address. Responses are chunked and
the connection closes after each; ``follow`` streams until that run of the container ends,
the client goes away or the kubelet stops.
"""

from __future__ import annotations

import errno
import logging
import select
import socketserver
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from . import podlogs
from .podlogs import LogRequestError

log = logging.getLogger("ddp_devcluster.kubelet")

POLL_S = 0.1  # how often a follow looks for new lines


@dataclass
class ContainerLog:
    """One run's log file, and whether that run still runs (a follow waits while it does)."""

    path: Path
    running: Callable[[], bool]


# (node, namespace, pod, container, previous) -> the log, or LogRequestError
Locate = Callable[[str, str, str, str, bool], ContainerLog]


class _NodeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, node: str, address: tuple[str, int], tls: ssl.SSLContext, owner: LogServer
    ) -> None:
        self.node, self.tls, self.owner = node, tls, owner
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer's own looks its address up in DNS, which may hang where there is none.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.node, self.server_address[1]

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake happens here, in the request's thread, so a slow client cannot
        # hold up accepting others.
        request.settimeout(30)
        try:
            conn = self.tls.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError) as e:
            log.debug(
                "log server on %s: TLS handshake with %s failed: %s", self.node, client_address, e
            )
            return
        try:
            super().finish_request(conn, client_address)
        finally:
            conn.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _NodeServer

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        parts = url.path.split("/")
        if len(parts) != 5 or parts[1] != "containerLogs":
            self._error(404, "404 page not found")
            return
        ns, pod, container = (unquote(p) for p in parts[2:])
        try:
            query = podlogs.parse_query(parse_qs(url.query, keep_blank_values=True))
            where = self.server.owner.locate(self.server.node, ns, pod, container, query.previous)
            reader = podlogs.LogReader(where.path)
        except LogRequestError as e:
            self._error(e.status, e.message)
            return
        except OSError as e:
            self._error(500, f"cannot read the log of {ns}/{pod}/{container}: {e}")
            return
        try:
            self._stream(query, where, reader)
        except (OSError, ssl.SSLError) as e:
            log.debug("log stream of %s/%s/%s ended: %s", ns, pod, container, e)
        finally:
            reader.close()

    def _stream(
        self, query: podlogs.LogQuery, where: ContainerLog, reader: podlogs.LogReader
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        out = podlogs.Renderer(query.timestamps, query.since_ns(time.time_ns()), query.limit_bytes)
        running = where.running()
        records = reader.new_records() + ([] if running else reader.rest())
        self._send(reader, out, podlogs.tail(records, query.tail_lines))
        stopping = self.server.owner.stopping
        while query.follow and running and not out.done:
            if stopping.wait(POLL_S) or self._client_gone():
                break
            running = where.running()
            # a run that ended has written all its times: what is left has none
            self._send(reader, out, reader.new_records() + ([] if running else reader.rest()))
        self.wfile.write(b"0\r\n\r\n")

    def _send(
        self, reader: podlogs.LogReader, out: podlogs.Renderer, records: list[podlogs.Record]
    ) -> None:
        data = b"".join(out.render(r, reader.read(r)) for r in records)
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def _client_gone(self) -> bool:
        """Whether the client closed the connection (it sends nothing after its request)."""
        conn = self.connection
        if not select.select([conn], [], [], 0)[0]:
            return False
        timeout = conn.gettimeout()
        conn.settimeout(0)
        try:
            return not conn.recv(1)
        except (ssl.SSLWantReadError, BlockingIOError):
            return False
        except OSError:
            return True
        finally:
            conn.settimeout(timeout)

    def _error(self, status: int, message: str) -> None:
        body = message.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def do_HEAD(self) -> None:
        self._error(405, "method not allowed")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("log server on %s: %s", self.server.node, format % args)


class LogServer:
    """Serves ``/containerLogs`` for ``nodes`` (name -> address) on one free port."""

    def __init__(
        self, nodes: dict[str, str], tls: ssl.SSLContext, locate: Locate, tries: int = 20
    ) -> None:
        self.locate = locate
        self.stopping = threading.Event()
        self.servers: list[_NodeServer] = []
        self.port = 0
        self.started = False
        for _ in range(tries):
            try:
                self._bind(nodes, tls)
                break
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
                self._close()
        else:
            raise RuntimeError(f"no port free on all of {sorted(nodes.values())}")

    def _bind(self, nodes: dict[str, str], tls: ssl.SSLContext) -> None:
        # The first node's server picks a free port; the others take the same one.
        for node, address in nodes.items():
            server = _NodeServer(node, (address, self.port), tls, self)
            self.servers.append(server)
            self.port = server.server_address[1]

    def _close(self) -> None:
        for s in self.servers:
            s.server_close()
        self.servers.clear()
        self.port = 0

    def start(self) -> LogServer:
        self.started = True
        for s in self.servers:
            threading.Thread(
                target=s.serve_forever, args=(0.2,), name=f"logs-{s.node}", daemon=True
            ).start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self.started:  # shutdown() waits for serve_forever to notice
            for s in self.servers:
                s.shutdown()
        self._close()


def tls_context(cert_file: Path, key_file: Path, client_ca_pem: str | None) -> ssl.SSLContext:
    """TLS for the log server: its serving pair, and when ``client_ca_pem`` is given only
    clients with a certificate from that CA (the API server) get in."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert_file), str(key_file))
    ctx.set_alpn_protocols(["http/1.1"])
    if client_ca_pem is not None:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=client_ca_pem)
    return ctx
