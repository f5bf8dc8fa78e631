/// A value that a test needed was nil.
public struct MissingValue: Error, CustomStringConvertible {
    public let description: String
    public init(description: String) { self.description = description }
}

/// Unwraps `value` or throws, naming the place. Unlike `#require`, it takes expressions
/// that mutate (e.g. `try must(replica.save(record))`).
public func must<T>(_ value: T?, fileID: String = #fileID, line: Int = #line) throws -> T {
    guard let value else { throw MissingValue(description: "unexpected nil at \(fileID):\(line)") }
    return value
}
