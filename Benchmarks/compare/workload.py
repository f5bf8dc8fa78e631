"""The shapes of PeerSync's W2 and W3 workloads (Benchmarks/PeerSyncBenchmarks), for other CRDTs.

Records are 6-field shift types: id (the map key), symbol 1-3 letters, title 12 characters,
duration integer, description ~42 characters, locationID (a UUID string here: the libraries
have no UUID type). Seeded, so every library sees the same operations.
"""
import random
import time
import uuid

LETTERS = "ABCDEFGHJKLMNPRSTUVWXYZ"


def record(i, rng):
    symbol = "".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 3)))
    title = ("Shift " + base36(i).upper()).ljust(12, "x")[:12]
    return {
        "symbol": symbol,
        "title": title,
        "duration": rng.choice([21600, 28800, 36000, 43200]),
        "description": f"Covers ward {i % 40} with handover at the start.",
        "locationID": str(uuid.UUID(int=rng.getrandbits(128))),
    }


def base36(n):
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def keys(n, rng):
    return [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(n)]


def partition_ops(replica_index, record_keys, records, updates, deletes, inserts):
    """W3: the operations replica `replica_index` makes while partitioned, in order:
    ('delete', key) ×deletes, ('update', key, field, value) ×updates, ('insert', key, fields) ×inserts."""
    rng = random.Random(300 + replica_index)
    shuffled = list(record_keys)
    rng.shuffle(shuffled)
    ops = []
    for _ in range(deletes):
        ops.append(("delete", shuffled.pop()))
    for i in range(updates):
        key = shuffled[i % len(shuffled)]
        field = ["title", "symbol", "duration", "description"][i % 4]
        value = replica_index * 100_000 + i if field == "duration" else f"{field} {replica_index}-{i}"
        ops.append(("update", key, field, value))
    for i in range(inserts):
        ops.append(("insert", str(uuid.UUID(int=rng.getrandbits(128))), record(records + i, rng)))
    return ops


def median_ms(rounds, body):
    """Median wall-clock ms of `rounds` runs of body() after one warm-up; body may return a
    value that is checked to be truthy (convergence)."""
    assert body()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        ok = body()
        samples.append((time.perf_counter() - start) * 1000)
        assert ok
    samples.sort()
    return samples[len(samples) // 2]
