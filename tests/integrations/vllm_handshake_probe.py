"""Run in the vLLM venv by test_vllm_headless.py: vLLM's own engine-core side of the data-parallel handshake
(`EngineCoreProc.startup_handshake`, over real ZMQ sockets on 127.0.0.1) reads an init message sent as a stock
front end sends it and as a front end with the plug-in sends it (handshake.py); prints what it read as JSON.
"""

from __future__ import annotations

import json
import threading

import msgspec
import zmq
from vllm.config import ParallelConfig
from vllm.v1.engine import utils as engine_utils
from vllm.v1.engine.core import EngineCoreProc

from specverify.integrations.vllm import handshake

ADDRESSES = {"inputs": ["tcp://127.0.0.1:1"], "outputs": ["tcp://127.0.0.1:2"]}


def _exchange(metadata: type) -> tuple[ParallelConfig, dict]:
    """A front end's ROUTER answers an engine core's HELLO with `metadata`(addresses, {"data_parallel_size": 2})
    -> (the ParallelConfig vLLM's engine-core side updated from it, the addresses it read)."""
    context = zmq.Context()
    front, core = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    core.setsockopt(zmq.IDENTITY, (1).to_bytes(2, "little"))
    core.connect(f"tcp://127.0.0.1:{front.bind_to_random_port('tcp://127.0.0.1')}")
    config, read = ParallelConfig(), {}
    reader = threading.Thread(
        target=lambda: read.update(vars(EngineCoreProc.startup_handshake(core, False, True, config)))
    )
    reader.start()
    identity, _hello = front.recv_multipart()
    message = metadata(
        addresses=engine_utils.EngineZmqAddresses(**ADDRESSES), parallel_config={"data_parallel_size": 2}
    )
    front.send_multipart((identity, msgspec.msgpack.encode(message)))
    reader.join(timeout=60)
    context.destroy(linger=0)
    return config, read


def _verdict(config: ParallelConfig) -> str:
    try:
        handshake.check_engine_core(config)
    except handshake.EngineCoreWithoutPlugin as refusal:
        return f"refused: {refusal}"
    return "accepted"


def main() -> None:
    stock_config, stock_read = _exchange(engine_utils.EngineHandshakeMetadata)
    marked_config, marked_read = _exchange(handshake._marked(engine_utils.EngineHandshakeMetadata))
    result = {
        "stock": {"mark": getattr(stock_config, handshake.MARK, None), "verdict": _verdict(stock_config)},
        "marked": {"mark": getattr(marked_config, handshake.MARK, None), "verdict": _verdict(marked_config)},
        "same_addresses": stock_read == marked_read and stock_read["inputs"] == ADDRESSES["inputs"],
        "same_size": stock_config.data_parallel_size == marked_config.data_parallel_size == 2,
    }
    handshake.mark_front_end(engine_utils)  # this process now runs the plug-in
    result["marked"]["verdict_with_plugin"] = _verdict(marked_config)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
