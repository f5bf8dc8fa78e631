// Issue 13 workload on Automerge (@automerge/automerge): three devices create N records (a map
// of three fields each), merge, delete every record, merge; prints save() bytes of one replica
// after deleting everything, beside an empty document's. Run by Benchmarks/compare/run.sh.
import * as A from "@automerge/automerge"
const N = Number(process.argv[2] ?? 100000), DEVICES = 3
const t0 = performance.now()
const actor = (i) => String(i + 1).padStart(32, "0")
let docs = [A.from({ records: {} }, actor(0))]
for (let i = 1; i < DEVICES; i++) docs.push(A.clone(docs[0], actor(i)))
const empty = A.save(A.init()).length
for (let dev = 0; dev < DEVICES; dev++) {
  docs[dev] = A.change(docs[dev], (d) => {
    for (let i = dev; i < N; i += DEVICES)
      d.records[String(i).padStart(8, "0")] = { name: `shift ${i}`, start: 1700000000 + i, minutes: 480 }
  })
}
const sync = () => { for (let a = 0; a < DEVICES; a++) for (let b = 0; b < DEVICES; b++) if (a !== b) docs[b] = A.merge(docs[b], docs[a]) }
sync()
const created = A.save(docs[0]).length
for (let dev = 0; dev < DEVICES; dev++) {
  docs[dev] = A.change(docs[dev], (d) => { for (let i = dev; i < N; i += DEVICES) delete d.records[String(i).padStart(8, "0")] })
}
sync()
if (Object.keys(docs[0].records).length !== 0) throw new Error("not all deleted")
console.log(JSON.stringify({ system: "Automerge (@automerge/automerge 3.5.0, JS/wasm)", empty, created,
  deleted: A.save(docs[0]).length, seconds: Math.round((performance.now() - t0) / 100) / 10, records: N }))
