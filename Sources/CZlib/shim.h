// zlib's raw DEFLATE (RFC 1951), for catch-up chunks (docs/PROTOCOL.md §5.2). On Linux from
// Debian's zlib1g-dev; on Apple platforms the SDK's libz. zlib's init calls are macros Swift
// cannot import, so the two whole operations are small C functions here.
#ifndef PEERSYNC_CZLIB_SHIM_H
#define PEERSYNC_CZLIB_SHIM_H
#include <stddef.h>
#include <string.h>
#include <zlib.h>

/// A zeroed stream (zlib's default allocator) reading `length` bytes at `in` and writing up to
/// `capacity` at `out`. Both calls below take whole buffers, far below 4 GiB (chunks ≤ 4 MiB).
static inline void peersync_zstream(z_stream *s, const unsigned char *in, size_t length,
                                    unsigned char *out, size_t capacity) {
    memset(s, 0, sizeof *s);
    s->next_in = (Bytef *)in;
    s->avail_in = (uInt)length;
    s->next_out = out;
    s->avail_out = (uInt)capacity;
}

/// Compresses `in` into `out` (capacity `capacity`) as one raw DEFLATE stream at `level`.
/// Returns the compressed length, or 0 when it does not fit in `capacity` or zlib fails.
static inline size_t peersync_deflate_raw(const unsigned char *in, size_t length,
                                          unsigned char *out, size_t capacity, int level) {
    z_stream s;
    peersync_zstream(&s, in, length, out, capacity);
    if (deflateInit2(&s, level, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK) return 0;
    int code = deflate(&s, Z_FINISH);
    size_t written = (size_t)s.total_out;
    deflateEnd(&s);
    return code == Z_STREAM_END ? written : 0;
}

/// Inflates the raw DEFLATE stream `in` into exactly `expected` bytes at `out`.
/// Returns 0 on success; 1 if the stream is invalid or truncated; 2 if it has not ended after
/// `expected` bytes (it inflates to more); 3 if it ends before; 4 if bytes follow its end.
static inline int peersync_inflate_raw(const unsigned char *in, size_t length,
                                       unsigned char *out, size_t expected) {
    z_stream s;
    peersync_zstream(&s, in, length, out, expected);
    if (inflateInit2(&s, -15) != Z_OK) return 1;
    int code = inflate(&s, Z_FINISH);
    size_t produced = (size_t)s.total_out;
    uInt left = s.avail_in;
    inflateEnd(&s);
    if (code == Z_STREAM_END) {
        if (produced != expected) return 3;
        return left == 0 ? 0 : 4;
    }
    // Not at the end of the stream with the output full: it wants to write more than declared.
    return produced == expected ? 2 : 1;
}
#endif
