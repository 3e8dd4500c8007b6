"""A 200 MiB result streamed with ``stream_result`` in bounded memory."""

from __future__ import annotations

import hashlib
import resource
import sys


from flint_client import Client, Resources

from .conftest import Guests

MIB = 1 << 20
SIZE = 200 * MIB


def peak_rss() -> int:
    """This process's peak resident set, in bytes (VmHWM)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def reset_peak() -> None:
    """Resets VmHWM to the current resident set where Linux allows it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def test_a_200_mib_result_streams_in_bounded_memory(client: Client, guests: Guests) -> None:
    job = client.submit(
        guests.testkit,
        [""],
        args=["print", str(SIZE)],
        resources=Resources(max_output_bytes=256 * MIB, timeout_ms=600_000),
    )
    job.wait(900, raise_on_failure=True)
    (task,) = list(job.tasks())
    assert task.result is not None and task.result.size == SIZE
    expected = hashlib.sha256()
    block = b"x" * MIB
    for _ in range(SIZE // MIB):
        expected.update(block)
    del block

    reset_peak()
    before = peak_rss()
    digest, received, chunks = hashlib.sha256(), 0, 0
    for chunk in job.stream_result(0):
        digest.update(chunk)
        received += len(chunk)
        chunks += 1
    growth = peak_rss() - before

    assert received == SIZE
    assert digest.hexdigest() == expected.hexdigest() == task.result.sha256
    assert chunks > 1
    assert growth < 64 * MIB, f"peak RSS grew by {growth / MIB:.1f} MiB while streaming"
