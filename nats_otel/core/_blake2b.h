/* BLAKE2b (RFC 7693) with a digest length and no key: what hashlib.blake2b(data,
 * digest_size=n) computes, for the compiled span-id hashing (_ids.pyx). Written from the
 * RFC's description; tests/core/test_twins.py checks it against hashlib. */
#ifndef NATS_OTEL_BLAKE2B_H
#define NATS_OTEL_BLAKE2B_H

#include <stdint.h>
#include <string.h>

static const uint64_t nats_otel_b2_iv[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};

static const uint8_t nats_otel_b2_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

static inline uint64_t nats_otel_b2_rotr(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

static inline uint64_t nats_otel_b2_load(const uint8_t *p) {
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--) x = (x << 8) | p[i];
    return x;
}

#define NATS_OTEL_B2_G(a, b, c, d, x, y)               \
    do {                                               \
        v[a] = v[a] + v[b] + (x);                      \
        v[d] = nats_otel_b2_rotr(v[d] ^ v[a], 32);     \
        v[c] = v[c] + v[d];                            \
        v[b] = nats_otel_b2_rotr(v[b] ^ v[c], 24);     \
        v[a] = v[a] + v[b] + (y);                      \
        v[d] = nats_otel_b2_rotr(v[d] ^ v[a], 16);     \
        v[c] = v[c] + v[d];                            \
        v[b] = nats_otel_b2_rotr(v[b] ^ v[c], 63);     \
    } while (0)

static void nats_otel_b2_compress(uint64_t h[8], const uint8_t block[128], uint64_t t, int last) {
    uint64_t v[16], m[16];
    for (int i = 0; i < 16; i++) m[i] = nats_otel_b2_load(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = nats_otel_b2_iv[i];
    }
    v[12] ^= t; /* inputs here are far below 2**64 bytes: the high word of t stays 0 */
    if (last) v[14] = ~v[14];
    for (int r = 0; r < 12; r++) {
        const uint8_t *s = nats_otel_b2_sigma[r];
        NATS_OTEL_B2_G(0, 4, 8, 12, m[s[0]], m[s[1]]);
        NATS_OTEL_B2_G(1, 5, 9, 13, m[s[2]], m[s[3]]);
        NATS_OTEL_B2_G(2, 6, 10, 14, m[s[4]], m[s[5]]);
        NATS_OTEL_B2_G(3, 7, 11, 15, m[s[6]], m[s[7]]);
        NATS_OTEL_B2_G(0, 5, 10, 15, m[s[8]], m[s[9]]);
        NATS_OTEL_B2_G(1, 6, 11, 12, m[s[10]], m[s[11]]);
        NATS_OTEL_B2_G(2, 7, 8, 13, m[s[12]], m[s[13]]);
        NATS_OTEL_B2_G(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
}

/* The BLAKE2b digest (outlen 1..64 bytes) of the concatenation of up to 4 parts. */
static void nats_otel_blake2b(uint8_t *out, size_t outlen, const uint8_t *parts[], const size_t sizes[], int count) {
    uint64_t h[8];
    uint8_t block[128];
    size_t filled = 0;
    uint64_t t = 0;
    for (int i = 0; i < 8; i++) h[i] = nats_otel_b2_iv[i];
    h[0] ^= 0x01010000ULL ^ (uint64_t)outlen;
    for (int p = 0; p < count; p++) {
        const uint8_t *data = parts[p];
        size_t size = sizes[p];
        while (size > 0) {
            if (filled == 128) { /* a full block with more input after it: not the last */
                t += 128;
                nats_otel_b2_compress(h, block, t, 0);
                filled = 0;
            }
            size_t take = 128 - filled < size ? 128 - filled : size;
            memcpy(block + filled, data, take);
            filled += take;
            data += take;
            size -= take;
        }
    }
    t += filled;
    memset(block + filled, 0, 128 - filled);
    nats_otel_b2_compress(h, block, t, 1);
    for (size_t i = 0; i < outlen; i++) out[i] = (uint8_t)(h[i / 8] >> (8 * (i % 8)));
}

#endif
