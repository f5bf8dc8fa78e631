// Stand-ins for the few SwiftUI names the doc snippets use, so they compile on Linux, where
// SwiftUI does not exist (Scripts/doc-snippets.py). Not generated. On Apple platforms the real
// SwiftUI is used instead. They check the snippets' Swift and every PeerSync call; what SwiftUI
// itself does with them is checked only on an Apple platform (docs/APPLE.md).
#if !canImport(SwiftUI)
@MainActor protocol View {
    associatedtype Body: View
    @ViewBuilder var body: Body { get }
}

extension Never: View {
    var body: Never { fatalError("a stand-in") }
}

@resultBuilder enum ViewBuilder {
    static func buildBlock<Content: View>(_ content: Content) -> Content { content }
}

struct Text: View {
    init(_ text: String) {}
    var body: Never { fatalError("a stand-in") }
}

struct List<RowContent: View>: View {
    init<Data: RandomAccessCollection, ID: Hashable>(_ data: Data, id: KeyPath<Data.Element, ID>,
                                                     @ViewBuilder rowContent: @escaping (Data.Element) -> RowContent) {}
    var body: Never { fatalError("a stand-in") }
}

struct ModifiedView<Content: View>: View {
    var body: Never { fatalError("a stand-in") }
}

extension View {
    func task(_ action: @escaping @MainActor () async -> Void) -> ModifiedView<Self> { ModifiedView() }
}

@MainActor @propertyWrapper struct State<Value> {
    private final class Storage {
        var value: Value
        init(_ value: Value) { self.value = value }
    }
    private let storage: Storage
    init(wrappedValue: Value) { storage = Storage(wrappedValue) }
    var wrappedValue: Value {
        get { storage.value }
        nonmutating set { storage.value = newValue }
    }
}

@MainActor protocol PreviewProvider {
    associatedtype Previews: View
    @ViewBuilder static var previews: Previews { get }
}
#endif
