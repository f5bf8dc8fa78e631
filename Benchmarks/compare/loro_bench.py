"""W3 and W2 shapes on Loro. Prints one JSON object."""
import json
import random
import sys

from loro import ExportMode, LoroDoc, LoroMap

import workload as w


def filled(records, seed):
    rng = random.Random(seed)
    doc = LoroDoc()
    root = doc.get_map("shiftTypes")
    record_keys = w.keys(records, rng)
    for i, key in enumerate(record_keys):
        child = root.insert_container(key, LoroMap())
        for name, value in w.record(i, rng).items():
            child.insert(name, value)
    doc.commit()
    return doc, record_keys


def copy_of(doc):
    other = LoroDoc()
    other.import_(doc.export(ExportMode.Snapshot()))
    return other


def child(root, key):
    return root.get(key).container


def w3(records, updates, deletes, inserts, rounds):
    base, record_keys = filled(records, 31)
    replicas = [copy_of(base) for _ in range(3)]
    for index, doc in enumerate(replicas):
        root = doc.get_map("shiftTypes")
        for op in w.partition_ops(index, record_keys, records, updates, deletes, inserts):
            if op[0] == "delete":
                root.delete(op[1])
            elif op[0] == "update":
                child(root, op[1]).insert(op[2], op[3])
            else:
                created = root.insert_container(op[1], LoroMap())
                for name, value in op[2].items():
                    created.insert(name, value)
            doc.commit()  # one commit each, like PeerSync's store writes
    snapshots = [doc.export(ExportMode.Snapshot()) for doc in replicas]

    def run():
        merged = []
        for snapshot in snapshots:  # copies, not timed
            doc = LoroDoc()
            doc.import_(snapshot)
            merged.append(doc)
        t0 = w.time.perf_counter()
        for i, doc in enumerate(merged):
            for j, source in enumerate(replicas):
                if j != i:
                    doc.import_(source.export(ExportMode.Updates(doc.oplog_vv)))
        elapsed = (w.time.perf_counter() - t0) * 1000
        states = [d.get_deep_value() for d in merged]
        assert states[0] == states[1] == states[2]
        return elapsed

    samples = sorted(run() for _ in range(rounds))
    return samples[len(samples) // 2]


def w2(records, updates, rounds):
    a, record_keys = filled(records, 21)
    b_start = a.export(ExportMode.Snapshot())
    rng = random.Random(22)
    deltas = []
    root = a.get_map("shiftTypes")
    for i in range(updates):
        key = rng.choice(record_keys)
        before = a.oplog_vv
        child(root, key).insert("duration", 1_000_000 + i)
        a.commit()
        deltas.append(a.export(ExportMode.Updates(before)))

    def run():
        b = LoroDoc()
        b.import_(b_start)
        t0 = w.time.perf_counter()
        for delta in deltas:
            b.import_(delta)
        elapsed = (w.time.perf_counter() - t0) * 1000
        assert b.get_deep_value() == a.get_deep_value()
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
    print(json.dumps({"library": "loro", "w3_merge_ms": w3_ms, "w2_apply_ms": w2_ms, "w2_update_bytes": w2_bytes}))
