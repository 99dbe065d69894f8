"""A trace receiver for the tests: OTLP in (gRPC, and HTTP/protobuf at
`POST /v1/traces`), spans as JSON out.

Keeps every span it receives in memory. Binds 127.0.0.1 on free ports and
prints them as one line on stdout, `grpc=PORT http=PORT ingest=PORT`
(`ingest` takes OTLP/HTTP). With `--tls CERT KEY` both OTLP ports serve
TLS with that certificate; with `--client-ca CA` they also require a client
certificate signed by CA (mutual TLS). Query with
`GET /spans` or `GET /spans?trace_id=HEX`: a JSON list of spans, each with
`trace_id`, `span_id`, `parent_span_id` (empty for a root), `name`,
`service` (the resource's `service.name`), `attributes`, `links` and start
and end times in ns. Exits when stdin closes, so it never outlives the test
that started it, even a killed one.
"""

import argparse
import json
import ssl
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import grpc
from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)
from opentelemetry.proto.common.v1 import common_pb2

SPANS: list[dict] = []
LOCK = threading.Lock()


def plain(value: common_pb2.AnyValue):
    """An attribute value as JSON: the one field that is set."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [plain(v) for v in value.array_value.values]
    if kind == "bytes_value":
        return value.bytes_value.hex()
    if kind in (None, "kvlist_value"):
        return str(value)
    return getattr(value, kind)


def attributes(pairs) -> dict:
    return {a.key: plain(a.value) for a in pairs}


def keep(request) -> None:
    """Stores the spans of an ExportTraceServiceRequest."""
    received = []
    for resource_spans in request.resource_spans:
        service = attributes(resource_spans.resource.attributes).get("service.name")
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                received.append(
                    {
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "name": s.name,
                        "service": service,
                        "attributes": attributes(s.attributes),
                        "links": [
                            {"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex()}
                            for link in s.links
                        ],
                        "start_ns": s.start_time_unix_nano,
                        "end_ns": s.end_time_unix_nano,
                    }
                )
    with LOCK:
        SPANS.extend(received)


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        keep(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class Query(BaseHTTPRequestHandler):
    def do_GET(self):
        url = urlparse(self.path)
        if url.path != "/spans":
            self.send_error(404)
            return
        trace_id = parse_qs(url.query).get("trace_id", [None])[0]
        with LOCK:
            found = [s for s in SPANS if trace_id in (None, s["trace_id"])]
        body = json.dumps(found).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        # One line per poll would bury the test's own output.
        pass


class Ingest(BaseHTTPRequestHandler):
    """OTLP/HTTP with protobuf bodies."""

    def do_POST(self):
        if urlparse(self.path).path != "/v1/traces":
            self.send_error(404)
            return
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        keep(request)
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format, *args):
        pass


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    parser.add_argument("--client-ca")
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
    ingest = ThreadingHTTPServer(("127.0.0.1", 0), Ingest)
    if args.tls:
        cert, key = (open(f, "rb").read() for f in args.tls)
        ca = open(args.client_ca, "rb").read() if args.client_ca else None
        credentials = grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
        )
        grpc_port = server.add_secure_port("127.0.0.1:0", credentials)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*args.tls)
        if args.client_ca:
            context.load_verify_locations(args.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        ingest.socket = context.wrap_socket(ingest.socket, server_side=True)
    else:
        grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    threading.Thread(target=ingest.serve_forever, daemon=True).start()
    query = ThreadingHTTPServer(("127.0.0.1", 0), Query)
    threading.Thread(target=query.serve_forever, daemon=True).start()
    print(
        f"grpc={grpc_port} http={query.server_address[1]} ingest={ingest.server_address[1]}",
        flush=True,
    )
    sys.stdin.read()
    server.stop(grace=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
