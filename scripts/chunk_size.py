"""How the chunk size of a big model's peer frames was chosen (privnet/agent/wire/chunks.py):
for a few chunk sizes, the sealed encode + reassembly of a model (per byte), and a model's
publish round trip through mosquitto (one publisher, one subscriber, QoS 0).

    flock /work/notes/cpu.lock python scripts/chunk_size.py [--params 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import gmqtt
import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from privnet.agent.messages import Model
from privnet.agent.wire import chunks
from privnet.broker.launcher import BrokerAddress, accepts, free_port

SIZES = (16_320, 32_640, 65_280, 130_560, 261_120, 1_044_480)  # multiples of 8


def codec(dim: int, size: int, repeats: int) -> tuple[float, float]:
    """Median seconds to seal a model into chunks of `size`, and to take them back."""
    chunks.CHUNK_BYTES, chunks.MAX_PEER_BYTES = size, size + 4096
    aead = ChaCha20Poly1305(bytes(32))
    w = np.random.default_rng(0).standard_normal(dim)
    seal, take = [], []
    for r in range(repeats):
        t0 = time.perf_counter()
        frames = chunks.seal_chunks(Model(1, 2, r + 1, 1, w, 0), aead, "run")
        t1 = time.perf_counter()
        into = chunks.Reassembler("run", 2, dim)
        for f in frames:
            got = into.take(chunks.read_chunk(f), aead, None)
        t2 = time.perf_counter()
        assert got is not None and np.array_equal(got.vector, w)
        seal.append(t1 - t0)
        take.append(t2 - t1)
    return statistics.median(seal), statistics.median(take)


async def round_trip(address: BrokerAddress, payloads: list[bytes], repeats: int) -> float:
    """Median seconds from the first publish of a model's frames to the last delivery."""
    done, count = asyncio.Event(), [0]

    def on_message(*_: object) -> int:
        count[0] += 1
        if count[0] == len(payloads):
            done.set()
        return 0

    sub, pub = gmqtt.Client("chunk-sub"), gmqtt.Client("chunk-pub")
    sub.on_message = on_message
    await sub.connect(address.host, address.port)
    sub.subscribe("chunk/t", qos=0)
    await pub.connect(address.host, address.port)
    await asyncio.sleep(0.3)
    times = []
    for _ in range(repeats):
        count[0] = 0
        done.clear()
        t0 = time.perf_counter()
        for p in payloads:
            pub.publish("chunk/t", p, qos=0)
        await asyncio.wait_for(done.wait(), 60)
        times.append(time.perf_counter() - t0)
    await pub.disconnect()
    await sub.disconnect()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    dim, mb = args.params, 8 * args.params / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        conf = Path(tmp) / "m.conf"
        conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                        "max_packet_size 16777216\nset_tcp_nodelay true\n")  # fmt: skip
        proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stderr=subprocess.DEVNULL)
        address = BrokerAddress.parse(f"127.0.0.1:{port}")
        while not accepts(address, 0.1):
            time.sleep(0.05)
        try:
            print(f"model: {dim:,} float64 parameters ({mb:.1f} MB), median of {args.repeats}")
            print("chunk bytes  chunks  seal ms  take ms  codec MB/s  mosquitto ms  MB/s")
            for size in SIZES:
                seal, take = codec(dim, size, args.repeats)
                chunks.CHUNK_BYTES, chunks.MAX_PEER_BYTES = size, size + 4096
                aead = ChaCha20Poly1305(bytes(32))
                w = np.random.default_rng(0).standard_normal(dim)
                frames = chunks.seal_chunks(Model(1, 2, 1, 1, w, 0), aead, "run")
                trip = asyncio.run(round_trip(address, frames, args.repeats))
                print(
                    f"{size:11,}  {len(frames):6}  {seal * 1e3:7.1f}  {take * 1e3:7.1f}  "
                    f"{mb / (seal + take):10.0f}  {trip * 1e3:12.1f}  {mb / trip:4.0f}"
                )
        finally:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
