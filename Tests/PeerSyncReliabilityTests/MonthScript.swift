import PeerSyncTestSupport

/// A group's month, generated from a seed (issue 29): five devices, day by day — who is online,
/// who edits what (online or offline), races, SIGKILLs, compaction, a late join, one removal,
/// backups and two restores (a member and the admin, one as a copy and one in place), and the
/// model of what every device must hold (`model`, the oracle). Pure: the runner in
/// `MonthTests.swift` carries the actions out with `peersync` processes.
///
/// The generator keeps every expected outcome decidable: a record is deleted only by a device
/// that holds every edit of it, and nobody edits it afterwards (so no edit is concurrent with a
/// delete, except once, on purpose: `revive`); every value written is new, so each `set` writes;
/// the removal happens with every device online and converged, so the removed device's knowledge
/// is exact; and the removed device is kept offline while a device restored from a backup older
/// than the removal has not met the group yet (until then that device cannot know of the removal,
/// and nothing can stop it from talking to the removed one).
struct MonthScript: Sendable {
    static let devices = 5
    static let admins: Set<Int> = [0, 1]
    /// Joins on day 2, after the admin's backup (so the restored admin has never admitted it).
    static let lateJoiner = 4

    enum Action: Sendable, Equatable {
        /// `peersync init` (the group's first admin).
        case create(Int)
        /// `peersync invite` on `admin`'s store, for device `for`.
        case invite(admin: Int, role: String, for: Int)
        /// `peersync init --join` with that code.
        case join(Int)
        /// Start (or stop, SIGTERM) the device's `peersync run`.
        case start(Int), stop(Int)
        /// The model's operation with this index, as a one-shot CLI command on the device's store.
        case op(Int)
        /// SIGKILL the device's node after a delay, then start it again.
        case kill(Int, afterMilliseconds: Int)
        /// `peersync compact`.
        case compact(Int)
        /// `cp -a` of a stopped device's store.
        case backup(Int)
        /// The backup put back while the device is stopped, as a fresh copy or written over the files in place.
        case restore(Int, inPlace: Bool, number: Int)
        /// `peersync devices remove` on `admin`'s store; then wait until every member refuses the device.
        case remove(admin: Int, device: Int)
        /// Wait until these devices' digests are equal.
        case converge([Int])
        /// Wait until these devices have purged every deleted record.
        case awaitPurge([Int])
    }

    struct Day: Sendable {
        var number: Int
        var actions: [Action] = []
    }

    struct Restore: Sendable {
        var device: Int, day: Int, backupDay: Int, inPlace: Bool, number: Int
    }

    let seed: UInt64
    private(set) var days: [Day] = []
    private(set) var model = MonthModel(devices: MonthScript.devices)
    private(set) var restores: [Restore] = []
    private(set) var removed = 0
    private(set) var removalDay = 0
    /// The knowledge of the removed device when it was removed (it must never learn more).
    var removedKnowledge: Set<Int> { model.knowledge[removed] }
    /// Every device but the removed one.
    var active: [Int] { (0..<Self.devices).filter { $0 != removed } }
    /// What the active devices hold at the end, once converged.
    var finalKnowledge: Set<Int> { active.reduce(into: Set<Int>()) { $0.formUnion(model.knowledge[$1]) } }

    // Generation state.
    private var rng: SeededGenerator
    private var online: Set<Int> = []
    private var joined: Set<Int> = []
    private var backups: [Int: (day: Int, known: Set<Int>)] = [:]
    /// Restored from a backup older than the removal, and not converged with the group since.
    private var unaware: Set<Int> = []
    /// Records kept for the deliberate edit-concurrent-with-delete.
    private var reserved: Set<Int> = []
    private var current = Day(number: 0)

    /// A month of `dayCount` days (at least 10) after a setup day.
    static func generate(seed: UInt64, days dayCount: Int = 10) -> MonthScript {
        var script = MonthScript(seed: seed, rng: SeededGenerator(seed: seed))
        script.build(dayCount: max(dayCount, 10))
        return script
    }

    private init(seed: UInt64, rng: SeededGenerator) {
        self.seed = seed
        self.rng = rng
    }

    // MARK: The calendar

    private mutating func build(dayCount: Int) {
        let lastDay = dayCount
        let member = [2, 3].randomElement(using: &rng)!
        let memberBackupDay = Int.random(in: 3...4, using: &rng)
        let purgeDay = 5
        // The removal, the member's restore and the admin's restore on three distinct days of
        // 6…final-2, the removal before at least one restore (a backup older than a removal).
        var slots = Array(6...(lastDay - 2)).shuffled(using: &rng).prefix(3).sorted()
        let removalSlot = Int.random(in: 0...1, using: &rng)
        removalDay = slots.remove(at: removalSlot)
        slots.shuffle(using: &rng)
        let (memberRestoreDay, adminRestoreDay) = (slots[0], slots[1])
        let memberInPlace = Bool.random(using: &rng)
        removed = [2, 3, 4].filter { $0 != member }.randomElement(using: &rng)!

        setUp()
        for number in 1...lastDay {
            current = Day(number: number)
            switch number {
            case 2: lateJoinDay()
            case memberBackupDay: ordinaryDay(offlineAtStart: [member], backup: member, revive: number == 3)
            case purgeDay: purgeDayActions()
            case removalDay: removalDayActions()
            case memberRestoreDay: restoreDay(member, inPlace: memberInPlace)
            case adminRestoreDay: restoreDay(0, inPlace: !memberInPlace)
            case lastDay: finalDay()
            default: ordinaryDay(revive: number == 3)
            }
            days.append(current)
        }
    }

    /// Day 0: d0 creates the group, invites d1 as an admin and d2, d3 as members; a few records,
    /// among them the location and shift type kept for the revive case; everyone converges.
    private mutating func setUp() {
        current = Day(number: 0)
        emit(.create(0))
        for device in 1...3 {
            emit(.invite(admin: 0, role: device == 1 ? "admin" : "member", for: device))
            emit(.join(device))
        }
        joined = [0, 1, 2, 3]
        goOnline([0, 1, 2, 3])
        converge([0, 1, 2, 3])  // the joins complete
        let location = addLocation(by: 0)
        reserved = [location, addShift(by: 0, location: location)]
        for _ in 0..<3 { addLocation(by: Int.random(in: 0...3, using: &rng)) }
        for _ in 0..<4 { addShift(by: Int.random(in: 0...3, using: &rng)) }
        endOfDay()
        days.append(current)
    }

    private mutating func ordinaryDay(offlineAtStart: Set<Int> = [], backup: Int? = nil, revive: Bool = false) {
        var want = Set(activeJoined.filter { _ in rng.chance(0.6) }).subtracting(offlineAtStart)
        while want.count < 2 { want.insert(activeJoined.filter { !offlineAtStart.contains($0) }.randomElement(using: &rng)!) }
        if revive, want.count == activeJoined.count { want.remove(want.filter { $0 != 0 }.randomElement(using: &rng)!) }
        setOnline(want)
        if let backup { takeBackup(backup) }
        if revive { reviveCase() }
        randomWork()
        if let backup, rng.chance(0.5) { goOnline([backup]) }
        endOfDay()
    }

    /// Day 2: the admin's backup (taken before it admits d4), then d4 joins with its invite.
    private mutating func lateJoinDay() {
        var want = Set(activeJoined.filter { _ in rng.chance(0.6) })
        want.remove(0)
        setOnline(want)
        emit(.invite(admin: 0, role: "member", for: Self.lateJoiner))
        takeBackup(0)
        goOnline([0])
        emit(.join(Self.lateJoiner))
        joined.insert(Self.lateJoiner)
        goOnline([Self.lateJoiner])
        randomWork()
        endOfDay()
    }

    /// Everyone online; deletes of records both backups hold; then a purge everywhere.
    private mutating func purgeDayActions() {
        setOnline(Set(activeJoined))
        let inBackups = model.records.indices.filter { r in
            !reserved.contains(r) && !model.isDoomed(r) && backups.values.allSatisfy { model.isVisible(r, in: $0.known) }
        }
        for record in inBackups.shuffled(using: &rng).prefix(3) {
            if let device = activeJoined.shuffled(using: &rng).first(where: { model.isVisible(record, to: $0) && model.knowsAll(of: record, device: $0) }) {
                emit(.op(model.delete(record, by: device, day: current.number)))
            }
        }
        randomWork()
        endOfDay()
        emit(.compact(activeJoined.randomElement(using: &rng)!))
        emit(.awaitPurge(activeJoined))
    }

    /// Everyone online and converged; an admin removes a member, which goes on running and writing.
    private mutating func removalDayActions() {
        setOnline(Set(activeJoined))
        converge(activeJoined)
        let admin = Self.admins.filter { online.contains($0) }.sorted().randomElement(using: &rng)!
        emit(.remove(admin: admin, device: removed))
        removedSince = true
        randomWork()
        endOfDay()
    }

    private var removedSince = false

    private mutating func restoreDay(_ device: Int, inPlace: Bool) {
        var want = Set(activeJoined.filter { _ in rng.chance(0.6) })
        want.remove(device)
        if want.count < 2 { want.formUnion(activeJoined.filter { $0 != device }.shuffled(using: &rng).prefix(2)) }
        let number = restores.count + 1
        let backup = backups[device]!
        let olderThanRemoval = removedSince && backup.day < removalDay
        setOnline(want, removedOff: olderThanRemoval)
        if olderThanRemoval { unaware.insert(device) }
        emit(.restore(device, inPlace: inPlace, number: number))
        model.restore(device, to: backup.known)
        restores.append(Restore(device: device, day: current.number, backupDay: backup.day, inPlace: inPlace, number: number))
        // Writes right after the restore, before it meets anyone.
        for _ in 0..<Int.random(in: 2...3, using: &rng) { randomOp(by: device, note: .afterRestore(number)) }
        randomWork(excluding: [device])
        if rng.chance(0.75) { goOnline([device]) }
        endOfDay()
    }

    private mutating func finalDay() {
        setOnline(Set(activeJoined))
        randomWork()
        endOfDay()
    }

    // MARK: Pieces of a day

    private var activeJoined: [Int] { joined.filter { !removedSince || $0 != removed }.sorted() }

    private mutating func emit(_ action: Action) { current.actions.append(action) }

    private mutating func goOnline(_ devices: [Int]) {
        for device in devices.sorted() where !online.contains(device) {
            online.insert(device)
            emit(.start(device))
        }
    }

    /// Stops and starts nodes so that exactly `want` run, plus every restored device that has not
    /// met the group yet; and the removed device, unless one of those may not know of its removal
    /// (`removedOff`).
    private mutating func setOnline(_ want: Set<Int>, removedOff: Bool = false) {
        var want = want.union(unaware)
        if removedSince {
            if unaware.isEmpty && !removedOff { want.insert(removed) } else { want.remove(removed) }
        }
        for device in online.subtracting(want).sorted() {
            online.remove(device)
            emit(.stop(device))
        }
        goOnline(Array(want))
    }

    private mutating func converge(_ devices: [Int]) {
        let set = devices.filter(online.contains)
        emit(.converge(set))
        model.sync(set)
        unaware.subtract(set)
    }

    /// The day ends with every online device converged (but the removed one, which never meets anyone).
    private mutating func endOfDay() {
        converge(activeJoined.filter(online.contains))
        // A restored device still offline comes online tomorrow (the removed one stays off until then).
    }

    private mutating func takeBackup(_ device: Int) {
        precondition(!online.contains(device))
        emit(.backup(device))
        backups[device] = (current.number, model.knowledge[device])
    }

    /// The deliberate case: an online device deletes the reserved location while an offline one
    /// renames it; the deleting device then edits the shift type that refers to it. The location
    /// must come back whole (add-wins), and the shift type must still refer to it.
    private mutating func reviveCase() {
        let location = reserved.min()!, shift = reserved.max()!
        guard let deleter = activeJoined.first(where: { online.contains($0) && model.knowsAll(of: location, device: $0) }),
              let renamer = activeJoined.first(where: { !online.contains($0) && model.isVisible(location, to: $0) })
        else { return }
        emit(.op(model.delete(location, by: deleter, day: current.number, note: .revive)))
        emit(.op(model.set(location, by: renamer, day: current.number, fields: [.name: text("revived")], note: .revive)))
        emit(.op(model.set(shift, by: deleter, day: current.number, fields: [.title: text("t")], note: .revive)))
    }

    /// 4–8 edits by random devices (online or offline), maybe a race, a SIGKILL, a compaction,
    /// and, after the removal, writes by the removed device.
    private mutating func randomWork(excluding: Set<Int> = []) {
        let writers = activeJoined.filter { !excluding.contains($0) && !unaware.contains($0) }
        for _ in 0..<Int.random(in: 4...8, using: &rng) {
            // Online devices write more often (the node ships each commit at once).
            let running = writers.filter { online.contains($0) }
            let pool = rng.chance(0.7) && !running.isEmpty ? running : writers
            randomOp(by: pool.randomElement(using: &rng)!)
        }
        if rng.chance(0.5) { race(among: writers) }
        if removedSince, online.contains(removed), rng.chance(0.7) {
            for _ in 0..<Int.random(in: 1...2, using: &rng) { randomOp(by: removed, note: .afterRemoval) }
        }
        if rng.chance(0.35) { emit(.compact(writers.randomElement(using: &rng)!)) }
        if rng.chance(0.6), let victim = online.sorted().randomElement(using: &rng) {
            // Between two of today's actions once it runs, or right after the last (a commit being shipped).
            let after = current.actions.lastIndex(of: .start(victim)).map { $0 + 1 } ?? 0
            let at = Int.random(in: after...current.actions.count, using: &rng)
            current.actions.insert(.kill(victim, afterMilliseconds: Int.random(in: 0...400, using: &rng)), at: at)
        }
    }

    /// Two devices write the same field of a record both see, one of them offline when possible.
    private mutating func race(among writers: [Int]) {
        let offline = writers.filter { !online.contains($0) }
        guard let first = (offline.isEmpty ? writers : offline).randomElement(using: &rng) else { return }
        let candidates = editable(by: first).filter { r in writers.contains { $0 != first && model.isVisible(r, to: $0) } }
        guard let record = candidates.randomElement(using: &rng),
              let second = writers.filter({ $0 != first && model.isVisible(record, to: $0) }).randomElement(using: &rng)
        else { return }
        let field: MonthModel.Field = model.records[record].kind == .location ? [.name, .address].randomElement(using: &rng)!
                                                                              : [.title, .description].randomElement(using: &rng)!
        for device in [first, second] {
            emit(.op(model.set(record, by: device, day: current.number, fields: [field: text(field.rawValue.prefix(1) + "race")], note: .race)))
        }
    }

    private func editable(by device: Int) -> [Int] {
        model.records.indices.filter { r in
            !reserved.contains(r) && model.isVisible(r, to: device) && (device == removed && removedSince || !model.isDoomed(r))
        }
    }

    private mutating func randomOp(by device: Int, note: MonthModel.Note = .plain) {
        let roll = Double.random(in: 0..<1, using: &rng)
        if roll < 0.12 { addLocation(by: device, note: note); return }
        if roll < 0.25 { addShift(by: device, note: note); return }
        let records = editable(by: device)
        if roll < 0.42, note != .afterRemoval,
           let record = records.filter({ model.knowsAll(of: $0, device: device) }).randomElement(using: &rng) {
            return emit(.op(model.delete(record, by: device, day: current.number, note: note)))
        }
        guard let record = records.randomElement(using: &rng) else { addLocation(by: device, note: note); return }
        var fields: [MonthModel.Field: MonthModel.Value] = [:]
        let n = model.ops.count
        if model.records[record].kind == .location {
            if rng.chance(0.7) { fields[.name] = text("n") }
            if fields.isEmpty || rng.chance(0.4) { fields[.address] = text("a\(n) street") }
        } else {
            if rng.chance(0.5) { fields[.title] = text("t") }
            if rng.chance(0.3) { fields[.description] = text("d") }
            if rng.chance(0.3) { fields[.duration] = .seconds(3_600 + (n % 600) * 60) }
            if rng.chance(0.3), let reference = newReference(for: record, by: device) { fields[.locationID] = reference }
            if fields.isEmpty { fields[.title] = text("t") }
        }
        emit(.op(model.set(record, by: device, day: current.number, fields: fields, note: note)))
    }

    /// Locations a shift type of `device` may point at: ones it sees and nobody deleted (a device
    /// online today may already have the delete the model does not count it as holding yet).
    private func referable(by device: Int) -> (Int) -> Bool {
        { [model, reserved] r in
            model.records[r].kind == .location && !reserved.contains(r) && !model.isDoomed(r) && model.isVisible(r, to: device)
        }
    }

    /// A location reference that differs from every value the device may hold (so `set` writes it).
    private mutating func newReference(for shift: Int, by device: Int) -> MonthModel.Value? {
        let held = model.candidates(shift, .locationID, in: model.knowledge[device])
        var options: [MonthModel.Value] = model.records.indices
            .filter(referable(by: device))
            .map { .reference($0) }
        options.append(.reference(nil))
        return options.filter { !held.contains($0) }.randomElement(using: &rng)
    }

    /// A value no operation wrote before (the next operation's number in it).
    private func text(_ prefix: some StringProtocol) -> MonthModel.Value { .text("\(prefix)\(model.ops.count)") }

    /// A new location, as an operation of today; returns its record number.
    @discardableResult
    private mutating func addLocation(by device: Int, note: MonthModel.Note = .plain) -> Int {
        let record = model.add(.location, by: device, day: current.number,
                               fields: [.name: text("n"), .address: rng.chance(0.3) ? .text("") : text("a")], note: note)
        emit(.op(model.ops.count - 1))
        return record
    }

    /// A new shift type (with a location the device sees, sometimes), as an operation of today.
    @discardableResult
    private mutating func addShift(by device: Int, location: Int? = nil, note: MonthModel.Note = .plain) -> Int {
        let n = model.ops.count
        var place = location
        if place == nil, rng.chance(0.6) {
            place = model.records.indices.filter(referable(by: device)).randomElement(using: &rng)
        }
        let record = model.add(.shiftType, by: device, day: current.number, fields: [
            .symbol: .text("S\(n % 100)"), .title: text("t"), .description: .text(""),
            .duration: .seconds(3_600 + (n % 600) * 60), .locationID: .reference(place),
        ], note: note)
        emit(.op(model.ops.count - 1))
        return record
    }
}

extension MonthScript {
    /// The month as text, one action a line (written beside the stores, for a failure's post-mortem).
    var transcript: String {
        var lines: [String] = ["seed \(seed); removed d\(removed) on day \(removalDay)"]
        for day in days {
            lines.append("day \(day.number)")
            for action in day.actions {
                guard case .op(let index) = action else {
                    lines.append("  \(action)")
                    continue
                }
                let op = model.ops[index]
                let fields = op.fields.sorted { $0.key < $1.key }.map { "\($0.key.rawValue)=\($0.value)" }.joined(separator: " ")
                lines.append("  op \(index): \(op.label) \(model.name(op.record)) \(fields)")
            }
        }
        return lines.joined(separator: "\n") + "\n"
    }
}
