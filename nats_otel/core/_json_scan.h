/* The end of a JSON string, for the kernel's own parse (`_json.pxi`, `_string_end`).
 *
 * A trace message is mostly strings (a server's 56-character id, three timestamps, the
 * traceparent, names and subjects): finding each one's closing quote was ~4,500 instructions
 * a message, most of it a byte at a time once an eight-byte word held the quote. Here the
 * first byte that ends the plain run - a quote, a backslash or a control character - is found
 * by a mask and its lowest set bit: sixteen bytes at a time with SSE2 (every x86-64 has it),
 * eight at a time elsewhere (or built with -DNATS_OTEL_NO_SIMD), and a byte at a time only in
 * the last few bytes of the buffer.
 *
 * `at` is the index just after the opening quote. Returns the index of the closing quote, with
 * `*ascii` true when every byte before it is below 128; -1 when an escape or a control
 * character comes first (invalid JSON, or an escape: msgspec decides) or the buffer ends.
 * Never reads at or past `n`. */
#ifndef NATS_OTEL_JSON_SCAN_H
#define NATS_OTEL_JSON_SCAN_H

#include <stdint.h>
#include <string.h>
#include <Python.h>

#if defined(__SSE2__) && !defined(NATS_OTEL_NO_SIMD)
#include <emmintrin.h>
#endif

/* Non-zero in the high bit of each byte of `v` that is zero; exact for the lowest such byte
 * (a borrow only runs upwards), which is all the callers read. */
static inline uint64_t nats_otel_zero_bytes(uint64_t v) {
    return (v - 0x0101010101010101ULL) & ~v & 0x8080808080808080ULL;
}

static inline Py_ssize_t nats_otel_string_end(const unsigned char *s, Py_ssize_t at, Py_ssize_t n, int *ascii) {
    int plain = 1;
    unsigned char c;
#if defined(__SSE2__) && !defined(NATS_OTEL_NO_SIMD)
    const __m128i quote = _mm_set1_epi8('"');
    const __m128i backslash = _mm_set1_epi8('\\');
    const __m128i below_space = _mm_set1_epi8(0x1F);
    while (at + 16 <= n) {
        __m128i v = _mm_loadu_si128((const __m128i *)(s + at));
        /* a control character: v <= 0x1F unsigned, i.e. min(v, 0x1F) == v */
        __m128i stop = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                                    _mm_cmpeq_epi8(_mm_min_epu8(v, below_space), v));
        unsigned int stops = (unsigned int)_mm_movemask_epi8(stop);
        unsigned int high = (unsigned int)_mm_movemask_epi8(v); /* bytes >= 128 */
        if (stops) {
            unsigned int first = (unsigned int)__builtin_ctz(stops);
            if (high & ((1u << first) - 1u)) plain = 0;
            at += first;
            *ascii = plain;
            return s[at] == '"' ? at : -1;
        }
        if (high) plain = 0;
        at += 16;
    }
#endif
    while (at + 8 <= n) {
        uint64_t word, stops;
        memcpy(&word, s + at, 8);
        stops = nats_otel_zero_bytes(word ^ 0x2222222222222222ULL) | nats_otel_zero_bytes(word ^ 0x5C5C5C5C5C5C5C5CULL)
                | nats_otel_zero_bytes(word & 0xE0E0E0E0E0E0E0E0ULL);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (stops) {
            unsigned int first = (unsigned int)__builtin_ctzll(stops) / 8;
            if (first && (word & (0x8080808080808080ULL >> (8 * (8 - first))))) plain = 0;
            at += first;
            *ascii = plain;
            return s[at] == '"' ? at : -1;
        }
#else
        if (stops) break; /* the byte loop below finds which */
#endif
        if (word & 0x8080808080808080ULL) plain = 0;
        at += 8;
    }
    *ascii = plain;
    while (at < n) {
        c = s[at];
        if (c == '"') return at;
        if (c == '\\' || c < 32) return -1;
        if (c >= 128) *ascii = 0;
        at += 1;
    }
    return -1;
}

#endif
