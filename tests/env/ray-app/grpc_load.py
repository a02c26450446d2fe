"""Open-loop gRPC load for the real-Ray test: calls /rayshift.test.Versioned/Version at RATE per second through
ADDRESS (host:port) until SIGTERM, then waits for the calls in flight (one still open 5 s after its deadline is
cancelled and reported). One JSON line per call on stdout: `sent` (Unix seconds), `latency` (seconds), and
`version` or `error`. No retries: a failure shows.

    python grpc_load.py ADDRESS RATE TIMEOUT_SECONDS
"""
import asyncio
import json
import signal
import sys
import time

import grpc
from google.protobuf import empty_pb2, wrappers_pb2


async def one(call, timeout):
    sent, began = time.time(), time.monotonic()
    try:
        reply = await call(empty_pb2.Empty(), timeout=timeout)
        out = {"version": reply.value}
    except grpc.aio.AioRpcError as e:
        out = {"error": f"{e.code().name}: {e.details()}"}
    except asyncio.CancelledError:
        # Still open well past its deadline when the load stopped: a failure that shows, not a test that hangs.
        out = {"error": "NEVER_ENDED: still open 5 s after its deadline"}
    out.update(sent=sent, latency=time.monotonic() - began)
    print(json.dumps(out), flush=True)


async def main(address, rate, timeout):
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(
            "/rayshift.test.Versioned/Version",
            request_serializer=empty_pb2.Empty.SerializeToString,
            response_deserializer=wrappers_pb2.StringValue.FromString,
        )
        calls, start, n = set(), time.monotonic(), 0
        while not stop.is_set():
            n += 1
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, start + n / rate - time.monotonic()))
            except asyncio.TimeoutError:
                task = asyncio.create_task(one(call, timeout))
                calls.add(task)
                task.add_done_callback(calls.discard)
        if calls:
            _, late = await asyncio.wait(set(calls), timeout=timeout + 5)
            for task in late:
                task.cancel()
            await asyncio.gather(*late)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3])))
