"""W3 and W2 shapes on pycrdt (Yjs's Rust port, yrs). Prints one JSON object."""
import json
import random
import sys

from pycrdt import Doc, Map

import workload as w


def new_doc():
    doc = Doc()
    doc["shiftTypes"] = Map()
    return doc


def filled(records, seed):
    rng = random.Random(seed)
    doc = new_doc()
    root = doc["shiftTypes"]
    record_keys = w.keys(records, rng)
    with doc.transaction():
        for i, key in enumerate(record_keys):
            root[key] = Map(w.record(i, rng))
    return doc, record_keys


def copy_of(doc):
    other = new_doc()
    other.apply_update(doc.get_update())
    return other


def w3(records, updates, deletes, inserts, rounds):
    base, record_keys = filled(records, 31)
    replicas = [copy_of(base) for _ in range(3)]
    for index, doc in enumerate(replicas):
        root = doc["shiftTypes"]
        for op in w.partition_ops(index, record_keys, records, updates, deletes, inserts):
            with doc.transaction():  # one commit each, like PeerSync's store writes
                if op[0] == "delete":
                    del root[op[1]]
                elif op[0] == "update":
                    root[op[1]][op[2]] = op[3]
                else:
                    root[op[1]] = Map(op[2])
    originals = [doc.get_update() for doc in replicas]

    def run():
        # Each replica joins what the other two have that it lacks (state-vector diffs), into
        # copies of the partitioned replicas (copying is not timed; PeerSync copies its states too).
        merged = []
        for update in originals:
            doc = new_doc()
            doc.apply_update(update)
            merged.append(doc)
        t0 = w.time.perf_counter()
        for i, doc in enumerate(merged):
            for j, source in enumerate(replicas):
                if j != i:
                    doc.apply_update(source.get_update(doc.get_state()))
        elapsed = (w.time.perf_counter() - t0) * 1000
        states = [d["shiftTypes"].to_py() for d in merged]
        assert states[0] == states[1] == states[2]
        return elapsed

    samples = sorted(run() for _ in range(rounds))
    return samples[len(samples) // 2]


def w2(records, updates, rounds):
    a, record_keys = filled(records, 21)
    b_start = a.get_update()
    rng = random.Random(22)
    # Each transaction's own update, as Yjs apps stream them (y-websocket sends the doc's
    # `update` event). `get_update(state_before)` is not a delta here: a Yjs update built from a
    # state vector carries the document's whole delete set, and every overwrite adds to it (17 KB
    # per "update" by the end of 10,000, 18 s to apply: a measurement of the wrong thing).
    deltas = []
    root = a["shiftTypes"]
    subscription = a.observe(lambda event: deltas.append(event.update))
    for i in range(updates):
        key = rng.choice(record_keys)
        root[key]["duration"] = 1_000_000 + i
    a.unobserve(subscription)
    assert len(deltas) == updates

    def run():
        b = new_doc()
        b.apply_update(b_start)
        t0 = w.time.perf_counter()
        for delta in deltas:
            b.apply_update(delta)
        elapsed = (w.time.perf_counter() - t0) * 1000
        assert b["shiftTypes"].to_py() == a["shiftTypes"].to_py()
        return elapsed

    samples = sorted(run() for _ in range(rounds))
    return samples[len(samples) // 2], sum(len(d) for d in deltas) / len(deltas)


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    n = 200 if quick else 10_000
    ops = (40, 4, 4) if quick else (2_000, 200, 200)
    rounds = 1 if quick else 5
    w3_ms = w3(n, *ops, rounds)
    w2_ms, w2_bytes = w2(n, 200 if quick else 10_000, rounds)
    print(json.dumps({"library": "pycrdt", "w3_merge_ms": w3_ms, "w2_apply_ms": w2_ms, "w2_update_bytes": w2_bytes}))
