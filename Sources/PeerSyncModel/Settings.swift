@_spi(Engine) import PeerSyncCRDT

/// Where a setting lives.
public enum SettingScope: String, Sendable, CaseIterable, Codable {
    /// Synced to every replica of the group (last writer wins per key).
    case synced
    /// Kept on this device only; never leaves it (window sizes, power mode).
    case local
}

/// Names of well-known settings. Apps may use any other key as well.
public enum SettingKey {
    /// Synced: how many days of history to keep (an integer).
    public static let retentionDays = "retentionDays"
    /// Synced: first day of the week, 1 = Monday … 7 = Sunday.
    public static let weekStart = "weekStart"
    /// Local: "normal" or "low" power mode for sync.
    public static let powerMode = "powerMode"
}

extension RecordKey {
    /// Synced settings are the fields of one reserved record.
    public static let syncedSettings = RecordKey(collection: "settings", id: UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)))
}
