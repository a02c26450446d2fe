"""gRPC for the versioned app, without generated code: the service `rayshift.test.Versioned` has one method,
`Version(google.protobuf.Empty) returns (google.protobuf.StringValue)`. Ray Serve's gRPC proxy takes this
function from `grpc_options.grpc_servicer_functions` and sends each call to the deployment method `Version`.
"""
import grpc
from google.protobuf import empty_pb2, wrappers_pb2

SERVICE = "rayshift.test.Versioned"


def add_VersionedServicer_to_server(servicer, server):
    handlers = {
        "Version": grpc.unary_unary_rpc_method_handler(
            servicer.Version,
            request_deserializer=empty_pb2.Empty.FromString,
            response_serializer=wrappers_pb2.StringValue.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
