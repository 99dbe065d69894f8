"""Calls a gRPC method knowing nothing but the server's reflection service.

A client that is not ours: Python grpcio, no proto files, no generated
code. Usage: reflect_call.py HOST:PORT package.Service/Method '{"json": 1}'
Prints one JSON object per response message (one for unary, many for a
server stream); exits 1 with `CODE: message` on a gRPC error.
"""

import json
import sys

import grpc
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)


def main() -> int:
    address, full_method, body = sys.argv[1], sys.argv[2], sys.argv[3]
    service_name, method_name = full_method.split("/")
    channel = grpc.insecure_channel(address)
    pool = DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
    service = pool.FindServiceByName(service_name)
    method = service.FindMethodByName(method_name)
    request_cls = message_factory.GetMessageClass(method.input_type)
    response_cls = message_factory.GetMessageClass(method.output_type)
    request = json_format.Parse(body, request_cls())
    path = f"/{service_name}/{method_name}"
    serialize = request_cls.SerializeToString
    deserialize = response_cls.FromString
    try:
        if method.server_streaming:
            call = channel.unary_stream(path, serialize, deserialize)
            responses = call(request, timeout=600)
        else:
            call = channel.unary_unary(path, serialize, deserialize)
            responses = [call(request, timeout=600)]
        for r in responses:
            print(json.dumps(json_format.MessageToDict(r)), flush=True)
    except grpc.RpcError as e:
        print(f"{e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
