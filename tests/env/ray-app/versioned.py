"""A tiny Serve application whose response names its version (v1, v2, ...), for the real-Ray tests.

A version ending in `-failing` answers every HTTP request with 500 and its version as the body: the new version
an SLO check must stop."""
from ray import serve


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Versioned:
    def __init__(self, version: str):
        self.version = version

    async def __call__(self, request):
        if self.version.endswith("-failing"):
            from starlette.responses import PlainTextResponse

            return PlainTextResponse(self.version, status_code=500)
        return self.version

    async def Version(self, request):
        """The gRPC method (see versioned_grpc.py): the same answer as a protobuf StringValue."""
        from google.protobuf import wrappers_pb2

        return wrappers_pb2.StringValue(value=self.version)


def build(args: dict):
    """Application builder: `import_path: versioned:build` with `args: {version: v2}`."""
    return Versioned.bind(args.get("version", "v1"))
